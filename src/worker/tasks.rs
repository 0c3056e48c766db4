//! Tasks as the event loop sees them: a slab of records, each tied to the
//! request that pushed it. Event-loop thread only.
//!
//! A record outlives whatever may vanish under it: if the request ends or
//! the caller stops waiting (timeout), the record is only marked, and the
//! completion that arrives later frees it; a caller whose light thread was
//! killed is found gone by that completion (no one waits on its semaphore). The
//! semaphore a caller waits on belongs to the record, never to the Lua GC.

use super::{with_worker, WorkerError};
use crate::handoff::job::{Job, PoolId, PushId, Work};
use crate::handoff::payload::KEEP;
use crate::handoff::payload::{Args, Payload};
use crate::handoff::stream::{Taken, Written};
use crate::ngx::log;
use crate::ngx::lua::Sema;
use crate::stats::PoolStats;
use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;
use std::time::Duration;

const NONE: u32 = u32::MAX;
/// Generations stay below 2^20 so a handle is exact as a Lua number.
const GEN_MASK: u32 = (1 << 20) - 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Free,
    /// Queued or running in a pool thread; its caller may wait.
    Running,
    /// The result is here; the caller's semaphore was posted.
    Done,
    /// Queued or running, but nobody will take the result: free it on
    /// completion.
    Abandoned,
}

struct Slot {
    gen: u32,
    state: State,
    /// Kept across reuse, and for the worker's life: a post its waiter
    /// never consumed is taken back when the record is reused, since
    /// freeing a semaphore would leave such a post's event queued.
    sema: Option<Sema>,
    /// The push's tasks: shared with the pool threads while Running (to
    /// cancel them), their results once Done.
    work: Option<Job>,
    /// The key under which the caller's strings that the arguments borrow
    /// are anchored (0: none); they stay until the caller takes the result
    /// or hears the key reaped.
    anchor: u64,
    /// The pool the task was pushed to (an index in Tasks::stats).
    pool: u32,
    /// The request's task list this record is on (NONE when on none).
    owner: *mut RequestTasks,
    /// The coroutine that pushed and waits (Caller::co), only compared.
    waiter: *const c_void,
    /// A stream's record (push_stream): read chunk by chunk by its
    /// coroutine, found by its id, never its coroutine's newest.
    stream: bool,
    prev: u32,
    next: u32,
}

/// Who pushes and waits: the request's task list and the coroutine (its
/// lua_State), whose newest record is the one it waits on.
#[derive(Clone, Copy)]
pub struct Caller {
    pub tasks: *mut RequestTasks,
    pub co: *const c_void,
}

/// The tasks of one request, allocated in the request's pool; dropping it
/// (when the pool is destroyed) lets go of every task still on it.
pub struct RequestTasks {
    head: u32,
}

impl Default for RequestTasks {
    fn default() -> RequestTasks {
        RequestTasks { head: NONE }
    }
}

impl Drop for RequestTasks {
    fn drop(&mut self) {
        let me: *mut RequestTasks = self;
        with_worker(|w| {
            // SAFETY: self is alive for the duration of drop.
            drop(unsafe { w.tasks.release_request(me) });
        });
    }
}

#[derive(Default)]
pub struct Tasks {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Payload buffers kept for reuse: arguments are encoded in them and
    /// results written in them (handoff/job.rs), so steady state allocates none.
    spare: Vec<Vec<u8>>,
    /// Pushes that came back, and their lists of argument parts and of
    /// results, kept for reuse in the same way (buffers go to `spare`).
    spare_works: Vec<Job>,
    spare_args: Vec<Args>,
    spare_lists: Vec<Vec<Payload>>,
    /// By pool: whether the last push of it that came back had a result
    /// too large to keep. Its pushes then take no spares for their
    /// results: a pool thread that grows one reallocates it in the event
    /// loop's malloc arena, under that arena's lock (a Rust pool at
    /// 64 KiB, C = 64: 0.76-0.93x the tasks/s in three runs).
    pub large_results: Vec<bool>,
    /// Anchor keys of tasks that ended without their caller taking the
    /// result: the caller's strings they borrowed may now be let go of.
    reaped: Vec<u64>,
    /// Each pool's counters, by pool index.
    pub stats: Vec<&'static PoolStats>,
    /// By coroutine (Caller::co): its newest record, until that is freed.
    /// A coroutine waits on one record at a time: an older one is either
    /// running for a caller that stopped waiting (its completion frees
    /// it) or finished with results it never took (its next push frees
    /// it).
    newest: HashMap<usize, PushId, BuildHasherDefault<AddressHasher>>,
}

