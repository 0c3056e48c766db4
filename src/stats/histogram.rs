//! Timings kept as histograms: the pool's, shared by its threads and read
//! by `stats()` and `thread_pool_status`, and a pool thread's own, added to
//! the pool's at once (tally.rs).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the histograms' buckets, in microseconds: 10 µs to 10 s
/// by powers of ten; the last bucket holds everything above.
pub const BUCKET_BOUNDS_US: [u64; 7] = [10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];
pub const BUCKETS: usize = BUCKET_BOUNDS_US.len() + 1;

/// A number as read now.
pub enum Reading {
    Number(u64),
    /// Observations per bucket (bounds BUCKET_BOUNDS_US, not cumulative)
    /// and their sum, in µs.
    Histogram {
        buckets: [u64; BUCKETS],
        sum_us: u64,
    },
}

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

    pub fn read(&self) -> Reading {
        Reading::Histogram {
            buckets: self.buckets.each_ref().map(|b| b.load(Relaxed)),
            sum_us: self.sum_us.load(Relaxed),
        }
    }

    pub fn reset(&self) {
        for c in self.buckets.iter().chain([&self.sum_us]) {
            c.store(0, Relaxed);
        }
    }
}

/// A histogram of one pool thread's, added to the pool's at once.
#[derive(Default)]
pub(super) struct LocalHistogram {
    buckets: [u64; BUCKETS],
    pub(super) sum_us: u64,
}

impl LocalHistogram {
    pub(super) fn observe(&mut self, d: Duration) {
        let (i, us) = bucket(d);
        self.buckets[i] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub(super) fn add_to(&mut self, h: &Histogram) {
        for (local, shared) in self.buckets.iter_mut().zip(&h.buckets) {
            move_count(local, shared);
        }
        move_count(&mut self.sum_us, &h.sum_us);
    }
}

/// Adds a local count to the shared one and sets it to 0; a count of 0
/// leaves the shared cache line alone.
pub(super) fn move_count(local: &mut u64, shared: &AtomicU64) {
    if *local != 0 {
        shared.fetch_add(std::mem::take(local), Relaxed);
    }
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
        let Reading::Histogram { buckets, sum_us } = h.read() else {
            unreachable!()
        };
        assert_eq!(buckets, [1, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(sum_us, 60_000_021);
        h.reset();
        assert!(matches!(h.read(), Reading::Histogram { sum_us: 0, .. }));
    }
}
