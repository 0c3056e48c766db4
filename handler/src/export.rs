//! The bodies of the four exports that [`export!`](crate::export)
//! generates: the C ABI's edge, where panics are caught and results and
//! errors become payloads and return codes. Nothing unwinds past these
//! functions.

use crate::ffi::{self, ngx_tp_init_t, ngx_tp_out_t, ngx_tp_task_t, NGX_TP_ERROR, NGX_TP_OK};
use crate::logger::{self, Scope, Sink};
use crate::results::{error_payload, IntoResults};
use crate::{Init, Task};
use std::any::Any;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A thread's state and where its log lines go.
struct Slot<S> {
    state: S,
    sink: Sink,
}

/// A payload being built, then written to the module's `out` at once: a
/// failed write appends nothing (the header's contract), so `out` is
/// still empty for the error that follows.
pub struct Reply {
    buf: Vec<u8>,
    status: c_int,
}

/// Spare capacity a thread keeps between tasks; a larger buffer (a large
/// result) is given back.
const KEEP: usize = 1 << 20;

thread_local! {
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

impl Reply {
    fn new() -> Reply {
        Reply {
            buf: SPARE.take(),
            status: NGX_TP_OK,
        }
    }

    /// Results, or the error the caller gets as `nil, e`.
    pub fn set<R: IntoResults, E: Display>(&mut self, r: Result<R, E>) {
        self.buf.clear();
        match r {
            Ok(values) => {
                if let Err(e) = values.write_results(&mut self.buf) {
                    self.fail(e);
                }
            }
            Err(e) => self.fail(e),
        }
    }

    fn fail(&mut self, e: impl Display) {
        error_payload(e, &mut self.buf);
        self.status = NGX_TP_ERROR;
    }

    /// Writes the payload to `out`: the return code.
    ///
    /// # Safety
    /// `out` must be the module's, empty.
    unsafe fn send(mut self, out: *mut ngx_tp_out_t) -> c_int {
        // SAFETY: out is the module's writer, empty (the contract), as write
        // needs.
        if !unsafe { write(out, &self.buf) } {
            self.fail("results too large (or out of memory)");
            // SAFETY: out is the module's writer, still empty: the failed
            // write appended nothing. If this one fails too the module gets an
            // empty error payload.
            unsafe { write(out, &self.buf) };
        }
        let status = self.status;
        self.buf.clear();
        self.buf.shrink_to(KEEP);
        SPARE.set(self.buf);
        status
    }
}

/// Appends `bytes` to `out`.
///
/// # Safety
/// `out` must be the module's.
unsafe fn write(out: *mut ngx_tp_out_t, bytes: &[u8]) -> bool {
    // SAFETY: out is the module's, and its write takes it.
    unsafe { ((*out).write)(out, bytes.as_ptr(), bytes.len()) == 0 }
}

/// "panic: message", as the caller gets it.
fn panic_text(panic: Box<dyn Any + Send>) -> String {
    let msg = match panic.downcast::<String>() {
        Ok(s) => *s,
        Err(panic) => match panic.downcast::<&'static str>() {
            Ok(s) => s.to_string(),
            Err(_) => "(a value that is not a string)".to_string(),
        },
    };
    format!("panic: {msg}")
}

/// `ngx_threadpool_init`: builds the state with `f`.
///
/// # Safety
/// The header's contract: `init` valid for the call, `state` and `err` the
/// module's.
pub unsafe fn init<S, E: Display>(
    init: *const ngx_tp_init_t,
    state: *mut *mut c_void,
    err: *mut ngx_tp_out_t,
    f: impl FnOnce(&Init) -> Result<S, E>,
) -> c_int {
    logger::install();
    // SAFETY: the header's contract: init is valid for the call.
    let raw = unsafe { &*init };
    let sink = Sink {
        f: raw.log_fn,
        log: raw.log,
    };
    let _scope = Scope::enter(sink);
    let mut reply = Reply::new();
    let built = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the pool name and CONFIG live for the call.
        let init = unsafe { Init::new(ffi::bytes(raw.pool), raw.config, raw.thread) };
        f(&init)
    }));
    match built {
        Ok(Ok(s)) => {
            // SAFETY: state is the module's, for this thread's state.
            unsafe { *state = Box::into_raw(Box::new(Slot { state: s, sink })).cast() };
        }
        Ok(Err(e)) => reply.fail(e),
        Err(panic) => reply.fail(panic_text(panic)),
    }
    // SAFETY: err is the module's, empty.
    unsafe { reply.send(err) }
}

/// `ngx_threadpool_process`: runs `f` on the state that `init` (whose
/// state type it names) built.
///
/// # Safety
/// The header's contract: `state` from `ngx_threadpool_init` with the same
/// `init`, on its own thread; `task` and its spans alive for the call;
/// `out` the module's, empty.
pub unsafe fn process<S, E, I, F>(
    state: *mut c_void,
    task: *const ngx_tp_task_t,
    out: *mut ngx_tp_out_t,
    _init: I,
    f: F,
) -> c_int
where
    I: FnOnce(&Init) -> Result<S, E>,
    F: for<'a, 't> FnOnce(&'a mut S, &'a Task<'t>, &'a mut Reply),
{
    // SAFETY: state came from init with this S, and only this thread
    // uses it.
    let slot = unsafe { &mut *state.cast::<Slot<S>>() };
    let _scope = Scope::enter(slot.sink);
    let mut reply = Reply::new();
    // SAFETY: the task and its spans are alive for the call, which the
    // Task does not outlive.
    match unsafe { Task::new(&*task) } {
        Ok(task) => {
            let ran = catch_unwind(AssertUnwindSafe(|| f(&mut slot.state, &task, &mut reply)));
            if let Err(panic) = ran {
                reply.fail(panic_text(panic));
            }
        }
        Err(e) => reply.fail(e),
    }
    // SAFETY: out is the module's, empty.
    unsafe { reply.send(out) }
}

/// `ngx_threadpool_free`: drops the state; a panic in its `Drop` is logged.
///
/// # Safety
/// The header's contract: `state` from `ngx_threadpool_init` with the same
/// `init`, not used after.
pub unsafe fn free<S, E, I>(state: *mut c_void, _init: I)
where
    I: FnOnce(&Init) -> Result<S, E>,
{
    // SAFETY: state came from init's Box with this S; the module frees
    // it once.
    let slot = unsafe { Box::from_raw(state.cast::<Slot<S>>()) };
    let sink = slot.sink;
    let _scope = Scope::enter(sink);
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| drop(slot))) {
        sink.line(
            ffi::NGX_TP_LOG_ERR,
            &format!("freeing the state: {}", panic_text(panic)),
        );
    }
}