/// Hashes a coroutine's address: one multiplication, whose high bits
/// depend on every bit of the address.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0.rotate_left(32)
    }
}

/// What a read of a stream finds (Tasks::read_stream).
pub enum Read {
    Chunk(Payload),
    /// Every chunk was read and the handler returned: take its results.
    Done,
    /// Nothing yet: wait on the record's semaphore.
    Wait,
    /// No such stream (closed, or not the caller's).
    Gone,
}

/// Why a caller lets go of a task.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// It stopped waiting: push_task's timeout.
    Timeout,
    /// Its request went away.
    RequestGone,
    /// It never waited (the wait failed right after the push).
    NotWaiting,
    /// It closed its stream before the end.
    Closed,
}

/// How many of each kind of spare are kept.
const SPARES: usize = 256;

/// Whether a buffer is small enough to keep as a spare.
fn kept_size(buf: &Vec<u8>) -> bool {
    buf.capacity() <= KEEP
}

fn split(id: PushId) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

fn join(gen: u32, index: u32) -> PushId {
    (u64::from(gen) << 32) | u64::from(index)
}

impl Tasks {
    /// A buffer for a new task's payload.
    pub fn buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Arguments for a new push to be encoded in.
    pub fn args(&mut self) -> Args {
        let mut args = self.spare_args.pop().unwrap_or_default();
        args.bytes = self.buffer();
        args
    }

    /// The push of the tasks of `args` for record `task` and pool `pool`,
    /// with its deadline from now, its results written in spares (see
    /// `result_buffer`).
    pub fn work(
        &mut self,
        task: PushId,
        pool: PoolId,
        args: Args,
        deadline: Option<Duration>,
    ) -> Job {
        let (spare, list) = (self.spare_works.pop(), self.spare_lists.pop());
        let results = list.unwrap_or_default();
        Work::new(spare, task, pool, args, results, deadline, || {
            self.result_buffer(pool)
        })
    }

    /// A buffer for a result of pool `pool` to be written in: a spare,
    /// unless the pool's results outgrow them.
    pub fn result_buffer(&mut self, pool: PoolId) -> Vec<u8> {
        if self.large_results.get(pool).copied().unwrap_or(false) {
            Vec::new()
        } else {
            self.buffer()
        }
    }

    /// Keeps the results' buffers for reuse (small ones only: a 1 MiB
    /// payload should not pin 1 MiB per spare) and drops the rest, which
    /// lets go of a thread's pins on borrowed results.
    pub fn recycle(&mut self, mut results: Vec<Payload>) {
        for p in results.drain(..) {
            self.keep(p.bytes);
        }
        if self.spare_lists.len() < SPARES {
            self.spare_lists.push(results);
        }
    }

