//! The C API the Lua shim (lua/resty/threadpool.lua) calls through the
//! LuaJIT FFI. Event-loop thread only. Return codes follow lua-resty-core:
//! OK 0, ERROR -1, AGAIN -2, DECLINED -5; errors are written to the
//! caller's buffer.

use crate::codec::Span;
use crate::conf::PoolConf;
use crate::ngx::guard::no_unwind;
use crate::ngx::log;
use crate::ngx::shim::{self, ErrOut, Out, Request};
use crate::ngx::sys;
use crate::worker::tasks::{Release, RequestTasks, TaskId, KEEP};
use crate::worker::{gate, with_worker, Args, Worker, WorkerError};
use std::ffi::c_int;

/// Bumped when a signature below changes; the shim refuses other versions.
pub const API_VERSION: c_int = 7;

pub const OK: c_int = 0;
pub const ERROR: c_int = -1;
pub const AGAIN: c_int = -2;
pub const DECLINED: c_int = -5;
pub const BAD_CONTEXT: c_int = -101;

/// Writes `msg` to the caller's error buffer: the ERROR return.
fn fail(err: &ErrOut, msg: &str) -> c_int {
    err.set(msg);
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
        let name = unsafe { shim::bytes(name, len) };
        configured_pools()
            .iter()
            .position(|p| p.name.as_bytes() == name)
            .map_or(-1, |id| id as c_int)
    })
}

/// The smallest string pool `pool` borrows rather than copies
/// (`thread_pool_zero_copy`), 0 when it copies every string, -1 for no
/// such pool. Read from the configuration, as pool_id.
#[no_mangle]
pub extern "C" fn ngx_threadpool_zero_copy(pool: c_int) -> i64 {
    no_unwind("zero_copy", -1, || {
        let pool = usize::try_from(pool).ok();
        match pool.and_then(|i| configured_pools().get(i)) {
            Some(p) => p.zero_copy.map_or(0, |n| n as i64),
            None => -1,
        }
    })
}

/// The pools of the running configuration (none without an http block).
fn configured_pools() -> &'static [PoolConf] {
    // SAFETY: ngx_cycle is the running, configured cycle, whose main conf
    // lives as long as the process uses this configuration.
    unsafe { crate::conf::main_conf(sys::ngx_cycle) }.map_or(&[], |c| &c.pools)
}

/// Queues a task with the encoded arguments `data` for the request `r` and
/// makes the current coroutine wait for it: AGAIN with `*task` set (the
/// caller must yield; it is resumed with `true` or `false, "timeout"`),
/// DECLINED when the queue is full, BAD_CONTEXT when the running handler
/// may not yield (nothing queued), ERROR with a message. The payload's
/// borrowed strings are `spans[0..nspans]`. Whenever `*task` is set, the
/// task was queued, even if ERROR follows.
///
/// # Safety
/// `r` must be the request of the running Lua handler, `data` `len`
/// readable bytes, `spans` `nspans` readable spans whose bytes the caller
/// keeps alive until it takes the result or `ngx_threadpool_reaped` names
/// the task, `err` `*errlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_push(
    r: *mut sys::ngx_http_request_t,
    pool: c_int,
    data: *const u8,
    len: usize,
    spans: *const Span,
    nspans: usize,
    timeout_ms: c_int,
    task: *mut TaskId,
    err: *mut u8,
    errlen: *mut usize,
) -> c_int {
    no_unwind("push", ERROR, || {
        // SAFETY: the caller vouches for each (see above).
        let (r, args, task, err) = unsafe {
            (
                Request::from_raw(r),
                Args {
                    bytes: shim::bytes(data, len),
                    spans: shim::items(spans, nspans),
                },
                Out::new(task),
                ErrOut::new(err, errlen),
            )
        };
        let (Some(r), Some(task)) = (r, task) else {
            return fail(&err, "no request");
        };
        queue_and_wait(&r, timeout_ms, &err, |w, owner| {
            // SAFETY: owner lives in r->pool and unlinks its records when
            // that pool is destroyed.
            let id = unsafe { w.push(pool as usize, owner, args) }?;
            task.set(id);
            Ok(Queued::One(id))
        })
    })
}

