//! The shared memory zone of the module's own that holds every worker's
//! counters, accept gate and update versions, for `thread_pool_status`
//! (api/status.rs), the other workers' gates and the callers of updates.

use super::counters::PoolStats;
use super::gate::{GateShared, GateSlot};
use super::versions::{ThreadVersion, UpdateError};
use crate::ngx::http;
use crate::ngx::shm::Zone;
use crate::ngx::sys;
use std::mem::size_of;

/// Every worker's PoolStats in a shared memory zone of the module's own,
/// for `thread_pool_status` (api/status.rs): one PoolStats per worker and pool,
/// worker-major; then the accept gate's shared state and one GateSlot per
/// worker (gate.rs); then, worker-major, one UpdateError per pool and one
/// ThreadVersion per pool thread (versions.rs).
pub struct StatusTable {
    zone: Zone,
    pub workers: usize,
    pools: usize,
    /// The ThreadVersions of each pool in a worker's row, the pools'
    /// threads as declared when the table was sized.
    slots: Vec<usize>,
}

impl StatusTable {
    /// Adds the zone for pools of `slots` threads each (a pool declared
    /// with nginx's `thread_pool` after the http block counts as
    /// UNKNOWN_THREADS) and the configured worker count (or, if
    /// worker_processes comes later in the file, the CPU count).
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed (postconfiguration).
    pub unsafe fn add(cf: *mut sys::ngx_conf_t, slots: Vec<usize>) -> Option<StatusTable> {
        let pools = slots.len();
        // SAFETY: cf is the configuration being parsed (the contract), whose
        // core conf configured_workers reads.
        let workers = unsafe { http::configured_workers(cf) }.unwrap_or_else(http::cpus);
        // SAFETY: cf is the configuration being parsed, in postconfiguration
        // (the contract), where a shared zone may be added.
        let size = table_size(workers, pools) + workers * versions_size(&slots);
        // SAFETY: cf is the configuration being parsed, in
        // postconfiguration (the contract), where a shared zone may be added.
        let zone = unsafe { Zone::add(cf, b"ngx_threadpool_status", size) }?;
        Some(StatusTable {
            zone,
            workers,
            pools,
            slots,
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

impl StatusTable {
    /// Worker `worker`'s update error and thread versions of pool `pool`
    /// (None past the workers or pools the table was sized for).
    pub fn versions(
        &self,
        worker: usize,
        pool: usize,
    ) -> Option<(&'static UpdateError, &'static [ThreadVersion])> {
        if worker >= self.workers || pool >= self.pools {
            return None;
        }
        let row = table_size(self.workers, self.pools) + worker * versions_size(&self.slots);
        let errors = row;
        let before: usize = self.slots[..pool].iter().sum();
        let threads =
            row + self.pools * size_of::<UpdateError>() + before * size_of::<ThreadVersion>();
        // SAFETY: add left room for a row of versions_size per worker after
        // the gate: the pools' UpdateErrors, then their ThreadVersions, at
        // 8-byte aligned offsets; all are atomics, valid when zero.
        unsafe {
            let error = self
                .zone
                .as_slice::<UpdateError>(errors, self.pools)?
                .get(pool)?;
            let slots = self.zone.as_slice(threads, self.slots[pool])?;
            Some((error, slots))
        }
    }
}

/// The threads a pool declared with `thread_pool` after the http block
/// (unknown when the table is sized) are given slots for.
pub const UNKNOWN_THREADS: usize = 64;

/// A worker's row of update versions.
fn versions_size(slots: &[usize]) -> usize {
    slots.len() * size_of::<UpdateError>()
        + slots.iter().sum::<usize>() * size_of::<ThreadVersion>()
}

fn table_size(workers: usize, pools: usize) -> usize {
    workers * pools * size_of::<PoolStats>()
        + size_of::<GateShared>()
        + workers * size_of::<GateSlot>()
}
