//! What a pool's counters decide with, beyond counting: the queue's bound
//! (`reserve`), the run estimate, deadline-aware admission (`admits`),
//! CoDel's standing queue (`took`) and a queued task's lateness (`late`).

use super::counters::PoolStats;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// A queue stands when every task taken for STANDING_INTERVAL waited at
/// least STANDING_TARGET: CoDel's figures (Nichols and Jacobson, 2012),
/// which Facebook's RPC servers use for their queues too. A queue that
/// only absorbs a burst empties within the interval; one that does not is
/// fed faster than it is served.
const STANDING_TARGET: Duration = Duration::from_millis(5);
const STANDING_INTERVAL: Duration = Duration::from_millis(100);

impl PoolStats {
    /// Takes `n` places in the pool's queue of `max`: false, taking none,
    /// when they are not all free. The event loop's pushes and POOL
    /// threads' shadow tasks take them alike. `taken` is what the caller
    /// last read of `self.taken`: it only grows, so an old value counts
    /// more tasks queued than there are, and is read again only when the
    /// queue looks full (the event loop's pushes then touch no line the
    /// threads write).
    pub fn reserve(&self, n: u64, max: u64, taken: &mut u64) -> bool {
        let admit = |taken: u64| {
            self.admitted
                .fetch_update(Relaxed, Relaxed, |a| {
                    (a.saturating_sub(taken) + n <= max).then_some(a + n)
                })
                .is_ok()
        };
        if admit(*taken) {
            return true;
        }
        *taken = self.taken.load(Relaxed);
        admit(*taken)
    }

    /// Gives back places `reserve` took for tasks that were not queued.
    pub fn unreserve(&self, n: u64) {
        self.admitted.fetch_sub(n, Relaxed);
    }

    /// Tasks waiting in the queue now.
    pub(super) fn queued(&self) -> u64 {
        let taken = self.taken.load(Relaxed);
        self.admitted.load(Relaxed).saturating_sub(taken)
    }

    /// Adds a claim's `n` runs of `mean_us` each to the run estimate, each
    /// weighing 1/8 (as TCP averages its round trips): it follows a change
    /// of the run time within a few rounds of the threads, and one slow
    /// task moves it by an eighth. Pool threads only; two claims ending
    /// together may lose one's update, which the next corrects.
    pub(super) fn measured(&self, mean_us: u64, n: u64) {
        let old = self.run_estimate.load(Relaxed);
        let new = if old == 0 {
            mean_us
        } else {
            let weight = n.min(8) as i64;
            (old as i64 + (mean_us as i64 - old as i64) * weight / 8) as u64
        };
        // 0 means none measured
        self.run_estimate.store(new.max(1), Relaxed);
    }

    /// The expected wait of the last of `n` tasks pushed now, in µs: the
    /// tasks ahead of it (queued, running, and the push's own) beyond one
    /// per thread, spread over the threads, each taking the run estimate.
    /// A running task counts whole, which errs on the side of waiting.
    pub(super) fn expected_wait_us(&self, n: u64) -> u64 {
        let threads = self.threads.load(Relaxed).max(1);
        let ahead = self.queued() + self.busy.load(Relaxed) + n;
        let estimate = self.run_estimate.load(Relaxed);
        ahead.saturating_sub(threads).saturating_mul(estimate) / threads
    }

    /// Whether `n` tasks pushed now with `timeout_us` to their deadline
    /// can be expected to finish before it: their wait and a run. While
    /// the queue stands, their wait must also be within `wait_limit_us`.
    /// Tasks that find a thread free, and every push before a run time is
    /// measured, are admitted: a pool that refused every push would never
    /// measure again.
    pub fn admits(&self, n: u64, timeout_us: u64) -> bool {
        let estimate = self.run_estimate.load(Relaxed);
        let wait = self.expected_wait_us(n);
        if estimate == 0 || wait == 0 {
            return true;
        }
        let limit = self.wait_limit_us(estimate).unwrap_or(u64::MAX);
        wait <= limit && wait.saturating_add(estimate) <= timeout_us
    }

    /// The longest wait admitted while the queue stands (None while it
    /// does not): one run of the threads (`estimate`, the run estimate the
    /// caller read), at least STANDING_TARGET. The
    /// threads then always have a task ready as they finish one, and an
    /// admitted task answers within about two runs of its push, however
    /// far its deadline: the rest of the deadline is left for what the
    /// pool cannot see (the request's time before the push, on a busy
    /// host its wait to be accepted, and the way back).
    pub(super) fn wait_limit_us(&self, estimate: u64) -> Option<u64> {
        (self.standing.load(Relaxed) != 0).then(|| estimate.max(STANDING_TARGET.as_micros() as u64))
    }

    /// A pool thread took a task (or a claim of a batch's) that waited
    /// `waited`, at `now` since the worker's epoch: CoDel's test of a
    /// standing queue, both ways. The queue starts standing once every
    /// task taken for a whole STANDING_INTERVAL waited at least
    /// STANDING_TARGET, and stops once every task taken for an interval
    /// waited less: under the limit the queue is short and now and then
    /// empty, and one task taken at once must not give the full deadline
    /// back (the queue would grow to it, and stand again, an interval
    /// later). A take that leaves nothing queued counts as a short wait,
    /// as CoDel counts a packet that empties its queue: its wait was the
    /// thread's (a late wake-up on a busy host), not a queue's, and two
    /// such takes far apart would otherwise make a standing queue of none.
    /// Writes only on a change: the event loop reads `standing` in every
    /// push with a deadline. Threads that take tasks together may each see
    /// the other's older state, which the next take corrects. Called after
    /// the take is counted in `taken`.
    pub fn took(&self, waited: Duration, now: Duration) {
        let standing = self.standing.load(Relaxed) != 0;
        let flips_at = self.flips_at_us.load(Relaxed);
        let long = waited >= STANDING_TARGET && self.queued() > 0;
        if long == standing {
            if flips_at != 0 {
                self.flips_at_us.store(0, Relaxed);
            }
            return;
        }
        // + 1: 0 means no change under way
        let now_us = u64::try_from(now.as_micros()).unwrap_or(u64::MAX - 1) + 1;
        if flips_at == 0 {
            let interval = STANDING_INTERVAL.as_micros() as u64;
            self.flips_at_us
                .store(now_us.saturating_add(interval), Relaxed);
        } else if now_us >= flips_at {
            self.standing.store(u64::from(!standing), Relaxed);
            self.flips_at_us.store(0, Relaxed);
        }
    }

