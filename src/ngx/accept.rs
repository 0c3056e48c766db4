//! Accepting connections, for the accept gate (worker/gate.rs): which
//! connections the worker accepted and when they are done, and turning
//! accept on the shared listening sockets off and on.
//!
//! Only http listening sockets are watched: their handler is
//! `ngx_http_init_connection`, which the worker's copy of each listening
//! socket then reaches through `gated_init_connection`. Pausing touches only
//! sockets every worker shares: a `reuseport` socket belongs to one worker
//! (the kernel already chose it for the connection), so pausing it would
//! leave its connections waiting in its backlog.

use super::sys;
use std::cell::Cell;
use std::ffi::c_void;

/// What the gate is told, with the connection's number (unique in the
/// nginx instance).
#[derive(Clone, Copy)]
pub struct Hooks {
    /// A connection was accepted on an http listening socket.
    pub accepted: fn(u64),
    /// It was closed, or its first request was logged.
    pub done: fn(u64),
    /// The deferred check (`defer`) runs: once per event-loop iteration.
    pub check: fn(),
}

/// The check's two events: posted (this iteration) and timed (later).
struct CheckEvents {
    posted: sys::ngx_event_t,
    timed: sys::ngx_event_t,
}

thread_local! {
    static HOOKS: Cell<Option<Hooks>> = const { Cell::new(None) };
    static CHECK: Cell<*mut CheckEvents> = const { Cell::new(std::ptr::null_mut()) };
}

/// Watches this worker's http listening sockets and returns how many are
/// shared (the ones `set_shared_accept` turns off and on). Called from
/// init_process, once per worker.
pub fn install(hooks: Hooks) -> usize {
    HOOKS.with(|h| h.set(Some(hooks)));
    let event = || sys::ngx_event_t {
        handler: Some(run_check),
        // SAFETY: ngx_cycle is set before init_process and its log lives as
        // long as the worker.
        log: unsafe { (*sys::ngx_cycle).log },
        ..Default::default()
    };
    let mut events = Box::new(CheckEvents {
        posted: event(),
        timed: event(),
    });
    // A pending check does not hold up a graceful exit.
    events.timed.set_cancelable(1);
    CHECK.with(|e| e.set(Box::into_raw(events)));
    let mut shared = 0;
    for ls in listening() {
        if handler_is(ls.handler, sys::ngx_http_init_connection) {
            ls.handler = Some(gated_init_connection);
        }
        if is_gated(ls) {
            shared += 1;
        }
    }
    shared
}

/// The worker's listening sockets (this cycle's array, in the worker's own
/// memory).
fn listening() -> &'static mut [sys::ngx_listening_t] {
    // SAFETY: ngx_cycle->listening is an array of ngx_listening_t that
    // lives as long as the cycle; only the event-loop thread touches it.
    unsafe {
        let array = &(*sys::ngx_cycle).listening;
        if array.elts.is_null() {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(array.elts.cast(), array.nelts)
    }
}

type ConnectionHandler = unsafe extern "C" fn(*mut sys::ngx_connection_t);

fn handler_is(h: sys::ngx_connection_handler_pt, f: ConnectionHandler) -> bool {
    h.is_some_and(|h| std::ptr::fn_addr_eq(h, f))
}

/// A shared http listening socket this worker listens on.
fn is_gated(ls: &sys::ngx_listening_t) -> bool {
    handler_is(ls.handler, gated_init_connection) && ls.reuseport() == 0 && !ls.connection.is_null()
}

/// Whether nginx pauses accept itself (`accept_mutex on` with several
/// workers).
pub fn accept_mutex_on() -> bool {
    // SAFETY: set by the event module's init_process, before ours, and
    // read-only afterwards.
    unsafe { sys::ngx_use_accept_mutex != 0 }
}

/// nginx's monotonic clock in milliseconds, the same in every process of
/// the machine (CLOCK_MONOTONIC), as of this loop iteration.
pub fn now_ms() -> u64 {
    // SAFETY: a word nginx updates on the event-loop thread; an aligned
    // u64 is never read torn.
    unsafe { std::ptr::read_volatile(&raw const sys::ngx_current_msec) as u64 }
}