    fn keep(&mut self, mut buf: Vec<u8>) {
        if kept_size(&buf) && self.spare.len() < SPARES {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// A new Running record of `caller` on its request's list, with a
    /// clean semaphore.
    ///
    /// # Safety
    /// `caller.tasks` must be live until it is dropped, which unlinks its
    /// records.
    pub unsafe fn start(
        &mut self,
        caller: Caller,
        pool: PoolId,
        anchor: u64,
        stream: bool,
    ) -> Result<PushId, WorkerError> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).map_err(|_| WorkerError::TooManyTasks)?;
                self.slots.push(Slot {
                    gen: 1,
                    state: State::Free,
                    sema: None,
                    work: None,
                    anchor: 0,
                    owner: std::ptr::null_mut(),
                    waiter: std::ptr::null(),
                    stream: false,
                    pool: 0,
                    prev: NONE,
                    next: NONE,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        match &slot.sema {
            Some(sema) => sema.take_back(),
            None => match Sema::new() {
                Ok(s) => slot.sema = Some(s),
                Err(e) => {
                    self.free.push(index);
                    return Err(WorkerError::Semaphore(e));
                }
            },
        }
        slot.state = State::Running;
        slot.anchor = anchor;
        slot.pool = pool as u32;
        slot.waiter = caller.co;
        slot.stream = stream;
        let id = join(slot.gen, index);
        self.link(index, caller.tasks);
        if stream {
            return Ok(id);
        }
        if let Some(older) = self.newest.insert(caller.co as usize, id) {
            // results its caller never took: nobody will
            let (gen, index) = split(older);
            if self.slots[index as usize].gen == gen
                && self.slots[index as usize].state == State::Done
            {
                drop(self.release_index(index));
            }
        }
        Ok(id)
    }

    /// The record `caller` waits on: its coroutine's newest, while that
    /// is on its request's list (running or done).
    pub fn of(&self, caller: Caller) -> Option<PushId> {
        let id = *self.newest.get(&(caller.co as usize))?;
        let (gen, index) = split(id);
        let slot = &self.slots[index as usize];
        (slot.gen == gen && slot.owner == caller.tasks).then_some(id)
    }

    /// The stream record `id` when `caller` pushed it and it is still on
    /// its request's list: a handle from Lua reaches no other caller's.
    pub fn stream_of(&self, caller: Caller, id: PushId) -> Option<PushId> {
        let slot = self.slot(id)?;
        let mine = slot.stream && slot.owner == caller.tasks && slot.waiter == caller.co;
        mine.then_some(id)
    }

    /// What a read of stream `id` (see stream_of) finds: its next chunk,
    /// else its results once its handler returned, else Wait, with the
    /// stream marked as wanting a chunk.
    pub fn read_stream(&mut self, id: PushId) -> Read {
        let Some(slot) = self.slot(id) else {
            return Read::Gone;
        };
        let done = slot.state == State::Done;
        let Some(stream) = slot.work.as_ref().and_then(|w| w.stream.as_ref()) else {
            return Read::Gone;
        };
        match stream.take() {
            Taken::Chunk(chunk) => {
                if let Some(stats) = self.stats.get(slot.pool as usize) {
                    PoolStats::add(&stats.stream_chunks_out);
                    let bytes = chunk.bytes.len() as u64;
                    stats.stream_bytes_out.fetch_add(bytes, Ordering::Relaxed);
                }
                Read::Chunk(chunk)
            }
            Taken::Empty if done => Read::Done,
            Taken::Empty => Read::Wait,
        }
    }

    /// Writes a caller's chunk to stream `id` (see stream_of): Ended once
    /// its handler returned.
    pub fn write_stream(&mut self, id: PushId, chunk: Payload, wait: bool) -> Written {
        let Some(slot) = self.slot(id).filter(|s| s.state == State::Running) else {
            return Written::Ended;
        };
        let Some(stream) = slot.work.as_ref().and_then(|w| w.stream.as_ref()) else {
            return Written::Ended;
        };
        let bytes = chunk.bytes.len() as u64;
        let written = stream.write(chunk, wait);
        if let (Written::Done, Some(stats)) = (&written, self.stats.get(slot.pool as usize)) {
            PoolStats::add(&stats.stream_chunks_in);
            stats.stream_bytes_in.fetch_add(bytes, Ordering::Relaxed);
        }
        written
    }

    /// The caller of stream `id` wrote its last chunk.
    pub fn end_input(&mut self, id: PushId) {
        if let Some(stream) = self.slot(id).and_then(|s| s.work.as_ref()?.stream.as_ref()) {
            stream.end_input();
        }
    }

    /// A chunk reached stream `id`, whose reader wanted one, or its
    /// handler made room for a writer that waits: resumes the caller if it
    /// still waits.
    pub fn stream_ready(&mut self, id: PushId) {
        let Some(slot) = self.slot(id) else {
            return;
        };
        if slot.state == State::Running {
            if let Some(sema) = slot.sema.as_ref().filter(|s| s.has_waiter()) {
                // the waiter consumes the post at once (count -1 to 0)
                sema.post();
            }
        }
    }

    fn slot(&self, id: PushId) -> Option<&Slot> {
        let (gen, index) = split(id);
        self.slots
            .get(index as usize)
            .filter(|s| s.gen == gen && s.state != State::Free)
    }

    /// Hands the record the push's tasks, once they are queued.
    pub fn set_work(&mut self, id: PushId, work: Job) {
        let (gen, index) = split(id);
        if let Some(slot) = self.slots.get_mut(index as usize).filter(|s| s.gen == gen) {
            slot.work = Some(work);
        }
    }

    pub fn sema(&self, id: PushId) -> Option<&Sema> {
        self.slot(id).and_then(|s| s.sema.as_ref())
    }

    /// The results of a push that came back, in task order; the push, its
    /// arguments' buffer and list are kept for reuse.
    pub fn reclaim(&mut self, work: Job) -> Vec<Payload> {
        let pool = work.pool;
        let (results, spare) = Work::take(work);
        if let Some(large) = self.large_results.get_mut(pool) {
            *large = results.iter().any(|p| !kept_size(&p.bytes));
        }
        if let Some((mut args, work)) = spare {
            // Buffers cross over: this one is kept before the results'
            // (recycle), so the next push encodes its arguments in a
            // result the event loop has just read, and a thread writes
            // its result in arguments a thread has just read.
            self.keep(std::mem::take(&mut args.bytes));
            if self.spare_args.len() < SPARES {
                args.clear();
                self.spare_args.push(args);
            }
            if self.spare_works.len() < SPARES {
                self.spare_works.push(work);
            }
        }
        results
    }

    /// Takes the results of a Done task, with its anchor key, and frees
    /// the record.
    pub fn take_result(&mut self, id: PushId) -> Option<(Vec<Payload>, u64)> {
        let (gen, index) = split(id);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.gen != gen || slot.state != State::Done {
            return None;
        }
        // the caller lets go of its strings itself
        let anchor = std::mem::take(&mut slot.anchor);
        let work = self.release_index(index)?;
        Some((self.reclaim(work), anchor))
    }

    /// A completion from a pool thread: all the tasks of a push are done.
    /// Returns their results when no one wants them.
    pub fn complete(&mut self, work: Job) -> Option<Job> {
        let (gen, index) = split(work.task);
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return Some(work);
        };
        if slot.gen != gen {
            return Some(work);
        }
        let id = work.task;
        match slot.state {
            // A stream's reader reads between other work: it may not be
            // waiting now; it finds the results after the last chunk.
            State::Running if slot.stream => {
                slot.work = Some(work);
                slot.state = State::Done;
                if let Some(sema) = slot.sema.as_ref().filter(|s| s.has_waiter()) {
                    sema.post();
                }
                log::debug(format_args!("stream {id:#x} done"));
                None
            }
            // A record is Running only while its caller waits on its clean
            // semaphore (a timeout releases it first), so no waiter means
            // the caller's light thread was killed (ngx.thread.kill): left
            // Done, the results and the anchored strings would stay until
            // the request ends, which a timer's loop may never do.
            State::Running if !slot.sema.as_ref().is_some_and(Sema::has_waiter) => {
                if let Some(stats) = self.stats.get(slot.pool as usize) {
                    PoolStats::add(&stats.abandoned);
                }
                log::debug(format_args!(
                    "task {id:#x} done, dropped: its light thread was killed"
                ));
                self.release_index(index);
                Some(work)
            }
            State::Running => {
                slot.work = Some(work);
                slot.state = State::Done;
                if let Some(sema) = &slot.sema {
                    sema.post();
                }
                log::debug(format_args!("task {id:#x} done, resuming its caller"));
                None
            }
            State::Abandoned => {
                log::debug(format_args!(
                    "task {id:#x} done, dropped: its caller is gone"
                ));
                self.release_index(index);
                Some(work)
            }
            State::Free | State::Done => Some(work),
        }
    }

    /// The caller is done with the task: a finished record is freed, a
    /// running one is abandoned (its completion will free it) and its tasks
    /// not started yet are skipped.
    pub fn release(&mut self, id: PushId, why: Release) -> Option<Job> {
        let (gen, index) = split(id);
        let slot = self.slots.get(index as usize)?;
        if slot.gen != gen {
            return None;
        }
        match slot.state {
            State::Running => {
                if let Some(stats) = self.stats.get(slot.pool as usize) {
                    match why {
                        Release::Timeout => PoolStats::add(&stats.timed_out),
                        Release::RequestGone => PoolStats::add(&stats.abandoned),
                        Release::NotWaiting | Release::Closed => {}
                    }
                }
                self.unlink(index);
                let slot = &mut self.slots[index as usize];
                slot.state = State::Abandoned;
                if let Some(work) = &slot.work {
                    work.cancelled().cancel();
                    // a handler waiting for room hears it at once
                    if let Some(stream) = &work.stream {
                        stream.close();
                    }
                }
                None
            }
            State::Done => self.release_index(index),
            State::Free | State::Abandoned => None,
        }
    }

    fn release_index(&mut self, index: u32) -> Option<Job> {
        self.unlink(index);
        let slot = &mut self.slots[index as usize];
        let stream = slot.work.as_ref().and_then(|w| w.stream.as_ref());
        if let (Some(stream), Some(stats)) = (stream, self.stats.get(slot.pool as usize)) {
            let waited = stream.waited_us();
            stats.stream_send_wait.fetch_add(waited, Ordering::Relaxed);
        }
        let key = slot.waiter as usize;
        if self.newest.get(&key) == Some(&join(slot.gen, index)) {
            self.newest.remove(&key);
        }
        if slot.anchor != 0 {
            self.reaped.push(std::mem::take(&mut slot.anchor));
        }
        slot.state = State::Free;
        slot.gen = (slot.gen.wrapping_add(1) & GEN_MASK).max(1);
        self.free.push(index);
        slot.work.take()
    }

    /// Lets go of every task of a request that is going away.
    ///
    /// # Safety
    /// `owner` must be the live RequestTasks being dropped.
    pub unsafe fn release_request(&mut self, owner: *mut RequestTasks) -> Vec<Job> {
        let mut bufs = Vec::new();
        // SAFETY: the caller vouches for owner.
        while let Some(index) = Some(unsafe { (*owner).head }).filter(|&h| h != NONE) {
            let slot = &self.slots[index as usize];
            let id = join(slot.gen, index);
            match self.release(id, Release::RequestGone) {
                Some(buf) => bufs.push(buf),
                None => self.unlink(index),
            }
        }
        bufs
    }

    fn link(&mut self, index: u32, owner: *mut RequestTasks) {
        // SAFETY: owner is live: it is dropped only through release_request,
        // which unlinks every record first.
        let head = unsafe { (*owner).head };
        {
            let slot = &mut self.slots[index as usize];
            slot.owner = owner;
            slot.prev = NONE;
            slot.next = head;
        }
        if head != NONE {
            self.slots[head as usize].prev = index;
        }
        // SAFETY: owner is live, as when its head was read above, and nothing
        // else holds a reference to it.
        unsafe { (*owner).head = index };
    }

    fn unlink(&mut self, index: u32) {
        let (owner, prev, next) = {
            let s = &self.slots[index as usize];
            (s.owner, s.prev, s.next)
        };
        if owner.is_null() {
            return;
        }
        if prev != NONE {
            self.slots[prev as usize].next = next;
        } else {
            // SAFETY: a linked record's owner is live (see link).
            unsafe { (*owner).head = next };
        }
        if next != NONE {
            self.slots[next as usize].prev = prev;
        }
        let s = &mut self.slots[index as usize];
        s.owner = std::ptr::null_mut();
        s.prev = NONE;
        s.next = NONE;
    }

    /// Takes the anchor keys of the tasks reaped so far (see `reaped`).
    pub fn take_reaped(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.reaped)
    }

