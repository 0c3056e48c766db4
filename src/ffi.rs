//! The C API the Lua shim (lua/resty/threadpool.lua) calls through the
//! LuaJIT FFI. Event-loop thread only. Return codes follow lua-resty-core:
//! OK 0, ERROR -1, AGAIN -2, DECLINED -5; errors are written to the
//! caller's buffer.

use crate::ngx::guard::no_unwind;
use crate::ngx::sys;
use crate::pool::{with_worker, PushError};
use crate::task::{RequestTasks, TaskId};
use std::ffi::c_int;

/// Bumped when a signature below changes; the shim refuses other versions.
pub const API_VERSION: c_int = 1;

pub const OK: c_int = 0;
pub const ERROR: c_int = -1;
pub const AGAIN: c_int = -2;
pub const DECLINED: c_int = -5;

/// Writes `msg` into the caller's error buffer (truncating).
///
/// # Safety
/// `err` must hold `*errlen` writable bytes.
unsafe fn set_err(err: *mut u8, errlen: *mut usize, msg: &str) -> c_int {
    if !err.is_null() && !errlen.is_null() {
        // SAFETY: the caller vouches for err and errlen.
        unsafe {
            let n = msg.len().min(*errlen);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), err, n);
            *errlen = n;
        }
    }
    ERROR
}

#[no_mangle]
pub extern "C" fn ngx_threadpool_api_version() -> c_int {
    API_VERSION
}

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
        let name = unsafe { std::slice::from_raw_parts(name, len) };
        // SAFETY: ngx_cycle is the running cycle, configured.
        let conf = unsafe { crate::main_conf(sys::ngx_cycle) };
        conf.and_then(|c| c.pools.iter().position(|p| p.name.as_bytes() == name))
            .map_or(-1, |id| id as c_int)
    })
}

/// Queues a task with the encoded arguments `data` for the request `r`.
/// OK with `*task` set, DECLINED when the queue is full, ERROR otherwise.
///
/// # Safety
/// `r` must be the request of the running Lua handler, `data` `len`
/// readable bytes, `err` `*errlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_push(
    r: *mut sys::ngx_http_request_t,
    pool: c_int,
    data: *const u8,
    len: usize,
    task: *mut TaskId,
    err: *mut u8,
    errlen: *mut usize,
) -> c_int {
    no_unwind("push", ERROR, || {
        if r.is_null() || task.is_null() {
            // SAFETY: forwarded from the caller.
            return unsafe { set_err(err, errlen, "no request") };
        }
        // SAFETY: r is the live request of the running handler.
        let Some(owner) = (unsafe { request_tasks(r) }) else {
            // SAFETY: forwarded from the caller.
            return unsafe { set_err(err, errlen, "no memory") };
        };
        // SAFETY: the caller vouches for data/len.
        let args = unsafe { std::slice::from_raw_parts(data, len) };
        // SAFETY: owner lives in r->pool and unlinks its records when that
        // pool is destroyed.
        let pushed = with_worker(|w| unsafe { w.push(pool as usize, owner, args) });
        match pushed {
            Some(Ok(id)) => {
                // SAFETY: checked non-null above.
                unsafe { *task = id };
                OK
            }
            Some(Err(PushError::Full)) => DECLINED,
            // SAFETY: forwarded from the caller.
            Some(Err(PushError::Other(msg))) => unsafe { set_err(err, errlen, &msg) },
            // SAFETY: forwarded from the caller.
            None => unsafe { set_err(err, errlen, "not in a worker process") },
        }
    })
}

/// Waits for `task` in the current coroutine of `r`: OK when the result is
/// already there, AGAIN when the caller must yield (it is resumed with
/// `true` or `false, "timeout"`), ERROR with a message.
///
/// # Safety
/// As for push.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_wait(
    r: *mut sys::ngx_http_request_t,
    task: TaskId,
    timeout_ms: c_int,
    err: *mut u8,
    errlen: *mut usize,
) -> c_int {
    no_unwind("wait", ERROR, || {
        let rc = with_worker(|w| match w.tasks.sema(task) {
            // SAFETY: forwarded from the caller; the semaphore belongs to
            // the task record, which outlives the wait.
            Some(sema) => unsafe { sema.wait(r, timeout_ms.max(1), err, errlen) },
            // SAFETY: forwarded from the caller.
            None => unsafe { set_err(err, errlen, "bad task") },
        });
        // SAFETY: forwarded from the caller.
        rc.unwrap_or_else(|| unsafe { set_err(err, errlen, "not in a worker process") })
    })
}

/// The result of a finished task: OK (values) or DECLINED (the handler
/// failed; the payload holds the error value), with `*data`/`*len` pointing
/// at the payload until the task is released. ERROR if not finished.
///
/// # Safety
/// `data` and `len` must be writable.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_result(
    task: TaskId,
    data: *mut *const u8,
    len: *mut usize,
) -> c_int {
    no_unwind("result", ERROR, || {
        with_worker(|w| match w.tasks.result(task) {
            Some((payload, failed)) => {
                // SAFETY: the caller vouches for data/len; the payload stays
                // put until release.
                unsafe {
                    *data = payload.as_ptr();
                    *len = payload.len();
                }
                if failed {
                    DECLINED
                } else {
                    OK
                }
            }
            None => ERROR,
        })
        .unwrap_or(ERROR)
    })
}

/// Lets go of a task: frees a finished one; a running one is abandoned and
/// its late result dropped.
#[no_mangle]
pub extern "C" fn ngx_threadpool_release(task: TaskId) {
    no_unwind("release", (), || {
        with_worker(|w| {
            if let Some(buf) = w.tasks.release(task) {
                w.tasks.recycle(buf);
            }
        });
    })
}

/// The request's task list, created with a pool cleanup on first use.
///
/// # Safety
/// `r` must be a live request, on the event-loop thread.
unsafe fn request_tasks(r: *mut sys::ngx_http_request_t) -> Option<*mut RequestTasks> {
    // SAFETY: r->ctx has a slot per http module; ours holds the list
    // allocated in r->pool (reset by an internal redirect, which only means
    // a second list: the first is still released with the pool).
    unsafe {
        let slot = (*r).ctx.add(crate::ngx_threadpool_module.ctx_index);
        if !(*slot).is_null() {
            return Some((*slot).cast());
        }
        let list = crate::ngx::pool::adopt((*r).pool, RequestTasks::default())?;
        *slot = list.as_ptr().cast();
        Some(list.as_ptr())
    }
}
