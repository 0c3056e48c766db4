//! Waking the event loop from pool threads through `ngx_notify`.
//!
//! nginx's notify (the epoll module's eventfd) keeps one handler slot: each
//! call stores its handler, then writes the eventfd, and the event loop runs
//! whatever handler is stored when it wakes. nginx's thread pools (`aio
//! threads`, `ngx.run_worker_thread`) call it with their own handler, so two
//! callers between two loop iterations would lose one wake-up. The module
//! therefore replaces `ngx_event_actions.notify` in each worker with a
//! multiplexer: every caller's handler is marked pending in a small table,
//! and the original notify is always called with one dispatcher that runs
//! every pending handler. No caller can overwrite another.

use super::sys;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

type Notify = unsafe extern "C" fn(handler: sys::ngx_event_handler_pt) -> sys::ngx_int_t;
type Handler = unsafe extern "C" fn(ev: *mut sys::ngx_event_t);

/// Distinct handlers seen: nginx's thread pool handler, ours, and room for
/// other modules.
const SLOTS: usize = 8;

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static HANDLERS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static PENDING: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// A wake-up of ours is on its way: coalesces many completions into one
/// notify.
static WAKE_PENDING: AtomicBool = AtomicBool::new(false);

/// What the event loop runs when pool threads woke it (the worker drains
/// its completions), registered by install.
static ON_WAKE: AtomicUsize = AtomicUsize::new(0);

/// Installs the multiplexer in this worker, with `on_wake` to run on the
/// event loop after pool threads called `wake`. Called from init_process,
/// after the event module has set up `ngx_event_actions`.
pub fn install(on_wake: fn()) -> Result<(), String> {
    ON_WAKE.store(on_wake as usize, Ordering::Release);
    // SAFETY: init_process runs on the event-loop thread before any pool
    // thread of ours exists; nginx's threads read the pointer with plain
    // loads, and an aligned pointer store is atomic on every platform nginx
    // threads support.
    unsafe {
        let actions = &raw mut sys::ngx_event_actions;
        let current = (*actions)
            .notify
            .ok_or("the event method has no notify (use epoll)")?;
        if current as usize != multiplex as Notify as usize {
            ORIGINAL.store(current as usize, Ordering::SeqCst);
            std::ptr::write_volatile(&raw mut (*actions).notify, Some(multiplex));
        }
    }
    Ok(())
}

/// Called by pool threads after posting a completion.
pub fn wake() {
    if !WAKE_PENDING.swap(true, Ordering::AcqRel) {
        // SAFETY: installed before threads start; the handler runs on the
        // event loop.
        unsafe { multiplex(Some(on_wake)) };
    }
}

unsafe extern "C" fn multiplex(handler: sys::ngx_event_handler_pt) -> sys::ngx_int_t {
    let original = ORIGINAL.load(Ordering::Acquire);
    if original == 0 {
        return sys::NGX_ERROR as sys::ngx_int_t;
    }
    // SAFETY: ORIGINAL holds the event module's notify function.
    let original: Notify = unsafe { std::mem::transmute::<usize, Notify>(original) };
    let Some(h) = handler else {
        // SAFETY: forwarding the caller's own call.
        return unsafe { original(handler) };
    };
    match slot_of(h as usize) {
        Some(i) => {
            PENDING[i].store(true, Ordering::Release);
            // SAFETY: the dispatcher runs on the event loop, like any handler.
            unsafe { original(Some(dispatch)) }
        }
        // Table full: behave as nginx would, rather than drop the call.
        // SAFETY: forwarding the caller's own call.
        None => unsafe { original(handler) },
    }
}

fn slot_of(h: usize) -> Option<usize> {
    for (i, slot) in HANDLERS.iter().enumerate() {
        match slot.compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(i),
            Err(existing) if existing == h => return Some(i),
            Err(_) => {}
        }
    }
    None
}

unsafe extern "C" fn dispatch(ev: *mut sys::ngx_event_t) {
    for (i, pending) in PENDING.iter().enumerate() {
        if pending.swap(false, Ordering::AcqRel) {
            let h = HANDLERS[i].load(Ordering::Acquire);
            // SAFETY: only handler pointers are stored in HANDLERS.
            let h: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
            // SAFETY: called on the event loop with the notify event, as the
            // event module would have called it.
            unsafe { h(ev) };
        }
    }
}

unsafe extern "C" fn on_wake(_ev: *mut sys::ngx_event_t) {
    super::guard::no_unwind("completion handler", (), || {
        // Clear first: a completion posted after this point sends another
        // wake-up, one posted before is drained below.
        // swap, not store: the acquire pairs with the threads' swap, so every
        // completion sent before their wake() is visible to the drain.
        WAKE_PENDING.swap(false, Ordering::AcqRel);
        let f = ON_WAKE.load(Ordering::Acquire);
        if f != 0 {
            // SAFETY: only `fn()` pointers are stored in ON_WAKE.
            let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(f) };
            f();
        }
    })
}
