//! Counters and timings of one pool in one worker, kept with relaxed
//! atomics: the event loop and the pool's threads update them without a
//! lock, and `tp.NAME:stats()` reads them. Laid out as plain C data (u64s),
//! so that they can live in memory shared with other processes later.

pub mod gate;

use crate::ngx::http;
use crate::ngx::shm::Zone;
use crate::ngx::sys;
use gate::{GateShared, GateSlot};
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A queue stands when every task taken for STANDING_INTERVAL waited at
/// least STANDING_TARGET: CoDel's figures (Nichols and Jacobson, 2012),
/// which Facebook's RPC servers use for their queues too. A queue that
/// only absorbs a burst empties within the interval; one that does not is
/// fed faster than it is served.
const STANDING_TARGET: Duration = Duration::from_millis(5);
const STANDING_INTERVAL: Duration = Duration::from_millis(100);

/// Upper bounds of the histograms' buckets, in microseconds: 10 µs to 10 s
/// by powers of ten; the last bucket holds everything above.
pub const BUCKET_BOUNDS_US: [u64; 7] = [10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];
const BUCKETS: usize = BUCKET_BOUNDS_US.len() + 1;

#[repr(C)]
#[derive(Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative).
    buckets: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

/// The bucket of a duration, and the duration in µs.
fn bucket(d: Duration) -> (usize, u64) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let i = BUCKET_BOUNDS_US
        .iter()
        .position(|&b| us <= b)
        .unwrap_or(BUCKETS - 1);
    (i, us)
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let (i, us) = bucket(d);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    fn write(&self, out: &mut Vec<u64>) {
        out.extend(self.buckets.iter().map(|b| b.load(Relaxed)));
        out.push(self.sum_us.load(Relaxed));
    }
}

/// A histogram of one pool thread's, added to the pool's at once.
#[derive(Default)]
struct LocalHistogram {
    buckets: [u64; BUCKETS],
    sum_us: u64,
}