    /// Whether some anchors can be let go of.
    pub fn has_reaped(&self) -> bool {
        !self.reaped.is_empty()
    }

    /// Lets every stream's handler that waits for room go on (worker
    /// exit: nobody reads any more).
    pub fn close_streams(&self) {
        let streams = self
            .slots
            .iter()
            .filter_map(|s| s.work.as_ref()?.stream.as_ref());
        streams.for_each(crate::handoff::stream::Stream::close);
    }

    /// Drops every record and semaphore (worker exit).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.spare.clear();
        self.spare_works.clear();
        self.spare_args.clear();
        self.spare_lists.clear();
        self.reaped.clear();
        self.newest.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::job::POSTED;
    use crate::handoff::payload::Args;

    /// One task pushed to pool 0 whose result has `len` bytes, and taken
    /// back, as a pool thread and the event loop would.
    fn round(tasks: &mut Tasks, len: usize) {
        let mut args = Args {
            bytes: Vec::with_capacity(64),
            ..Args::default()
        };
        args.end_part();
        let work = tasks.work(POSTED, 0, args, None);
        let mut buffers = Vec::new();
        work.result_buffers(0..1, &mut buffers);
        let mut bytes = buffers.pop().unwrap_or_default();
        bytes.resize(len, 0);
        let result = Payload {
            bytes,
            ..Payload::default()
        };
        work.finish(&mut vec![(0, result)]);
        let results = tasks.reclaim(work);
        tasks.recycle(results);
    }

    /// A pool whose results outgrow the spares gets none for them, and
    /// gets them again once its results are small.
    #[test]
    fn large_results_take_no_spares() {
        let mut tasks = Tasks {
            large_results: vec![false],
            ..Tasks::default()
        };
        round(&mut tasks, 10);
        assert!(tasks.result_buffer(0).capacity() > 0, "a spare");
        round(&mut tasks, KEEP + 1);
        assert_eq!(tasks.result_buffer(0).capacity(), 0, "after a large one");
        round(&mut tasks, 10);
        assert!(tasks.result_buffer(0).capacity() > 0, "small again");
    }
}
