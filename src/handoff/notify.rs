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
//!
//! It also wraps `ngx_event_actions.process_events`: when the worker
//! awaits completions, the event loop polls for them briefly before it
//! sleeps in epoll_wait, as pool threads poll for jobs (crate::handoff::spin). A
//! round trip at concurrency 1 otherwise puts the event loop to sleep and
//! wakes it through the eventfd once per task, which cost more of its CPU
//! than the task's own work (bench/ANALYSIS.md). And pool threads write
//! the eventfd only while the event loop sleeps: while it runs, it takes
//! their completions itself before it waits again.

use super::spin::Spin;
use crate::ngx::sys;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type Notify = unsafe extern "C" fn(handler: sys::ngx_event_handler_pt) -> sys::ngx_int_t;
type Handler = unsafe extern "C" fn(ev: *mut sys::ngx_event_t);
type ProcessEvents = unsafe extern "C" fn(
    cycle: *mut sys::ngx_cycle_t,
    timer: sys::ngx_msec_t,
    flags: sys::ngx_uint_t,
) -> sys::ngx_int_t;

/// Distinct handlers seen: nginx's thread pool handler, ours, and room for
/// other modules.
const SLOTS: usize = 8;

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static HANDLERS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static PENDING: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// A wake-up of ours is on its way: coalesces many completions into one
/// notify.
static WAKE_PENDING: AtomicBool = AtomicBool::new(false);
/// The event loop is in (or about to enter) nginx's blocking wait for
/// events: only then does a pool thread that sets WAKE_PENDING write the
/// eventfd. While the event loop runs, it takes the flag itself before it
/// waits again (process_events), and the write would cost the thread a
/// system call and the event loop a wake-up that finds nothing. The two
/// sides pair as in Dekker's algorithm, all SeqCst: a thread sets
/// WAKE_PENDING, then reads SLEEPING; the event loop sets SLEEPING, then
/// reads WAKE_PENDING before it blocks. One of them sees the other's
/// store: a completion is either taken before the wait or announced
/// through the eventfd.
static SLEEPING: AtomicBool = AtomicBool::new(false);

/// What the event loop runs when pool threads woke it (the worker drains
/// its completions), registered by install.
static ON_WAKE: AtomicUsize = AtomicUsize::new(0);

/// Whether the worker awaits completions (registered by install).
static AWAITING: AtomicUsize = AtomicUsize::new(0);
/// The event module's process_events.
static PROCESS: AtomicUsize = AtomicUsize::new(0);
/// Wake-ups handled (on_wake), on the event loop only: whether a
/// completion came during a wait.
static WAKES: AtomicUsize = AtomicUsize::new(0);

/// The longest the event loop polls for completions before it sleeps.
/// Shorter than a pool thread's poll: network events that arrive meanwhile
/// wait for it.
const POLL: Duration = Duration::from_micros(20);

thread_local! {
    /// The event loop's poll, adapted to how soon completions come.
    static EVENT_LOOP_POLL: RefCell<Spin> = const { RefCell::new(Spin::new(POLL)) };
}

/// Installs the multiplexer in this worker, with `on_wake` to run on the
/// event loop after pool threads called `wake`, and the poll for
/// completions while `awaiting` says some are due. Called from
/// init_process, after the event module has set up `ngx_event_actions`.
pub fn install(on_wake: fn(), awaiting: fn() -> bool) -> Result<(), String> {
    ON_WAKE.store(on_wake as usize, Ordering::Release);
    AWAITING.store(awaiting as usize, Ordering::Release);
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
        let process = (*actions)
            .process_events
            .ok_or("the event method has no process_events")?;
        if process as usize != process_events as ProcessEvents as usize {
            PROCESS.store(process as usize, Ordering::SeqCst);
            (*actions).process_events = Some(process_events);
        }
    }
    Ok(())
}

