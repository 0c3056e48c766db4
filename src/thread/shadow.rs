//! POOL's half of a shadow comparison (`thread_pool_shadow POOL SHADOW
//! [sample=RATIO] [log_values=on]`): a sampled share of POOL's tasks run again on SHADOW
//! with the same arguments, and SHADOW's thread compares the two results
//! (compare.rs). POOL's thread hands the task over when its own result is
//! there, before the completion goes to the event loop: the arguments'
//! borrowed strings (the caller's, anchored until it takes the result) and
//! the result's (pinned in POOL's state until the event loop drops it) are
//! still alive, and are copied, for sampled tasks only. The caller's
//! completion waits for that copy and a channel send; the comparison runs
//! on SHADOW's thread.

use super::compare::{Expected, Owned, Pair};
use crate::conf::ShadowOptions;
use crate::handoff::job::{Job, Work};
use crate::handoff::payload::Payload;
use crate::handoff::stream::{Recorded, Stream};
use crate::stats::PoolStats;
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Which tasks are sampled: task n (counted from 0 over the POOL tasks
/// whose handler ran in this worker, in the order their threads finish
/// them) is when floor((n + 1) × ratio) > floor(n × ratio). Of N tasks,
/// exactly floor(N × ratio) are sampled, whatever the order: every k-th
/// for a ratio of 1/k.
struct Sampler {
    ratio: f64,
    seen: AtomicU64,
}

impl Sampler {
    fn take(&self) -> bool {
        let n = self.seen.fetch_add(1, Relaxed) as f64;
        ((n + 1.0) * self.ratio).floor() > (n * self.ratio).floor()
    }
}

/// Where POOL's threads send their sampled tasks.
pub struct Shadow {
    pair: Arc<Pair>,
    sample: Sampler,
    /// SHADOW's job channel.
    jobs: Sender<Job>,
    /// SHADOW's index among the worker's pools.
    index: usize,
    /// SHADOW's counters, whose `admitted` and `taken` bound its queue.
    queue: &'static PoolStats,
    max_queue: usize,
}

/// What Worker::start knows of SHADOW.
pub struct Target {
    pub name: String,
    pub index: usize,
    pub jobs: Sender<Job>,
    pub stats: &'static PoolStats,
    pub max_queue: usize,
}

impl Shadow {
    pub fn new(
        pool: String,
        counts: &'static PoolStats,
        options: ShadowOptions,
        target: Target,
    ) -> Shadow {
        let pair = Pair::new(pool, target.name, counts, options.log_values);
        Shadow {
            pair: Arc::new(pair),
            sample: Sampler {
                ratio: options.sample,
                seen: AtomicU64::new(0),
            },
            jobs: target.jobs,
            index: target.index,
            queue: target.stats,
            max_queue: target.max_queue,
        }
    }

    /// Task `i` of `job` ran on POOL with `result`: if it is sampled,
    /// queue it on SHADOW with a copy of both, or count it skipped when
    /// SHADOW's queue is full.
    ///
    /// # Safety
    /// The spans of the job's arguments and of `result` must be alive (the
    /// task is not finished yet: its completion has not gone).
    pub unsafe fn offer(&self, job: &Work, i: usize, result: &Payload) {
        if self.sample.take() {
            // SAFETY: offer's caller keeps the arguments' and the result's
            // spans alive until this returns, as queue needs.
            unsafe { self.queue(job, i, result, None) };
        }
    }

    /// Whether the stream about to run is sampled: its chunks are then
    /// recorded, and `offer_stream` gets them.
    pub fn sample_stream(&self) -> bool {
        self.sample.take()
    }

    /// A sampled stream (`sample_stream`) ran on POOL with `result` and
    /// `recorded` crossing: queue it on SHADOW, its input the same, to
    /// compare the chunks it sends and its result.
    ///
    /// # Safety
    /// As offer.
    pub unsafe fn offer_stream(&self, job: &Work, result: &Payload, recorded: Recorded) {
        // SAFETY: offer_stream's caller keeps the arguments' and the
        // result's spans alive until this returns, as queue needs.
        unsafe { self.queue(job, 0, result, Some(recorded)) };
    }

    /// # Safety
    /// As offer.
    unsafe fn queue(&self, job: &Work, i: usize, result: &Payload, stream: Option<Recorded>) {
        let mut taken = self.queue.taken.load(Relaxed);
        if !self.queue.reserve(1, self.max_queue as u64, &mut taken) {
            PoolStats::add(&self.pair.counts.shadow_skipped);
            return;
        }
        // SAFETY: the spans of the job's arguments and of `result` are alive
        // (the contract: the task's completion has not gone); both are copied
        // here, before this returns.
        let (args, got) = unsafe {
            (
                Owned::copy(job.args.part(i), &job.args.spans),
                Owned::copy(&result.bytes, &result.spans),
            )
        };
        let (sent, received) = stream.map_or_else(Default::default, |r| (r.sent, r.received));
        let (args, expected) = Expected::task(args, got, result.failed, sent, self.pair.clone());
        let mut shadow = Work::shadowing(self.index, args, Box::new(expected));
        if job.stream.is_some() {
            if let Some(w) = Arc::get_mut(&mut shadow) {
                w.stream = Some(Stream::detached(received));
            }
        }
        if self.jobs.send(shadow).is_err() {
            // SHADOW's threads are gone: the worker is exiting.
            self.queue.unreserve(1);
            PoolStats::add(&self.pair.counts.shadow_skipped);
            return;
        }
        PoolStats::add(&self.queue.pushed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_exact() {
        for (ratio, n, taken) in [(1.0, 10, 10), (0.5, 10, 5), (0.25, 40, 10), (0.3, 100, 30)] {
            let s = Sampler {
                ratio,
                seen: AtomicU64::new(0),
            };
            let got = (0..n).filter(|_| s.take()).count();
            assert_eq!(got, taken, "ratio {ratio}");
        }
    }
}
