//! The C API the Lua shim (lua/resty/threadpool.lua) calls through the
//! LuaJIT FFI. Event-loop thread only. Return codes follow lua-resty-core:
//! OK 0, ERROR -1, AGAIN -2, DECLINED -5; errors are written to the
//! caller's buffer.

use crate::ngx::guard::no_unwind;
use crate::ngx::log;
use crate::ngx::sys;
use crate::worker::tasks::{RequestTasks, TaskId, KEEP};
use crate::worker::{with_worker, WorkerError};
use std::ffi::c_int;

/// Bumped when a signature below changes; the shim refuses other versions.
pub const API_VERSION: c_int = 3;

pub const OK: c_int = 0;
pub const ERROR: c_int = -1;
pub const AGAIN: c_int = -2;
pub const DECLINED: c_int = -5;
pub const BAD_CONTEXT: c_int = -101;

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
        let conf = unsafe { crate::conf::main_conf(sys::ngx_cycle) };
        conf.and_then(|c| c.pools.iter().position(|p| p.name.as_bytes() == name))
            .map_or(-1, |id| id as c_int)
    })
}

/// Queues a task with the encoded arguments `data` for the request `r` and
/// makes the current coroutine wait for it: AGAIN with `*task` set (the
/// caller must yield; it is resumed with `true` or `false, "timeout"`),
/// DECLINED when the queue is full, BAD_CONTEXT when the running handler
/// may not yield (nothing queued), ERROR with a message.
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
    timeout_ms: c_int,
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
        if !unsafe { crate::ngx::lua::may_yield(r) } {
            return BAD_CONTEXT;
        }
        // SAFETY: as above.
        let Some(owner) = (unsafe { request_tasks(r) }) else {
            // SAFETY: forwarded from the caller.
            return unsafe { set_err(err, errlen, "no memory") };
        };
        // SAFETY: the caller vouches for data/len.
        let args = unsafe { std::slice::from_raw_parts(data, len) };
        let rc = with_worker(|w| {
            // SAFETY: owner lives in r->pool and unlinks its records when
            // that pool is destroyed.
            let id = match unsafe { w.push(pool as usize, owner, args) } {
                Ok(id) => id,
                Err(WorkerError::QueueFull) => return DECLINED,
                // SAFETY: forwarded from the caller.
                Err(e) => return unsafe { set_err(err, errlen, &e.to_string()) },
            };
            // SAFETY: checked non-null above.
            unsafe { *task = id };
            let rc = match w.tasks.sema(id) {
                // SAFETY: r is the running handler's request; the semaphore
                // belongs to the task record, which outlives the wait.
                Some(sema) => unsafe { sema.wait(r, timeout_ms.max(1), err, errlen) },
                // SAFETY: forwarded from the caller.
                None => unsafe { set_err(err, errlen, "task has no semaphore") },
            };
            if rc == ERROR {
                // Not waiting after all: the task runs for no one.
                w.tasks.release(id);
            }
            rc
        });
        // SAFETY: forwarded from the caller.
        rc.unwrap_or_else(|| unsafe { set_err(err, errlen, "not in a worker process") })
    })
}

/// The result of a finished task, and the task's end: OK (values) or
/// DECLINED (the handler failed; the payload holds its error value), with
/// `*data`/`*len` pointing at the payload until the next call into the
/// module (the shim decodes it at once). ERROR if the task is not finished.
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
        with_worker(|w| {
            let Some((payload, failed)) = w.tasks.take_result(task) else {
                return ERROR;
            };
            log::debug(format_args!(
                "task {task:#x} resumed, {} bytes of results",
                payload.len()
            ));
            let old = std::mem::replace(&mut w.last_result, payload);
            w.tasks.recycle(old);
            // SAFETY: the caller vouches for data/len; last_result stays
            // put until the next result.
            unsafe {
                *data = w.last_result.as_ptr();
                *len = w.last_result.len();
            }
            if failed {
                DECLINED
            } else {
                OK
            }
        })
        .unwrap_or(ERROR)
    })
}

/// The shim is done with a large result (decoded): its buffer is freed now
/// rather than kept until the next result.
#[no_mangle]
pub extern "C" fn ngx_threadpool_result_done() {
    no_unwind("result_done", (), || {
        with_worker(|w| {
            if w.last_result.capacity() > KEEP {
                let buf = std::mem::take(&mut w.last_result);
                w.tasks.recycle(buf);
            }
        });
    })
}

/// Lets go of a task whose caller stopped waiting (timeout): a running one
/// is abandoned and its late result dropped; a finished one is freed.
#[no_mangle]
pub extern "C" fn ngx_threadpool_release(task: TaskId) {
    no_unwind("release", (), || {
        with_worker(|w| {
            log::debug(format_args!("task {task:#x} released by its caller"));
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
        let slot = (*r).ctx.add(crate::ngx::module::own_ctx_index());
        if !(*slot).is_null() {
            return Some((*slot).cast());
        }
        let list = crate::ngx::pool::adopt((*r).pool, RequestTasks::default())?;
        *slot = list.as_ptr().cast();
        Some(list.as_ptr())
    }
}