/// Stops (`on == false`) or resumes accepting on the shared http sockets.
/// Does nothing once the worker is exiting: nginx has closed the sockets
/// and may have reused their connection structs.
pub fn set_shared_accept(on: bool) {
    // SAFETY: read on the event-loop thread, which alone writes it.
    if unsafe { sys::ngx_exiting } != 0 {
        return;
    }
    for ls in listening() {
        if !is_gated(ls) {
            continue;
        }
        // SAFETY: is_gated checked the connection; a listening connection
        // has its read event for the life of the cycle (until exiting).
        unsafe {
            let rev = (*ls.connection).read;
            if ((*rev).active() != 0) == on {
                continue;
            }
            let actions = &raw const sys::ngx_event_actions;
            if on {
                // As nginx adds it at start: exclusive wake-ups, when it
                // uses them, so one connection wakes one worker.
                let flags = if sys::ngx_use_exclusive_accept != 0 {
                    sys::NGX_RS_EXCLUSIVE_EVENT
                } else {
                    0
                };
                if let Some(add) = (*actions).add {
                    add(rev, sys::NGX_RS_READ_EVENT as sys::ngx_int_t, flags);
                }
            } else if let Some(del) = (*actions).del {
                del(
                    rev,
                    sys::NGX_RS_READ_EVENT as sys::ngx_int_t,
                    sys::NGX_DISABLE_EVENT as sys::ngx_uint_t,
                );
            }
        }
    }
}

/// Runs the `check` hook once, after the events of this loop iteration:
/// never from inside nginx's accept loop, which re-adds its socket after
/// the handler returns (ngx_reorder_accept_events).
pub fn defer() {
    let events = CHECK.with(|e| e.get());
    if events.is_null() {
        return;
    }
    // SAFETY: the events were allocated by install and live as long as the
    // worker; posting (as ngx_post_event does) is done on the event-loop
    // thread.
    unsafe {
        let ev = &raw mut (*events).posted;
        if (*ev).posted() != 0 {
            return;
        }
        (*ev).set_posted(1);
        let head = &raw mut sys::ngx_posted_events;
        let q = &raw mut (*ev).queue;
        (*q).prev = (*head).prev;
        (*(*q).prev).next = q;
        (*q).next = head;
        (*head).prev = q;
    }
}

/// Runs the `check` hook in `ms` milliseconds, unless a timed check is
/// already on its way: a paused worker looks again at the others' loads
/// even when none of its own events come.
pub fn check_in(ms: u64) {
    let events = CHECK.with(|e| e.get());
    if events.is_null() {
        return;
    }
    // SAFETY: the events were allocated by install and live as long as the
    // worker (non-null checked above), and the timer tree is the event loop's,
    // this thread's (what ngx_add_timer does, without its lazy re-arming).
    unsafe {
        let ev = &raw mut (*events).timed;
        if (*ev).timer_set() != 0 {
            return;
        }
        (*ev).timer.key = sys::ngx_current_msec + ms as sys::ngx_msec_t;
        sys::ngx_rbtree_insert(&raw mut sys::ngx_event_timer_rbtree, &raw mut (*ev).timer);
        (*ev).set_timer_set(1);
    }
}

unsafe extern "C" fn run_check(_ev: *mut sys::ngx_event_t) {
    super::guard::no_unwind("accept gate", (), || {
        if let Some(h) = HOOKS.with(|h| h.get()) {
            (h.check)();
        }
    })
}

/// The http listening sockets' handler: tells the gate, then hands the
/// connection to nginx's http module.
unsafe extern "C" fn gated_init_connection(c: *mut sys::ngx_connection_t) {
    super::guard::no_unwind("accept gate", (), || {
        let Some(hooks) = HOOKS.with(|h| h.get()) else {
            return;
        };
        // SAFETY: nginx passes a connection it just accepted, with its pool.
        unsafe {
            let number = (*c).number;
            let cleanup = sys::ngx_pool_cleanup_add((*c).pool, 0);
            if !cleanup.is_null() {
                (*cleanup).handler = Some(connection_closed);
                (*cleanup).data = number as usize as *mut c_void;
                (hooks.accepted)(number);
            }
        }
    });
    // SAFETY: the handler nginx set for this socket, with its connection.
    unsafe { sys::ngx_http_init_connection(c) }
}

