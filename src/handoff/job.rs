//! The tasks of one push on their way through a pool: one record on the
//! event loop, one `Work` shared by the pool threads that run its tasks,
//! one completion back.
//!
//! A single task and a batch (`push_tasks`) are the same thing: a batch is
//! one Work with one part per task. The event loop sends it to as many
//! threads as it has tasks, up to the pool's size; each thread that gets it
//! claims tasks until none is left, a share of what is left at a time
//! (guided: the shares shrink to one task at the end), so a batch of heavy
//! tasks still spreads over the pool while a batch of small ones costs one
//! send per thread, not one per task, and few claims. A thread stores a
//! claim's results and counts them finished at once. The thread that
//! finishes the last task sends the completion and wakes the event loop,
//! once per push.

use super::payload::{Args, Payload};
use crate::handoff::outcome::Cancel;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A record's handle inside the module (and in debug lines): generation <<
/// 32 | slot. A caller's record is found by who it is (`Caller`); the one
/// handle Lua holds, a stream's id, is honoured only for the request and
/// coroutine that pushed it (`Tasks::stream_of`), so none can be stale,
/// forged or another request's.
pub type PushId = u64;

/// A pool by its place: its index in the http conf's pools, in a worker's
/// pools and in each row of the status table, and the id the shim's pool
/// objects hold (`tp.NAME`). Its name is the pool's `name`.
pub type PoolId = usize;

/// The handle of a posted task (post_task): no record, no caller. Real
/// handles have a generation of at least 1.
pub const POSTED: PushId = 0;

/// What a shadow task carries to judge its result by: POOL's result and
/// the copies its arguments' spans point into. The pool threads' side
/// defines it (thread/compare.rs); the job only carries it.
pub trait Expectation: Send + Sync {
    /// Compares the shadow's result `got` on `args`, and the chunks it
    /// sent, with POOL's and counts; a mismatch's log line, when one is
    /// due.
    ///
    /// # Safety
    /// `args` must be the arguments made with self (their spans point
    /// into what self keeps).
    unsafe fn check(&self, args: &Args, got: &Payload, chunks: &[Payload]) -> Option<String>;
}

pub struct Work {
    /// The record on the event loop (POSTED for a posted task).
    pub task: PushId,
    /// The pool it was pushed to, by index.
    pub pool: PoolId,
    /// Read by the threads that claim tasks; the spans' bytes are kept
    /// alive by whoever pushed until the completion reaches the event loop.
    pub args: Args,
    pub queued_at: Instant,
    /// A push with a deadline (push_task_timeout, thread_pool_deadline):
    /// when its caller stops waiting. A thread starts none of its tasks
    /// once that is too close (PoolStats::late).
    pub deadline: Option<Instant>,
    /// Set on the event loop once the caller gave up (timeout, request
    /// gone): tasks not started yet are skipped, running ones may look.
    cancelled: Cancel,
    /// The next task to claim; past the end once all are claimed.
    next: AtomicUsize,
    /// Tasks not finished. The thread that takes it to 0 sends the
    /// completion: AcqRel, so that every other thread's results and
    /// counts, stored before its own decrement, are visible to it and to
    /// the event loop.
    left: AtomicUsize,
    /// Each task's result, stored by the thread that ran it. Until then
    /// its slot holds the buffer the thread encodes it in, from the event
    /// loop's spares: buffers go round between the two sides and are
    /// freed on neither (a free on the event loop of memory a pool thread
    /// allocated takes that thread's malloc arena lock).
    results: Mutex<Vec<Payload>>,
    /// A shadow task's (thread/shadow.rs): POOL's result to compare with; its
    /// arguments' spans point into it.
    pub expected: Option<Box<dyn Expectation>>,
    /// A stream's (push_stream): where its handler's chunks go.
    pub stream: Option<crate::handoff::stream::Stream>,
}

/// The capacity a result's buffer starts with.
const RESULT_CAPACITY: usize = 256;

/// How a pool thread shares a push.
pub type Job = Arc<Work>;

impl Work {
    /// A push, with its `deadline` from now, whose results are written in
    /// buffers from `buffer`, listed in `results` (emptied first). `spare`, a push that came back and
    /// that no thread holds (see `take`), is reused: a push in steady state
    /// allocates nothing.
    pub fn new(
        spare: Option<Job>,
        task: PushId,
        pool: PoolId,
        args: Args,
        results: Vec<Payload>,
        deadline: Option<Duration>,
        buffer: impl FnMut() -> Vec<u8>,
    ) -> Job {
        let mut work = Work::with(task, pool, args, None, results, buffer);
        work.deadline = deadline.map(|d| work.queued_at + d);
        match spare {
            Some(mut job) => match Arc::get_mut(&mut job) {
                Some(w) => {
                    *w = work;
                    job
                }
                None => Arc::new(work),
            },
            None => Arc::new(work),
        }
    }

    /// A shadow task: `args` (one task) run again on the shadow pool, to
    /// compare with `expected`; nobody takes its result.
    pub fn shadowing(pool: PoolId, args: Args, expected: Box<dyn Expectation>) -> Job {
        Arc::new(Work::with(
            POSTED,
            pool,
            args,
            Some(expected),
            Vec::new(),
            Vec::new,
        ))
    }

    /// No task: a wake-up, which makes the pool thread that takes it
    /// look for an update (thread/updates.rs) and nothing else.
    pub fn wake(pool: PoolId) -> Job {
        Arc::new(Work::with(
            POSTED,
            pool,
            Args::default(),
            None,
            Vec::new(),
            Vec::new,
        ))
    }