    /// Whether a thread should not start a task queued at `queued_at`
    /// with `deadline` (pool threads, as it takes it): its deadline has
    /// passed (its caller stops waiting, if it has not already), or, while
    /// other tasks wait for a thread, the wait has made it late: it could
    /// have finished in time had it started at once, by the run estimate,
    /// and can no longer. Nobody waiting, the thread would idle: the task
    /// runs, and may beat the estimate. One that could never finish in
    /// time (a timeout shorter than the run time) runs as on an idle pool.
    pub fn late(&self, queued_at: Instant, deadline: Instant, now: Instant) -> bool {
        if now >= deadline {
            return true;
        }
        let estimate = Duration::from_micros(self.run_estimate.load(Relaxed));
        now + estimate > deadline && queued_at + estimate <= deadline && self.queued() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run estimate starts at the first measure, then moves by an
    /// eighth per task; admission counts the tasks ahead beyond the
    /// threads.
    #[test]
    fn estimates_and_admission() {
        let s = PoolStats::default();
        s.threads.store(2, Relaxed);
        assert!(s.admits(100, 1), "nothing measured");
        s.measured(80_000, 1);
        assert_eq!(s.run_estimate.load(Relaxed), 80_000);
        s.measured(160_000, 1);
        assert_eq!(s.run_estimate.load(Relaxed), 90_000);
        s.measured(90_000 + 8 * 1000, 20);
        assert_eq!(s.run_estimate.load(Relaxed), 98_000);
        s.run_estimate.store(100_000, Relaxed);
        // two threads free: both start at once
        assert!(s.admits(2, 1));
        s.busy.store(2, Relaxed);
        s.admitted.store(3, Relaxed);
        // 3 queued, 2 running, and the push's one: the last waits 2 runs
        assert_eq!(s.expected_wait_us(1), 200_000);
        assert!(s.admits(1, 300_000));
        assert!(!s.admits(1, 299_999));
    }

    /// The wait limit admission would read now.
    fn limit(s: &PoolStats) -> Option<u64> {
        s.wait_limit_us(s.run_estimate.load(Relaxed))
    }

    /// The queue stands once every task taken for an interval waited at
    /// least the target, and stops once every task taken for an interval
    /// waited less; while it stands, admission holds the wait to one run.
    #[test]
    fn a_standing_queue_limits_the_wait() {
        let s = PoolStats::default();
        let ms = Duration::from_millis;
        s.threads.store(1, Relaxed);
        s.run_estimate.store(30_000, Relaxed);
        // one running, two queued, the push's own: it waits 3 runs
        s.busy.store(1, Relaxed);
        s.admitted.store(2, Relaxed);
        assert!(s.admits(1, 10_000_000));
        s.took(ms(5), ms(1000));
        s.took(ms(50), ms(1099));
        assert_eq!(limit(&s), None, "not a whole interval yet");
        s.took(ms(50), ms(1100));
        assert_eq!(limit(&s), Some(30_000));
        assert!(!s.admits(1, 10_000_000));
        s.admitted.store(0, Relaxed);
        assert!(s.admits(1, 10_000_000), "one run ahead");
        s.run_estimate.store(1000, Relaxed);
        assert_eq!(limit(&s), Some(5000), "at least the target");
        s.admitted.store(2, Relaxed);
        s.took(ms(4), ms(1200));
        s.took(ms(50), ms(1250));
        s.took(ms(4), ms(1260));
        s.took(ms(4), ms(1359));
        assert_eq!(limit(&s), Some(5000), "a task waited again");
        s.took(ms(4), ms(1360));
        assert_eq!(limit(&s), None, "an interval of short waits");
        s.took(ms(50), ms(1400));
        assert_eq!(limit(&s), None, "a new interval");
        s.admitted.store(0, Relaxed);
        s.took(ms(50), ms(1600));
        s.took(ms(50), ms(1800));
        assert_eq!(limit(&s), None, "takes that emptied the queue");
    }

    /// A queued task is late once its deadline passed, or, with tasks
    /// behind it, once it can no longer finish by its deadline though it
    /// could have at its push; one that never could still runs.
    #[test]
    fn lateness() {
        let s = PoolStats::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert!(!s.late(t0, t0 + ms(100), t0 + ms(99)), "nothing measured");
        assert!(s.late(t0, t0 + ms(100), t0 + ms(100)), "passed");
        s.run_estimate.store(30_000, Relaxed);
        assert!(!s.late(t0, t0 + ms(100), t0 + ms(71)), "nothing behind");
        s.admitted.store(1, Relaxed);
        assert!(!s.late(t0, t0 + ms(100), t0 + ms(70)));
        assert!(s.late(t0, t0 + ms(100), t0 + ms(71)));
        assert!(!s.late(t0, t0 + ms(20), t0 + ms(10)), "never could");
        assert!(s.late(t0, t0 + ms(20), t0 + ms(20)), "never could, passed");
    }
}
