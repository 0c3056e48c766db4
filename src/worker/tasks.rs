//! Tasks as the event loop sees them: a slab of records, each tied to the
//! request that pushed it. Event-loop thread only.
//!
//! A record outlives whatever may vanish under it: if the request ends or
//! the caller stops waiting (timeout, killed light thread), the record is
//! only marked, and the completion that arrives later frees it. The
//! semaphore a caller waits on belongs to the record, never to the Lua GC.

use super::payload::Payload;
use super::stats::PoolStats;
use super::{with_worker, WorkerError};
use crate::ngx::log;
use crate::ngx::lua::Sema;

/// A task's handle as the shim holds it: generation << 32 | slot. A stale or
/// forged handle names no live record and is refused.
pub type TaskId = u64;

/// The handle of a posted task (post_task): no record, no caller. Real
/// handles have a generation of at least 1.
pub const POSTED: TaskId = 0;

const NONE: u32 = u32::MAX;
/// Payload buffers up to this size are kept for reuse.
pub const KEEP: usize = 64 * 1024;
/// After payloads adding up to this size, a pool thread that goes idle
/// gives memory back (threads.rs).
pub const LARGE: usize = 1024 * 1024;
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
    /// Kept across reuse while clean (no unconsumed post).
    sema: Option<Sema>,
    /// Posted and not yet consumed by a successful wait: such a semaphore
    /// still holds a resource and cannot be reused.
    sema_posted: bool,
    result: Payload,
    failed: bool,
    /// The arguments borrow strings of the caller, which the shim keeps
    /// alive until it takes the result or hears the task is reaped.
    borrowed: bool,
    /// The pool the task was pushed to (an index in Tasks::stats).
    pool: u32,
    /// The request's task list this record is on (NONE when on none).
    owner: *mut RequestTasks,
    /// In a batch (push_tasks): the record whose semaphore the caller
    /// waits on, posted when the last task of the batch is done (NONE for
    /// a single task, or once the record was let go of).
    leader: u32,
    /// On a batch's leader: its tasks not done yet.
    waiting: u32,
    prev: u32,
    next: u32,
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
            for buf in unsafe { w.tasks.release_request(me) } {
                w.tasks.recycle(buf);
            }
        });
    }
}

#[derive(Default)]
pub struct Tasks {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Result buffers kept for reuse, so steady state allocates nothing.
    spare: Vec<Vec<u8>>,
    /// Tasks with borrowed arguments that ended without their caller
    /// taking the result: the shim may now let go of those strings.
    reaped: Vec<TaskId>,
    /// Each pool's counters, by pool index.
    pub stats: Vec<&'static PoolStats>,
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
}

fn split(id: TaskId) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

fn join(gen: u32, index: u32) -> TaskId {
    (u64::from(gen) << 32) | u64::from(index)
}

