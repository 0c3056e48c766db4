//! The accept gate's state in shared memory (worker/gate.rs decides with
//! it): the count of paused workers and one slot per worker, which the
//! other workers and `thread_pool_status` read.

use crate::ngx::accept::now_ms;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The shared count of paused workers.
#[repr(C)]
#[derive(Default)]
pub struct GateShared {
    pub paused_workers: AtomicU64,
}

/// One worker's gate, in shared memory: for the other workers' decisions
/// and for `thread_pool_status`.
#[repr(C)]
#[derive(Default)]
pub struct GateSlot {
    /// 1 while this worker runs the gate.
    pub active: AtomicU64,
    pub paused: AtomicU64,
    pub pauses: AtomicU64,
    /// Milliseconds paused, over ended pauses.
    pub paused_ms: AtomicU64,
    /// nginx's monotonic clock (ms) when the current pause began.
    pub paused_since: AtomicU64,
    /// Tasks outstanding plus connections pending, at the last check.
    pub load: AtomicU64,
    /// Connections accepted on http listening sockets.
    pub accepted: AtomicU64,
}

impl GateSlot {
    /// Milliseconds paused so far, the current pause included.
    pub fn paused_ms_now(&self) -> u64 {
        let mut ms = self.paused_ms.load(Relaxed);
        if self.paused.load(Relaxed) != 0 {
            ms += now_ms().saturating_sub(self.paused_since.load(Relaxed));
        }
        ms
    }
}
