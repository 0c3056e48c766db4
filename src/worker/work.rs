//! The tasks of one push on their way through a pool: one record on the
//! event loop, one `Work` shared by the pool threads that run its tasks,
//! one completion back.
//!
//! A single task and a batch (`push_tasks`) are the same thing: a batch is
//! one Work with one part per task. The event loop sends it to as many
//! threads as it has tasks, up to the pool's size; each thread that gets it
//! claims tasks one at a time until none is left, so a batch of heavy
//! tasks still spreads over the pool while a batch of small ones costs one
//! send per thread, not one per task. The thread that finishes the last
//! task sends the completion and wakes the event loop, once per push.

use super::compare::Expected;
use super::payload::{Args, Payload};
use super::tasks::{TaskId, POSTED};
use crate::run::Cancel;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

pub struct Work {
    /// The record on the event loop (tasks::POSTED for a posted task).
    pub task: TaskId,
    /// Read by the threads that claim tasks; the spans' bytes are kept
    /// alive by whoever pushed until the completion reaches the event loop.
    pub args: Args,
    pub queued_at: Instant,
    /// Set on the event loop once the caller gave up (timeout, request
    /// gone): tasks not started yet are skipped, running ones may look.
    cancelled: Cancel,
    /// The next task to claim; past the end once all are claimed.
    next: AtomicUsize,
    /// Tasks not finished. The thread that takes it to 0 sends the
    /// completion: AcqRel, so that every other thread's result, stored
    /// before its own decrement, is visible to it and to the event loop.
    left: AtomicUsize,
    /// Each task's result, stored by the thread that ran it.
    results: Mutex<Vec<Payload>>,
    /// A shadow task's (shadow.rs): POOL's result to compare with; its
    /// arguments' spans point into it.
    pub expected: Option<Expected>,
}

/// How a pool thread shares a push.
pub type Job = Arc<Work>;

impl Work {
    pub fn new(task: TaskId, args: Args) -> Job {
        Arc::new(Work::with(task, args, None))
    }

    /// A shadow task: `args` (one task) run again on the shadow pool, to
    /// compare with `expected`; nobody takes its result.
    pub fn shadowing(args: Args, expected: Expected) -> Job {
        Arc::new(Work::with(POSTED, args, Some(expected)))
    }

    fn with(task: TaskId, args: Args, expected: Option<Expected>) -> Work {
        let n = args.count();
        Work {
            task,
            args,
            queued_at: Instant::now(),
            cancelled: Cancel::default(),
            next: AtomicUsize::new(0),
            left: AtomicUsize::new(n),
            results: Mutex::new((0..n).map(|_| Payload::default()).collect()),
            expected,
        }
    }

    /// The number of tasks.
    pub fn count(&self) -> usize {
        self.args.count()
    }

    /// The next task this thread runs, None once every one was claimed.
    pub fn claim(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.count()).then_some(i)
    }

    /// The push's flag that its caller gave up (shared by its tasks).
    pub fn cancelled(&self) -> &Cancel {
        &self.cancelled
    }

    /// Stores the result of task `i`: true if it was the last to finish.
    pub fn finish(&self, i: usize, result: Payload) -> bool {
        if let Some(slot) = self.lock().get_mut(i) {
            *slot = result;
        }
        self.left.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The results, in task order (the completion's receiver only).
    /// The arguments and the results of a push nobody else holds.
    pub fn into_parts(self) -> (Args, Vec<Payload>) {
        let results = self
            .results
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        (self.args, results)
    }

    pub fn take_results(&self) -> Vec<Payload> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Payload>> {
        // A result is a plain value: a thread that panicked holding the
        // lock left nothing half-written that matters.
        self.results.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