impl Tasks {
    /// A buffer for a new task's payload.
    pub fn buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps a payload's buffer for reuse (small ones only: a 1 MiB payload
    /// should not pin 1 MiB per spare) and drops the rest, which lets go of
    /// a thread's pin on borrowed results.
    pub fn recycle(&mut self, payload: Payload) {
        let mut buf = payload.bytes;
        if buf.capacity() <= KEEP && self.spare.len() < 256 {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// A new Running record on `owner`'s list, with a clean semaphore.
    ///
    /// # Safety
    /// `owner` must be live until it is dropped, which unlinks its records.
    pub unsafe fn start(
        &mut self,
        owner: *mut RequestTasks,
        pool: usize,
        borrowed: bool,
    ) -> Result<TaskId, WorkerError> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).map_err(|_| WorkerError::TooManyTasks)?;
                self.slots.push(Slot {
                    gen: 1,
                    state: State::Free,
                    sema: None,
                    sema_posted: false,
                    result: Payload::default(),
                    failed: false,
                    borrowed: false,
                    owner: std::ptr::null_mut(),
                    leader: NONE,
                    waiting: 0,
                    pool: 0,
                    prev: NONE,
                    next: NONE,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        if slot.sema.is_none() {
            match Sema::new() {
                Ok(s) => slot.sema = Some(s),
                Err(e) => {
                    self.free.push(index);
                    return Err(WorkerError::Semaphore(e));
                }
            }
        }
        slot.state = State::Running;
        slot.failed = false;
        slot.borrowed = borrowed;
        slot.pool = pool as u32;
        let id = join(slot.gen, index);
        self.link(index, owner);
        Ok(id)
    }

    fn slot(&self, id: TaskId) -> Option<&Slot> {
        let (gen, index) = split(id);
        self.slots
            .get(index as usize)
            .filter(|s| s.gen == gen && s.state != State::Free)
    }

    /// Makes the Running records `ids` one batch: the first one's
    /// semaphore is posted once all of them are done.
    pub fn group(&mut self, ids: &[TaskId]) {
        let Some(&first) = ids.first() else {
            return;
        };
        let leader = split(first).1;
        for &id in ids {
            self.slots[split(id).1 as usize].leader = leader;
        }
        self.slots[leader as usize].waiting = ids.len() as u32;
    }

    pub fn sema(&self, id: TaskId) -> Option<&Sema> {
        self.slot(id).and_then(|s| s.sema.as_ref())
    }

    /// Takes the result of a Done task, and whether the handler failed, and
    /// frees the record. Taking it means the caller's wait consumed the post.
    pub fn take_result(&mut self, id: TaskId) -> Option<(Payload, bool)> {
        let (gen, index) = split(id);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.gen != gen || slot.state != State::Done {
            return None;
        }
        slot.sema_posted = false;
        // the caller lets go of its strings itself
        slot.borrowed = false;
        let failed = slot.failed;
        Some((self.release_index(index), failed))
    }

    /// A completion from a pool thread. Returns the payload buffer when no
    /// one wants it.
    pub fn complete(&mut self, id: TaskId, payload: Payload, failed: bool) -> Option<Payload> {
        let (gen, index) = split(id);
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return Some(payload);
        };
        if slot.gen != gen {
            return Some(payload);
        }
        match slot.state {
            State::Running => {
                let old = std::mem::replace(&mut slot.result, payload);
                slot.failed = failed;
                slot.state = State::Done;
                let leader = slot.leader;
                let wake = if leader == NONE {
                    index
                } else {
                    let l = &mut self.slots[leader as usize];
                    l.waiting -= 1;
                    if l.waiting > 0 {
                        log::debug(format_args!("task {id:#x} done, in a batch"));
                        return Some(old);
                    }
                    leader
                };
                let slot = &mut self.slots[wake as usize];
                if let Some(sema) = &slot.sema {
                    sema.post();
                    slot.sema_posted = true;
                }
                log::debug(format_args!("task {id:#x} done, resuming its caller"));
                Some(old)
            }
            State::Abandoned => {
                self.release_index(index);
                log::debug(format_args!(
                    "task {id:#x} done, dropped: its caller is gone"
                ));
                Some(payload)
            }
            State::Free | State::Done => Some(payload),
        }
    }

    /// The caller is done with the task: a finished record is freed, a
    /// running one is abandoned (its completion will free it).
    pub fn release(&mut self, id: TaskId, why: Release) -> Option<Payload> {
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
                        Release::NotWaiting => {}
                    }
                }
                self.unlink(index);
                let slot = &mut self.slots[index as usize];
                slot.state = State::Abandoned;
                // A batch is let go of whole: its leader may be freed
                // before this task completes.
                slot.leader = NONE;
                None
            }
            State::Done => Some(self.release_index(index)),
            State::Free | State::Abandoned => None,
        }
    }

    fn release_index(&mut self, index: u32) -> Payload {
        self.unlink(index);
        let slot = &mut self.slots[index as usize];
        if slot.borrowed {
            slot.borrowed = false;
            self.reaped.push(join(slot.gen, index));
        }
        if slot.sema_posted {
            // A post nobody consumed: the semaphore keeps a resource.
            slot.sema = None;
            slot.sema_posted = false;
        }
        slot.state = State::Free;
        slot.leader = NONE;
        slot.waiting = 0;
        slot.gen = (slot.gen.wrapping_add(1) & GEN_MASK).max(1);
        self.free.push(index);
        std::mem::take(&mut slot.result)
    }

    /// Lets go of every task of a request that is going away.
    ///
    /// # Safety
    /// `owner` must be the live RequestTasks being dropped.
    pub unsafe fn release_request(&mut self, owner: *mut RequestTasks) -> Vec<Payload> {
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
        // SAFETY: as above.
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

    /// Moves at most `out.len()` reaped tasks (see `reaped`) into `out`;
    /// returns how many.
    pub fn take_reaped(&mut self, out: &mut [TaskId]) -> usize {
        let n = out.len().min(self.reaped.len());
        let from = self.reaped.len() - n;
        out[..n].copy_from_slice(&self.reaped[from..]);
        self.reaped.truncate(from);
        n
    }

    /// Drops every record and semaphore (worker exit).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.spare.clear();
        self.reaped.clear();
    }
}