/// Queues `n` tasks, the encoded arguments of task i being the next
/// `lens[i]` bytes of `data` borrowing the next `nspans[i]` of `spans`
/// (`nspans` null: none borrow), all or none, and makes the current
/// coroutine wait until all of them are done: AGAIN with `ids[0..n]` set
/// (the caller must yield, then take each result), otherwise as push.
///
/// # Safety
/// As push; `lens` must hold `n` readable sizes adding up to `len`,
/// `nspans` null or `n` counts adding up to the spans at `spans`, `ids`
/// `n` writable handles.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_push_batch(
    r: *mut sys::ngx_http_request_t,
    pool: c_int,
    data: *const u8,
    len: usize,
    lens: *const usize,
    n: usize,
    spans: *const Span,
    nspans: *const usize,
    timeout_ms: c_int,
    ids: *mut TaskId,
    err: *mut u8,
    errlen: *mut usize,
) -> c_int {
    no_unwind("push_batch", ERROR, || {
        // SAFETY: the caller vouches for each (see above).
        let (r, data, lens, counts, ids, err) = unsafe {
            (
                Request::from_raw(r),
                shim::bytes(data, len),
                shim::items(lens, n),
                shim::items(nspans, n),
                shim::items_mut(ids, n),
                ErrOut::new(err, errlen),
            )
        };
        let (Some(r), Some(ids)) = (r, ids) else {
            return fail(&err, "no request");
        };
        if n == 0 || lens.iter().sum::<usize>() != data.len() {
            return fail(&err, "bad batch");
        }
        let total_spans = counts.iter().sum::<usize>();
        // SAFETY: the caller vouches for spans and their count.
        let spans = unsafe { shim::items(spans, total_spans) };
        if spans.len() != total_spans {
            return fail(&err, "bad batch");
        }
        let (mut rest, mut rest_spans) = (data, spans);
        let payloads = lens.iter().enumerate().map(|(i, &l)| {
            let (bytes, more) = rest.split_at(l);
            let (spans, more_spans) = rest_spans.split_at(counts.get(i).copied().unwrap_or(0));
            (rest, rest_spans) = (more, more_spans);
            Args { bytes, spans }
        });
        queue_and_wait(&r, timeout_ms, &err, |w, owner| {
            // SAFETY: as in push.
            let queued = unsafe { w.push_batch(pool as usize, owner, payloads) }?;
            ids.copy_from_slice(&queued);
            Ok(Queued::Batch(queued))
        })
    })
}

/// The tasks a push queued; the first one's semaphore is the one to wait
/// on.
enum Queued {
    One(TaskId),
    Batch(Vec<TaskId>),
}

impl Queued {
    fn ids(&self) -> &[TaskId] {
        match self {
            Queued::One(id) => std::slice::from_ref(id),
            Queued::Batch(ids) => ids,
        }
    }
}

/// What push and push_batch share: `queue` queues the tasks of `r`, then
/// the coroutine waits.
fn queue_and_wait(
    r: &Request,
    timeout_ms: c_int,
    err: &ErrOut,
    queue: impl FnOnce(&mut Worker, *mut RequestTasks) -> Result<Queued, WorkerError>,
) -> c_int {
    if !r.may_yield() {
        return BAD_CONTEXT;
    }
    // SAFETY: this module keeps only its RequestTasks in the slot.
    let Some(owner) = (unsafe { r.module_ctx::<RequestTasks>() }) else {
        return fail(err, "no memory");
    };
    let rc = with_worker(|w| {
        let queued = match queue(w, owner.as_ptr()) {
            Ok(q) => q,
            Err(WorkerError::QueueFull) => return DECLINED,
            Err(e) => return fail(err, &e.to_string()),
        };
        gate::pushed(r.connection_number());
        // The semaphore belongs to the task record, which outlives the
        // wait.
        let ids = queued.ids();
        let rc = match w.tasks.sema(ids[0]) {
            Some(sema) => shim::wait(sema, r, timeout_ms.max(1), err),
            None => fail(err, "task has no semaphore"),
        };
        if rc == ERROR {
            // Not waiting after all: the tasks run for no one.
            for &id in ids {
                w.tasks.release(id, Release::NotWaiting);
            }
        }
        rc
    });
    rc.unwrap_or_else(|| fail(err, "not in a worker process"))
}

