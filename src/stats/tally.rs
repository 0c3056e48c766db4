//! A pool thread's counts of the tasks of one claim (handoff/job.rs),
//! added to the pool's counters when the claim ends, before its tasks count
//! as finished: the threads of a pool share those cache lines, and the
//! small tasks of a batch each fetched them back from the other thread.

use super::counters::PoolStats;
use super::histogram::{move_count, LocalHistogram};
use std::time::Duration;

#[derive(Default)]
pub struct Tally {
    pub completed: u64,
    pub errors: u64,
    pub cancelled: u64,
    pub expired: u64,
    wait: LocalHistogram,
    run: LocalHistogram,
}

impl Tally {
    /// A task's wait, from its push to its start.
    pub fn waited(&mut self, d: Duration) {
        self.wait.observe(d);
    }

    /// A task's run.
    pub fn ran(&mut self, d: Duration) {
        self.run.observe(d);
    }

    /// Adds the counts to `stats` and starts again from 0.
    pub fn flush(&mut self, stats: &PoolStats) {
        let ran = self.completed + self.errors;
        if let Some(mean_us) = self.run.sum_us.checked_div(ran) {
            stats.measured(mean_us, ran);
        }
        move_count(&mut self.completed, &stats.completed);
        move_count(&mut self.errors, &stats.errors);
        move_count(&mut self.cancelled, &stats.cancelled);
        move_count(&mut self.expired, &stats.expired);
        self.wait.add_to(&stats.wait);
        self.run.add_to(&stats.run);
    }
}
