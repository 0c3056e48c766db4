//! Waiting for what a test cannot order: a condition that holds in time,
//! a pool gone idle.

use super::server::Nginx;
use std::time::{Duration, Instant};

/// The tasks of a pool skipped so far (their caller gave up before a
/// thread took them), once none is queued or running: `path` answers
/// "QUEUED_OR_RUNNING SKIPPED" (its stats()' busy + queued, cancelled).
pub fn skipped_once_idle(n: &Nginx, path: &str) -> u64 {
    let mut skipped = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            skipped = match n.get(path).text().split_once(' ') {
                Some(("0", s)) => s.parse().ok(),
                _ => None,
            };
            skipped.is_some()
        }),
        "{path}: the pool never went idle"
    );
    skipped.unwrap()
}

/// Waits until `f` holds, polling, for at most `limit`.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
