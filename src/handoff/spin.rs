//! A poll before sleeping, adapted to how long the poller waits: four
//! times the recent wait when that is under the poll's bound, else none.
//! Work that comes back to back is caught without a wake-up; work that
//! comes seldom costs no polling at all (a poll that finds nothing burns a
//! core someone else may need). Used by pool threads waiting for jobs and
//! by the event loop waiting for completions.

use std::time::Duration;

pub struct Spin {
    /// The longest poll.
    bound: Duration,
    /// Moving average of the waits, in nanoseconds (weight 1/8).
    wait_ns: u64,
}

impl Spin {
    /// A poll of at most `bound`, starting at a quarter of the bound's
    /// wait (a full poll).
    pub const fn new(bound: Duration) -> Spin {
        Spin {
            bound,
            wait_ns: bound.as_nanos() as u64 / 4,
        }
    }

    /// How long to poll now.
    pub fn budget(&self) -> Duration {
        let bound = self.bound.as_nanos() as u64;
        if self.wait_ns >= bound {
            return Duration::ZERO;
        }
        Duration::from_nanos((4 * self.wait_ns).min(bound))
    }

    /// A wait that ended after `waited`, polled or slept.
    pub fn observe(&mut self, waited: Duration) {
        let w = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_ns = self.wait_ns - self.wait_ns / 8 + w / 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_follows_the_waits() {
        let bound = Duration::from_micros(50);
        let mut spin = Spin::new(bound);
        assert!(spin.budget() > Duration::ZERO);
        // work that comes seldom: no polling
        for _ in 0..40 {
            spin.observe(Duration::from_millis(2));
        }
        assert_eq!(spin.budget(), Duration::ZERO);
        // back to back again: polling comes back, within the bound
        for _ in 0..60 {
            spin.observe(Duration::from_micros(5));
        }
        let b = spin.budget();
        assert!(
            b > Duration::ZERO && b <= Duration::from_micros(40),
            "{b:?}"
        );
        for _ in 0..60 {
            spin.observe(Duration::from_micros(20));
        }
        assert_eq!(spin.budget(), bound);
    }
}
