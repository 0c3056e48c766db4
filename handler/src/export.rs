//! The bodies of the five exports that [`export!`](crate::export)
//! generates for a [`Handler`]: the C ABI's edge, where panics are caught
//! and results and errors become payloads and return codes. Nothing
//! unwinds past these functions.

use crate::ffi::{self, ngx_tp_init_t, ngx_tp_out_t, ngx_tp_task_t, ngx_tp_update_t};
use crate::logger::{self, Scope, Sink};
use crate::results::{error_payload, IntoResults};
use crate::{Handler, Init, Task, Update};
use ngx_threadpool_wire::{level, panicked, status};
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
struct Reply {
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
            status: status::OK,
        }
    }

    /// Results, or the error the caller gets as `nil, e`.
    fn set<R: IntoResults, E: Display>(&mut self, r: Result<R, E>) {
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
        self.status = status::ERROR;
    }

    /// Writes the payload to `out`: the return code.
    ///
    /// # Safety
    /// `out` must be the module's, empty.
    unsafe fn send(mut self, out: *mut ngx_tp_out_t) -> c_int {
        // SAFETY: the caller's contract: out is the module's writer.
        if !unsafe { write(out, &self.buf) } {
            self.fail("results too large (or out of memory)");
            // SAFETY: the same writer, to which the failed write appended
            // nothing. If this one fails too the module gets an empty
            // error payload.
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
    panicked(msg)
}

/// `ngx_threadpool_init`: builds the state with `H::init`.
///
/// # Safety
/// The header's contract: `init` valid for the call, `state` and `err` the
/// module's.
pub unsafe fn init<H: Handler>(
    init: *const ngx_tp_init_t,
    state: *mut *mut c_void,
    err: *mut ngx_tp_out_t,
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
        // SAFETY: the header's contract: the pool name and CONFIG live for
        // the call, which the Init does not outlive.
        let init = unsafe { Init::new(ffi::bytes(raw.pool), raw.config, raw.thread) };
        H::init(&init)
    }));
    match built {
        Ok(Ok(handler)) => {
            let slot = Box::new(Slot {
                state: handler,
                sink,
            });
            // SAFETY: the header's contract: state is the module's, where
            // this thread's state goes.
            unsafe { *state = Box::into_raw(slot).cast() };
        }
        Ok(Err(e)) => reply.fail(e),
        Err(panic) => reply.fail(panic_text(panic)),
    }
    // SAFETY: the header's contract: err is the module's, empty.
    unsafe { reply.send(err) }
}

/// `ngx_threadpool_process`: runs `H::process` on the state that
/// [`init`]`::<H>` built.
///
/// # Safety
/// The header's contract: `state` from `ngx_threadpool_init`, that is
/// `init::<H>`, on its own thread; `task` and its spans alive for the
/// call; `out` the module's, empty.
pub unsafe fn process<H: Handler>(
    state: *mut c_void,
    task: *const ngx_tp_task_t,
    out: *mut ngx_tp_out_t,
) -> c_int {
    // SAFETY: the caller's contract: state is a Slot<H> from init::<H>,
    // used by this thread only, so not otherwise borrowed.
    let slot = unsafe { &mut *state.cast::<Slot<H>>() };
    let _scope = Scope::enter(slot.sink);
    let mut reply = Reply::new();
    // SAFETY: the caller's contract: the task and its spans are alive for
    // the call, which the Task does not outlive.
    match unsafe { Task::new(&*task) } {
        Ok(task) => {
            let ran = catch_unwind(AssertUnwindSafe(|| reply.set(slot.state.process(&task))));
            if let Err(panic) = ran {
                reply.fail(panic_text(panic));
            }
        }
        Err(e) => reply.fail(e),
    }
    // SAFETY: the caller's contract: out is the module's, empty.
    unsafe { reply.send(out) }
}

/// `ngx_threadpool_update`: runs `H::update` on the state that
/// [`init`]`::<H>` built.
///
/// # Safety
/// The header's contract: `state` from `ngx_threadpool_init`, that is
/// `init::<H>`, on its own thread; `update` and its payload alive for the
/// call; `err` the module's, empty.
pub unsafe fn update<H: Handler>(
    state: *mut c_void,
    update: *const ngx_tp_update_t,
    err: *mut ngx_tp_out_t,
) -> c_int {
    // SAFETY: the caller's contract: state is a Slot<H> from init::<H>,
    // used by this thread only, so not otherwise borrowed.
    let slot = unsafe { &mut *state.cast::<Slot<H>>() };
    let _scope = Scope::enter(slot.sink);
    let mut reply = Reply::new();
    // SAFETY: the caller's contract: the update and its payload are alive
    // for the call, which the Update does not outlive.
    match unsafe { Update::new(&*update) } {
        Ok(update) => match catch_unwind(AssertUnwindSafe(|| slot.state.update(&update))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => reply.fail(e),
            Err(panic) => reply.fail(panic_text(panic)),
        },
        Err(e) => reply.fail(e),
    }
    // SAFETY: the caller's contract: err is the module's, empty.
    unsafe { reply.send(err) }
}

/// `ngx_threadpool_free`: drops the state; a panic in its `Drop` is logged.
///
/// # Safety
/// The header's contract: `state` from `ngx_threadpool_init`, that is
/// `init::<H>`, not used after.
pub unsafe fn free<H: Handler>(state: *mut c_void) {
    // SAFETY: the caller's contract: state came from init::<H>'s Box, and
    // the module frees it once.
    let slot = unsafe { Box::from_raw(state.cast::<Slot<H>>()) };
    let sink = slot.sink;
    let _scope = Scope::enter(sink);
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| drop(slot))) {
        sink.line(
            level::ERR,
            &format!("freeing the state: {}", panic_text(panic)),
        );
    }
}