    fn with(
        task: PushId,
        pool: PoolId,
        args: Args,
        expected: Option<Box<dyn Expectation>>,
        mut results: Vec<Payload>,
        mut buffer: impl FnMut() -> Vec<u8>,
    ) -> Work {
        let n = args.count();
        results.clear();
        results.extend((0..n).map(|_| Payload {
            bytes: buffer(),
            ..Payload::default()
        }));
        Work {
            task,
            pool,
            args,
            queued_at: Instant::now(),
            deadline: None,
            cancelled: Cancel::default(),
            next: AtomicUsize::new(0),
            left: AtomicUsize::new(n),
            results: Mutex::new(results),
            expected,
            stream: None,
        }
    }

    /// The number of tasks.
    pub fn count(&self) -> usize {
        self.args.count()
    }

    /// The next tasks this thread runs, None once every one was claimed:
    /// a share of those left among `sharers` threads (half of an even
    /// share, so that the last claims are small and the threads finish
    /// together), at least one.
    pub fn claim(&self, sharers: usize) -> Option<Range<usize>> {
        let n = self.count();
        let mut next = self.next.load(Ordering::Relaxed);
        loop {
            if next >= n {
                return None;
            }
            let k = ((n - next) / (2 * sharers.max(1))).max(1);
            match self.next.compare_exchange_weak(
                next,
                next + k,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(next..next + k),
                Err(now) => next = now,
            }
        }
    }

    /// The push's flag that its caller gave up (shared by its tasks).
    pub fn cancelled(&self) -> &Cancel {
        &self.cancelled
    }

    /// The buffers that the results of the tasks of `claim` are written
    /// in, appended to `out` in task order, with room for the usual small
    /// results at once.
    pub fn result_buffers(&self, claim: Range<usize>, out: &mut Vec<Vec<u8>>) {
        let mut results = self.lock();
        out.extend(claim.map(|i| {
            let mut buf = results
                .get_mut(i)
                .map(|p| std::mem::take(&mut p.bytes))
                .unwrap_or_default();
            buf.reserve(RESULT_CAPACITY);
            buf
        }));
    }

    /// Stores the results of a claim's tasks (task, result) and counts
    /// those tasks finished: true if they were the last.
    pub fn finish(&self, results: &mut Vec<(usize, Payload)>) -> bool {
        let done = results.len();
        if done == 0 {
            return false;
        }
        let mut slots = self.lock();
        for (i, result) in results.drain(..) {
            if let Some(slot) = slots.get_mut(i) {
                *slot = result;
            }
        }
        drop(slots);
        self.left.fetch_sub(done, Ordering::AcqRel) == done
    }

    /// The results, in task order, and, if no pool thread holds the push
    /// any more, its arguments and the push itself, for reuse (the
    /// completion's receiver only).
    pub fn take(mut work: Job) -> (Vec<Payload>, Option<(Args, Job)>) {
        let Some(w) = Arc::get_mut(&mut work) else {
            return (std::mem::take(&mut *work.lock()), None);
        };
        // no thread holds it: no lock to take
        let results = std::mem::take(w.results.get_mut().unwrap_or_else(PoisonError::into_inner));
        let args = std::mem::take(&mut w.args);
        (results, Some((args, work)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Payload>> {
        // A result is a plain value: a thread that panicked holding the
        // lock left nothing half-written that matters.
        self.results.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims take a share of what is left, shrinking to one task, and
    /// cover every task once.
    #[test]
    fn claims_shrink_and_cover_the_tasks() {
        let mut args = Args::default();
        for _ in 0..64 {
            args.bytes.push(0xc0);
            args.end_part();
        }
        let job = Work::new(None, 1, 0, args, Vec::new(), None, Vec::new);
        let mut claims = Vec::new();
        while let Some(c) = job.claim(2) {
            claims.push(c);
        }
        let sizes: Vec<usize> = claims.iter().map(|c| c.len()).collect();
        assert_eq!(sizes[0], 16, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        assert_eq!(sizes.last(), Some(&1));
        assert!(claims.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(claims.last().map(|c| c.end), Some(64));
        assert!(job.claim(2).is_none());
    }

    /// A push's buffers come back to the event loop for reuse: a result is
    /// written in the buffer the push supplied, and the arguments and the
    /// push itself are handed back once no pool thread holds it.
    #[test]
    fn buffers_go_round() {
        let mut args = Args {
            bytes: Vec::with_capacity(64),
            ..Args::default()
        };
        args.bytes.push(0xc0);
        args.end_part();
        let args_at = args.bytes.as_ptr();
        let mut supplied = Some(Vec::with_capacity(512));
        let supplied_at = supplied.as_ref().map(|b| b.as_ptr());
        let job = Work::new(None, 1, 0, args, Vec::new(), None, || {
            supplied.take().unwrap_or_default()
        });
        let shared = job.clone();
        std::thread::spawn(move || {
            let claim = shared.claim(2).expect("one task");
            assert_eq!(claim, 0..1);
            let mut buffers = Vec::new();
            shared.result_buffers(claim, &mut buffers);
            let mut bytes = buffers.pop().expect("its buffer");
            bytes.push(0xc3);
            let result = Payload {
                bytes,
                ..Payload::default()
            };
            assert!(shared.finish(&mut vec![(0, result)]), "the only task");
        })
        .join()
        .expect("the pool thread");
        let (results, spare) = Work::take(job);
        assert_eq!(results[0].bytes, [0xc3]);
        assert_eq!(Some(results[0].bytes.as_ptr()), supplied_at, "result");
        let (args, job) = spare.expect("no thread holds the push");
        assert_eq!(args.bytes.as_ptr(), args_at, "arguments");
        let job_at = Arc::as_ptr(&job);
        let again = Work::new(Some(job), 2, 0, args, results, None, Vec::new);
        assert_eq!(Arc::as_ptr(&again), job_at, "the push itself");
    }
}