/// nginx's wait for events, with the completions of pool threads taken
/// on the way: those that came while the event loop ran (no eventfd was
/// written for them) at once; when the worker awaits some and nginx would
/// block, those that come within a short poll of the wake-up flag; and
/// the rest through the eventfd, which pool threads write while it
/// sleeps. Once it has taken some, nginx looks at its events without
/// blocking: the semaphores they posted run after this returns.
unsafe extern "C" fn process_events(
    cycle: *mut sys::ngx_cycle_t,
    timer: sys::ngx_msec_t,
    flags: sys::ngx_uint_t,
) -> sys::ngx_int_t {
    // SAFETY: install stored the event module's process_events before
    // putting this one in its place.
    let original: ProcessEvents =
        unsafe { std::mem::transmute::<usize, ProcessEvents>(PROCESS.load(Ordering::Acquire)) };
    if WAKE_PENDING.load(Ordering::Acquire) {
        // SAFETY: forwarding nginx's own call, on the event loop.
        return unsafe { take_then_look(original, cycle, flags) };
    }
    let awaiting = timer != 0 && {
        let f = AWAITING.load(Ordering::Acquire);
        // SAFETY: only `fn() -> bool` pointers are stored in AWAITING.
        f != 0 && unsafe { std::mem::transmute::<usize, fn() -> bool>(f) }()
    };
    if !awaiting {
        // SAFETY: forwarding nginx's own call.
        return unsafe { sleep(original, cycle, timer, flags) };
    }
    let start = Instant::now();
    let wakes = WAKES.load(Ordering::Relaxed);
    let budget = EVENT_LOOP_POLL.with(|p| p.borrow().budget());
    let caught = poll(start, budget);
    // SAFETY: forwarding nginx's own call, on the event loop.
    let rc = unsafe {
        if caught {
            take_then_look(original, cycle, flags)
        } else {
            sleep(original, cycle, timer, flags)
        }
    };
    // A wait that network events ended before any completion came counts
    // as a long one: on a loop kept busy by other requests, polling would
    // only hold their events back, and the poll stops.
    let waited = start.elapsed();
    let came = caught || WAKES.load(Ordering::Relaxed) != wakes;
    let waited = if came { waited } else { waited.max(2 * POLL) };
    EVENT_LOOP_POLL.with(|p| p.borrow_mut().observe(waited));
    rc
}

/// nginx's wait, which may block for `timer`: pool threads are told
/// (SLEEPING), and a completion that came before they could see it is
/// taken instead of blocking.
///
/// # Safety
/// The event loop, forwarding nginx's call to `original`.
unsafe fn sleep(
    original: ProcessEvents,
    cycle: *mut sys::ngx_cycle_t,
    timer: sys::ngx_msec_t,
    flags: sys::ngx_uint_t,
) -> sys::ngx_int_t {
    if timer == 0 {
        // SAFETY: nginx's own call, which does not block.
        return unsafe { original(cycle, 0, flags) };
    }
    SLEEPING.store(true, Ordering::SeqCst);
    if WAKE_PENDING.load(Ordering::SeqCst) {
        SLEEPING.store(false, Ordering::SeqCst);
        // SAFETY: this runs on the event loop, forwarding nginx's call to
        // `original` (the contract), as take_then_look needs.
        return unsafe { take_then_look(original, cycle, flags) };
    }
    // SAFETY: nginx's own call; a completion that comes while it blocks
    // writes the eventfd, whose handler runs inside it.
    let rc = unsafe { original(cycle, timer, flags) };
    SLEEPING.store(false, Ordering::SeqCst);
    rc
}

/// Takes the completions that came, as the eventfd's handler would, then
/// has nginx look at its events without blocking: the semaphores they
/// posted run after nginx's call returns.
///
/// # Safety
/// The event loop, forwarding nginx's call to `original`.
unsafe fn take_then_look(
    original: ProcessEvents,
    cycle: *mut sys::ngx_cycle_t,
    flags: sys::ngx_uint_t,
) -> sys::ngx_int_t {
    // SAFETY: on the event loop, where on_wake runs as the eventfd's
    // handler; nginx's call with a zero timer does not block.
    unsafe {
        on_wake(std::ptr::null_mut());
        original(cycle, 0, flags)
    }
}

/// Polls the wake-up flag until `budget` has passed since `start`: whether
/// a completion came.
fn poll(start: Instant, budget: Duration) -> bool {
    if budget.is_zero() {
        return false;
    }
    loop {
        // The clock costs more than a look at the flag: read it every few.
        for _ in 0..16 {
            if WAKE_PENDING.load(Ordering::Acquire) {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= budget {
            return false;
        }
    }
}

/// Called by pool threads after posting a completion. Unless the event
/// loop sleeps, setting the flag is the wake-up (SLEEPING).
pub fn wake() {
    if !WAKE_PENDING.swap(true, Ordering::SeqCst) && SLEEPING.load(Ordering::SeqCst) {
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
    crate::ngx::guard::no_unwind("completion handler", (), || {
        // Clear first: a completion posted after this point sends another
        // wake-up, one posted before is drained below.
        // swap, not store: the acquire pairs with the threads' swap, so every
        // completion sent before their wake() is visible to the drain.
        WAKE_PENDING.swap(false, Ordering::AcqRel);
        WAKES.fetch_add(1, Ordering::Relaxed);
        let f = ON_WAKE.load(Ordering::Acquire);
        if f != 0 {
            // SAFETY: only `fn()` pointers are stored in ON_WAKE.
            let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(f) };
            f();
        }
    })
}