/// The result of a finished task, and the task's end: OK (values) or
/// DECLINED (the handler failed; the payload holds its error value), with
/// `*data`/`*len` pointing at the payload and `*spans`/`*nspans` at the
/// strings it borrows, all valid until the next call into the module (the
/// shim decodes it at once). ERROR if the task is not finished.
///
/// # Safety
/// `data`, `len`, `spans` and `nspans` must be writable.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_result(
    task: TaskId,
    data: *mut *const u8,
    len: *mut usize,
    spans: *mut *const Span,
    nspans: *mut usize,
) -> c_int {
    no_unwind("result", ERROR, || {
        // SAFETY: the caller vouches for each.
        let outs = unsafe {
            (
                Out::new(data),
                Out::new(len),
                Out::new(spans),
                Out::new(nspans),
            )
        };
        let (Some(data), Some(len), Some(spans), Some(nspans)) = outs else {
            return ERROR;
        };
        with_worker(|w| {
            let Some((payload, failed)) = w.tasks.take_result(task) else {
                return ERROR;
            };
            log::debug(format_args!(
                "task {task:#x} resumed, {} bytes of results, borrowed {}",
                payload.bytes.len(),
                payload.spans.len()
            ));
            let old = std::mem::replace(&mut w.last_result, payload);
            w.tasks.recycle(old);
            // last_result stays put (and pinned) until the next result
            data.set(w.last_result.bytes.as_ptr());
            len.set(w.last_result.bytes.len());
            spans.set(w.last_result.spans.as_ptr());
            nspans.set(w.last_result.spans.len());
            if failed {
                DECLINED
            } else {
                OK
            }
        })
        .unwrap_or(ERROR)
    })
}

/// The shim is done with a large result (decoded): its buffer is freed, and
/// the strings it borrows unpinned, now rather than at the next result.
#[no_mangle]
pub extern "C" fn ngx_threadpool_result_done() {
    no_unwind("result_done", (), || {
        with_worker(|w| {
            if w.last_result.bytes.capacity() > KEEP || w.last_result.pinned.is_some() {
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
            if let Some(buf) = w.tasks.release(task, Release::Timeout) {
                w.tasks.recycle(buf);
            }
        });
    })
}

/// Moves into `ids` at most `n` tasks whose borrowed arguments the shim
/// may let go of now: tasks that ended without their caller taking the
/// result (timeout, request gone). Returns how many.
///
/// # Safety
/// `ids` must hold `n` writable handles.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_reaped(ids: *mut TaskId, n: usize) -> usize {
    no_unwind("reaped", 0, || {
        // SAFETY: the caller vouches for ids and n.
        let Some(ids) = (unsafe { shim::items_mut(ids, n) }) else {
            return 0;
        };
        with_worker(|w| w.tasks.take_reaped(ids)).unwrap_or(0)
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

/// Queues a task whose result nobody takes (post_task): OK, DECLINED when
/// the queue is full, ERROR with a message. Needs no request and never
/// waits, so any phase may call it.
///
/// # Safety
/// `data` must be `len` readable bytes, `err` `*errlen` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ngx_threadpool_post(
    pool: c_int,
    data: *const u8,
    len: usize,
    err: *mut u8,
    errlen: *mut usize,
) -> c_int {
    no_unwind("post", ERROR, || {
        // SAFETY: the caller vouches for each.
        let (args, err) = unsafe { (shim::bytes(data, len), ErrOut::new(err, errlen)) };
        match with_worker(|w| w.post(pool as usize, args)) {
            Some(Ok(())) => OK,
            Some(Err(WorkerError::QueueFull)) => DECLINED,
            Some(Err(e)) => fail(&err, &e.to_string()),
            None => fail(&err, "not in a worker process with running pools"),
        }
    })
}
