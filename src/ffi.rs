//! The C API the Lua shim (lua/resty/threadpool.lua) calls through the
//! LuaJIT FFI, for what needs no Lua stack (the task path is preload.rs).
//! Event-loop thread only. Return codes follow lua-resty-core, here and
//! in preload.rs: OK 0, ERROR -1, AGAIN -2, DECLINED -5, BAD_CONTEXT -101.

use crate::ngx::guard::no_unwind;
use crate::ngx::shim;
use crate::worker::with_worker;
use std::ffi::c_int;

pub const OK: c_int = 0;
pub const ERROR: c_int = -1;
pub const AGAIN: c_int = -2;
pub const DECLINED: c_int = -5;
pub const BAD_CONTEXT: c_int = -101;

/// The id of the pool `name` (0-based), -1 if no pool of that name has a
/// process handler. Read from the configuration, so it also answers before
/// the worker's threads exist (init_worker_by_lua runs first).
///
/// # Safety
/// `name` must point to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_pool_id(name: *const u8, len: usize) -> c_int {
    no_unwind("pool_id", -1, || {
        // SAFETY: the caller vouches for name/len.
        let name = unsafe { shim::bytes(name, len) };
        crate::conf::running_pools()
            .iter()
            .position(|p| p.name.as_bytes() == name)
            .map_or(-1, |id| id as c_int)
    })
}

/// This worker's counters of pool `pool` (see worker/stats.rs for the
/// order): writes at most `n` numbers to `out` and returns how many it
/// wrote, or -1 outside a worker or for an unknown pool.
///
/// # Safety
/// `out` must hold `n` writable numbers.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_stats(pool: c_int, out: *mut u64, n: usize) -> c_int {
    no_unwind("stats", -1, || {
        let Some(stats) = with_worker(|w| w.stats(pool as usize)).flatten() else {
            return -1;
        };
        let n = n.min(stats.len());
        // SAFETY: the caller vouches for out and n.
        unsafe { std::ptr::copy_nonoverlapping(stats.as_ptr(), out, n) };
        n as c_int
    })
}
