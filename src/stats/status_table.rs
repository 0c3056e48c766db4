//! The shared memory zone of the module's own that holds every worker's
//! counters and accept gate, for `thread_pool_status` (api/status.rs) and
//! the other workers' gates.

use super::counters::PoolStats;
use super::gate::{GateShared, GateSlot};
use crate::ngx::http;
use crate::ngx::shm::Zone;
use crate::ngx::sys;
use std::mem::size_of;

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