unsafe extern "C" fn connection_closed(data: *mut c_void) {
    super::guard::no_unwind("accept gate", (), || {
        if let Some(hooks) = HOOKS.with(|h| h.get()) {
            (hooks.done)(data as usize as u64);
        }
    })
}

/// A log-phase handler: a connection whose first request is done without
/// pushing a task no longer counts as a task to come.
///
/// # Safety
/// `cf` must be the http configuration being parsed (postconfiguration).
pub unsafe fn add_log_handler(cf: *mut sys::ngx_conf_t) -> bool {
    // SAFETY: the core module's main conf exists in an http block's
    // postconfiguration; its phase arrays take handlers until the phase
    // engine is built after postconfiguration.
    unsafe {
        let cmcf = super::conf::http_main_conf((*cf).cycle, &raw const sys::ngx_http_core_module)
            as *mut sys::ngx_http_core_main_conf_t;
        let handlers =
            &raw mut (*cmcf).phases[sys::ngx_http_phases_NGX_HTTP_LOG_PHASE as usize].handlers;
        let h = sys::ngx_array_push(handlers) as *mut sys::ngx_http_handler_pt;
        if h.is_null() {
            return false;
        }
        *h = Some(request_logged);
        true
    }
}

unsafe extern "C" fn request_logged(r: *mut sys::ngx_http_request_t) -> sys::ngx_int_t {
    super::guard::no_unwind("accept gate", sys::NGX_OK as sys::ngx_int_t, || {
        if let Some(hooks) = HOOKS.with(|h| h.get()) {
            // SAFETY: nginx passes a live request with its connection.
            (hooks.done)(unsafe { connection_number(r) });
        }
        sys::NGX_OK as sys::ngx_int_t
    })
}

/// The number of the request's connection.
///
/// # Safety
/// `r` must be a live request.
pub unsafe fn connection_number(r: *mut sys::ngx_http_request_t) -> u64 {
    // SAFETY: a live request has its connection.
    unsafe { (*(*r).connection).number }
}

/// An eventfd that every worker watches, made in the master before the
/// workers fork: a worker left alone accepting a burst writes it, so the
/// paused workers look at the loads at once rather than at their next
/// timed check. Closed when its configuration goes (reload, exit).
pub struct Nudge(std::ffi::c_int);

impl Nudge {
    pub fn create() -> Option<Nudge> {
        // SAFETY: a plain system call.
        let fd =
            unsafe { sys::eventfd(0, (sys::EFD_NONBLOCK | sys::EFD_CLOEXEC) as std::ffi::c_int) };
        (fd >= 0).then_some(Nudge(fd))
    }

    /// Watches the nudge in this worker: each write runs the check.
    pub fn watch(&self) -> bool {
        // SAFETY: in init_process, on the event loop: a connection struct
        // carries the fd for the event module; edge-triggered, so each
        // write wakes every worker once and nobody needs to read.
        unsafe {
            let log = (*sys::ngx_cycle).log;
            let c = sys::ngx_get_connection(self.0, log);
            if c.is_null() {
                return false;
            }
            let rev = (*c).read;
            (*rev).handler = Some(run_check);
            (*rev).log = log;
            // A channel between processes, as nginx marks its own: not a
            // client connection left open at exit.
            (*rev).set_channel(1);
            let actions = &raw const sys::ngx_event_actions;
            let Some(add) = (*actions).add else {
                return false;
            };
            add(
                rev,
                sys::NGX_RS_READ_EVENT as sys::ngx_int_t,
                sys::NGX_RS_CLEAR_EVENT,
            ) == sys::NGX_OK as sys::ngx_int_t
        }
    }

    pub fn send(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 readable bytes to an eventfd; a full counter (never in
        // practice) only drops this nudge.
        unsafe { sys::write(self.0, one.as_ptr().cast(), one.len()) };
    }
}

impl Drop for Nudge {
    fn drop(&mut self) {
        // SAFETY: the fd is this Nudge's own.
        unsafe { sys::close(self.0) };
    }
}