impl LocalHistogram {
    fn observe(&mut self, d: Duration) {
        let (i, us) = bucket(d);
        self.buckets[i] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    fn add_to(&mut self, h: &Histogram) {
        for (local, shared) in self.buckets.iter_mut().zip(&h.buckets) {
            move_count(local, shared);
        }
        move_count(&mut self.sum_us, &h.sum_us);
    }
}

/// Adds a local count to the shared one and sets it to 0; a count of 0
/// leaves the shared cache line alone.
fn move_count(local: &mut u64, shared: &AtomicU64) {
    if *local != 0 {
        shared.fetch_add(std::mem::take(local), Relaxed);
    }
}

/// A pool thread's counts of the tasks of one claim (handoff/job.rs), added to
/// the pool's counters when the claim ends, before its tasks count as
/// finished: the threads of a pool share those cache lines, and the small
/// tasks of a batch each fetched them back from the other thread.
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

/// Keeps the counters on either side of it off each other's cache lines,
/// whatever the alignment of the memory they are in.
#[repr(C)]
#[derive(Default)]
struct Apart([u64; 8]);

/// The counters of a pool. Those the pool threads write per task and
/// those the event loop writes per push are kept apart: on shared cache
/// lines, every push fetched back the line the threads had just written.
#[repr(C)]
#[derive(Default)]
pub struct PoolStats {
    pub threads: AtomicU64,
    /// Threads running a task now (the tasks of a claim, handoff/job.rs).
    pub busy: AtomicU64,
    /// Tasks claimed by a thread (to run or to skip); `queued` is
    /// `admitted` minus this.
    pub taken: AtomicU64,
    /// Tasks whose handler returned.
    pub completed: AtomicU64,
    /// Tasks whose handler failed (an error, out of memory).
    pub errors: AtomicU64,
    /// Tasks not run: their caller gave up (timed out, went away) before
    /// a thread took them.
    pub cancelled: AtomicU64,
    /// Tasks not run: their deadline came too close while they waited
    /// (see `late`).
    pub expired: AtomicU64,
    /// The recent run time of a task, in µs (0: none measured yet): a
    /// moving average, each task weighing 1/8 (see `measured`).
    pub run_estimate_us: AtomicU64,
    /// The queue's standing state, kept by the threads as they take tasks
    /// (see `took`): 1 while it stands. While the waits of the tasks taken
    /// say otherwise, `flips_at_us` holds when the state changes if they
    /// go on saying it (µs since the worker's epoch); 0 otherwise.
    pub standing: AtomicU64,
    pub flips_at_us: AtomicU64,
    /// From push to a thread taking the task.
    pub wait: Histogram,
    /// The handler's run.
    pub run: Histogram,
    /// With a shadow (`thread_pool_shadow`): tasks whose results were
    /// compared, those that differed, and those not compared because the
    /// shadow's queue was full (thread/compare.rs, thread/shadow.rs).
    pub shadow_compared: AtomicU64,
    pub shadow_mismatched: AtomicU64,
    pub shadow_skipped: AtomicU64,
    _threads_side: Apart,
    /// Places ever taken in the queue (see `reserve`), by the event loop's
    /// pushes and by the threads of pools this one shadows.
    pub admitted: AtomicU64,
    pub pushed: AtomicU64,
    /// Pushes refused because the queue was full.
    pub rejected: AtomicU64,
    /// Pushes refused because the pool could not finish them before their
    /// deadline (see `admits`).
    pub overloaded: AtomicU64,
    /// Tasks whose caller stopped waiting (push_task's timeout).
    pub timed_out: AtomicU64,
    /// Tasks whose caller went away before they finished: its request
    /// ended, or its light thread was killed.
    pub abandoned: AtomicU64,
    /// Streams pushed (push_stream); of them, the chunks and bytes
    /// (encoded) their readers took and their callers wrote, and the time
    /// their handlers' sends waited for room, in µs, counted when a
    /// stream's record is freed (worker/tasks.rs).
    pub streams: AtomicU64,
    pub stream_chunks_out: AtomicU64,
    pub stream_bytes_out: AtomicU64,
    pub stream_chunks_in: AtomicU64,
    pub stream_bytes_in: AtomicU64,
    pub stream_send_wait_us: AtomicU64,
    _event_loop_side: Apart,
}

/// Names of PoolStats' counters, in `write`'s order.
pub const COUNTER_NAMES: [&str; 12] = [
    "threads",
    "busy",
    "queued",
    "pushed",
    "completed",
    "errors",
    "rejected",
    "timed_out",
    "abandoned",
    "cancelled",
    "overloaded",
    "expired",
];

/// Names of the shadow counters, in `write`'s order, after the histograms.
pub const SHADOW_NAMES: [&str; 3] = ["compared", "mismatched", "skipped"];

/// Where the shadow counters start in `write`'s numbers.
pub const SHADOW_AT: usize = COUNTER_NAMES.len() + 2 * (BUCKETS + 1);

/// Names of the estimates of deadline-aware admission, in µs, in
/// `write`'s order, after the shadow counters.
pub const ESTIMATE_NAMES: [&str; 3] = ["expected_wait", "run_estimate", "wait_limit"];

/// Where the estimates start in `write`'s numbers.
pub const ESTIMATES_AT: usize = SHADOW_AT + SHADOW_NAMES.len();

/// Names of the stream counters, in `write`'s order, after the estimates.
pub const STREAM_NAMES: [&str; 6] = [
    "streams",
    "chunks_out",
    "bytes_out",
    "chunks_in",
    "bytes_in",
    "send_wait_us",
];

/// Where the stream counters start in `write`'s numbers.
pub const STREAM_AT: usize = ESTIMATES_AT + ESTIMATE_NAMES.len();

/// How many numbers `PoolStats::write` produces.
pub const STATS_LEN: usize = STREAM_AT + STREAM_NAMES.len();

impl PoolStats {
    /// Every number back to 0 (a worker that starts in a slot of the
    /// shared table).
    pub fn reset(&self) {
        let mut all = vec![&self.threads, &self.busy, &self.taken, &self.completed];
        all.extend([&self.errors, &self.cancelled, &self.admitted, &self.pushed]);
        all.extend([&self.rejected, &self.timed_out, &self.abandoned]);
        all.extend([&self.overloaded, &self.expired, &self.run_estimate_us]);
        all.extend([&self.standing, &self.flips_at_us]);
        all.extend(self.shadow_counters());
        all.extend(self.stream_counters());
        for h in [&self.wait, &self.run] {
            all.extend(h.buckets.iter());
            all.push(&h.sum_us);
        }
        for c in all {
            c.store(0, Relaxed);
        }
    }

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
    fn queued(&self) -> u64 {
        let taken = self.taken.load(Relaxed);
        self.admitted.load(Relaxed).saturating_sub(taken)
    }

    /// Adds a claim's `n` runs of `mean_us` each to the run estimate, each
    /// weighing 1/8 (as TCP averages its round trips): it follows a change
    /// of the run time within a few rounds of the threads, and one slow
    /// task moves it by an eighth. Pool threads only; two claims ending
    /// together may lose one's update, which the next corrects.
    fn measured(&self, mean_us: u64, n: u64) {
        let old = self.run_estimate_us.load(Relaxed);
        let new = if old == 0 {
            mean_us
        } else {
            let weight = n.min(8) as i64;
            (old as i64 + (mean_us as i64 - old as i64) * weight / 8) as u64
        };
        // 0 means none measured
        self.run_estimate_us.store(new.max(1), Relaxed);
    }

    /// The expected wait of the last of `n` tasks pushed now, in µs: the
    /// tasks ahead of it (queued, running, and the push's own) beyond one
    /// per thread, spread over the threads, each taking the run estimate.
    /// A running task counts whole, which errs on the side of waiting.
    fn expected_wait_us(&self, n: u64) -> u64 {
        let threads = self.threads.load(Relaxed).max(1);
        let ahead = self.queued() + self.busy.load(Relaxed) + n;
        let estimate = self.run_estimate_us.load(Relaxed);
        ahead.saturating_sub(threads).saturating_mul(estimate) / threads
    }

    /// Whether `n` tasks pushed now with `timeout_us` to their deadline
    /// can be expected to finish before it: their wait and a run. While
    /// the queue stands, their wait must also be within `wait_limit_us`.
    /// Tasks that find a thread free, and every push before a run time is
    /// measured, are admitted: a pool that refused every push would never
    /// measure again.
    pub fn admits(&self, n: u64, timeout_us: u64) -> bool {
        let estimate = self.run_estimate_us.load(Relaxed);
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
    fn wait_limit_us(&self, estimate: u64) -> Option<u64> {
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
    /// later). Writes only on a change: the event loop reads `standing` in
    /// every push with a deadline. Threads that take tasks together may
    /// each see the other's older state, which the next take corrects.
    pub fn took(&self, waited: Duration, now: Duration) {
        let standing = self.standing.load(Relaxed) != 0;
        let flips_at = self.flips_at_us.load(Relaxed);
        if (waited >= STANDING_TARGET) == standing {
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
        let estimate = Duration::from_micros(self.run_estimate_us.load(Relaxed));
        now + estimate > deadline && queued_at + estimate <= deadline && self.queued() > 0
    }

    pub fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub fn sub(counter: &AtomicU64) {
        counter.fetch_sub(1, Relaxed);
    }

    fn shadow_counters(&self) -> [&AtomicU64; SHADOW_NAMES.len()] {
        [
            &self.shadow_compared,
            &self.shadow_mismatched,
            &self.shadow_skipped,
        ]
    }

    fn stream_counters(&self) -> [&AtomicU64; STREAM_NAMES.len()] {
        [
            &self.streams,
            &self.stream_chunks_out,
            &self.stream_bytes_out,
            &self.stream_chunks_in,
            &self.stream_bytes_in,
            &self.stream_send_wait_us,
        ]
    }

    /// The numbers in the order the shim reads them: threads, busy, queued,
    /// pushed, completed, errors, rejected, timed_out, abandoned, cancelled,
    /// overloaded, expired, then the wait and run histograms (bucket
    /// counts, then the sum in µs), then the shadow counters, then the
    /// expected wait of a task pushed now, the run estimate and the wait
    /// limit of a standing queue (0: none), in µs, then the stream
    /// counters.
    pub fn write(&self, out: &mut Vec<u64>) {
        out.extend([
            self.threads.load(Relaxed),
            self.busy.load(Relaxed),
            self.queued(),
        ]);
        for c in [
            &self.pushed,
            &self.completed,
            &self.errors,
            &self.rejected,
            &self.timed_out,
            &self.abandoned,
            &self.cancelled,
            &self.overloaded,
            &self.expired,
        ] {
            out.push(c.load(Relaxed));
        }
        self.wait.write(out);
        self.run.write(out);
        out.extend(self.shadow_counters().map(|c| c.load(Relaxed)));
        let estimate = self.run_estimate_us.load(Relaxed);
        out.extend([
            self.expected_wait_us(1),
            estimate,
            self.wait_limit_us(estimate).unwrap_or(0),
        ]);
        out.extend(self.stream_counters().map(|c| c.load(Relaxed)));
    }
}

/// Every worker's PoolStats in a shared memory zone of the module's own,
/// for `thread_pool_status` (api/status.rs): one PoolStats per worker and pool,
/// worker-major; then the accept gate's shared state and one GateSlot per
/// worker (gate.rs).
pub struct StatusTable {
    zone: Zone,
    pub workers: usize,
    pools: usize,
}

impl StatusTable {
    /// Adds the zone for `pools` pools and the configured worker count
    /// (or, if worker_processes comes later in the file, the CPU count).
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed (postconfiguration).
    pub unsafe fn add(cf: *mut sys::ngx_conf_t, pools: usize) -> Option<StatusTable> {
        // SAFETY: cf is the configuration being parsed (the contract), whose
        // core conf configured_workers reads.
        let workers = unsafe { http::configured_workers(cf) }.unwrap_or_else(http::cpus);
        // SAFETY: cf is the configuration being parsed, in postconfiguration
        // (the contract), where a shared zone may be added.
        let zone = unsafe { Zone::add(cf, b"ngx_threadpool_status", table_size(workers, pools)) }?;
        Some(StatusTable {
            zone,
            workers,
            pools,
        })
    }

    fn stats_size(&self) -> usize {
        self.workers * self.pools * size_of::<PoolStats>()
    }

    pub fn all(&self) -> Option<&'static [PoolStats]> {
        // SAFETY: the zone was added with room for workers × pools
        // PoolStats, which are atomics, valid when zero.
        unsafe { self.zone.as_slice(0, self.workers * self.pools) }
    }

    /// Worker `worker`'s row, one PoolStats per pool (None past the
    /// workers the table was sized for).
    pub fn row(&self, worker: usize) -> Option<&'static [PoolStats]> {
        self.all()?.chunks(self.pools).nth(worker)
    }

    /// The accept gate's shared state and every worker's slot.
    pub fn gate(&self) -> Option<(&'static GateShared, &'static [GateSlot])> {
        let at = self.stats_size();
        // SAFETY: table_size left room for one GateShared and a GateSlot per
        // worker after the PoolStats, at 8-byte aligned offsets; all are
        // atomics, valid when zero.
        unsafe {
            let shared = self.zone.as_slice::<GateShared>(at, 1)?.first()?;
            let slots = self
                .zone
                .as_slice(at + size_of::<GateShared>(), self.workers)?;
            Some((shared, slots))
        }
    }
}

fn table_size(workers: usize, pools: usize) -> usize {
    workers * pools * size_of::<PoolStats>()
        + size_of::<GateShared>()
        + workers * size_of::<GateSlot>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(11));
        h.observe(Duration::from_secs(60));
        let mut out = Vec::new();
        h.write(&mut out);
        assert_eq!(out, [1, 1, 0, 0, 0, 0, 0, 1, 60_000_021]);
    }

    /// The run estimate starts at the first measure, then moves by an
    /// eighth per task; admission counts the tasks ahead beyond the
    /// threads.
    #[test]
    fn estimates_and_admission() {
        let s = PoolStats::default();
        s.threads.store(2, Relaxed);
        assert!(s.admits(100, 1), "nothing measured");
        s.measured(80_000, 1);
        assert_eq!(s.run_estimate_us.load(Relaxed), 80_000);
        s.measured(160_000, 1);
        assert_eq!(s.run_estimate_us.load(Relaxed), 90_000);
        s.measured(90_000 + 8 * 1000, 20);
        assert_eq!(s.run_estimate_us.load(Relaxed), 98_000);
        s.run_estimate_us.store(100_000, Relaxed);
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
        s.wait_limit_us(s.run_estimate_us.load(Relaxed))
    }

    /// The queue stands once every task taken for an interval waited at
    /// least the target, and stops once every task taken for an interval
    /// waited less; while it stands, admission holds the wait to one run.
    #[test]
    fn a_standing_queue_limits_the_wait() {
        let s = PoolStats::default();
        let ms = Duration::from_millis;
        s.threads.store(1, Relaxed);
        s.run_estimate_us.store(30_000, Relaxed);
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
        s.run_estimate_us.store(1000, Relaxed);
        assert_eq!(limit(&s), Some(5000), "at least the target");
        s.took(ms(4), ms(1200));
        s.took(ms(50), ms(1250));
        s.took(ms(4), ms(1260));
        s.took(ms(4), ms(1359));
        assert_eq!(limit(&s), Some(5000), "a task waited again");
        s.took(ms(4), ms(1360));
        assert_eq!(limit(&s), None, "an interval of short waits");
        s.took(ms(50), ms(1400));
        assert_eq!(limit(&s), None, "a new interval");
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
        s.run_estimate_us.store(30_000, Relaxed);
        assert!(!s.late(t0, t0 + ms(100), t0 + ms(71)), "nothing behind");
        s.admitted.store(1, Relaxed);
        assert!(!s.late(t0, t0 + ms(100), t0 + ms(70)));
        assert!(s.late(t0, t0 + ms(100), t0 + ms(71)));
        assert!(!s.late(t0, t0 + ms(20), t0 + ms(10)), "never could");
        assert!(s.late(t0, t0 + ms(20), t0 + ms(20)), "never could, passed");
    }

    #[test]
    fn writes_every_number() {
        let mut out = Vec::new();
        PoolStats::default().write(&mut out);
        assert_eq!(out.len(), STATS_LEN);
    }
}
