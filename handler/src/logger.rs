//! The `log` crate's records into nginx's error log, through the
//! `log_fn` the module gave the state whose call is running on this
//! thread (the module's line names the pool and the thread).

use crate::ffi::ngx_tp_log_pt;
use log::{Level, LevelFilter, Log, Metadata, Record};
use ngx_threadpool_wire::level;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::fmt::Write;
use std::sync::Once;

/// Where a state's log lines go.
///
/// Invariant: `log` is valid, and `f` callable with it from the state's
/// thread, for the state's life (the header's contract for
/// `ngx_tp_init_t.log`).
#[derive(Clone, Copy)]
pub(crate) struct Sink {
    pub(crate) f: ngx_tp_log_pt,
    pub(crate) log: *const c_void,
}

impl Sink {
    /// Writes one line at an nginx level.
    pub(crate) fn line(self, level: c_int, msg: &str) {
        // SAFETY: the type's invariant, and a Sink is only used on its
        // state's thread during a call on that state (Scope).
        unsafe { (self.f)(self.log, level, msg.as_ptr(), msg.len()) }
    }
}

thread_local! {
    /// The sink of the state whose call runs on this thread, if any.
    static CURRENT: Cell<Option<Sink>> = const { Cell::new(None) };
    /// A line being formatted, reused.
    static LINE: Cell<String> = const { Cell::new(String::new()) };
}

/// Sends this thread's records to a sink while it lives.
pub(crate) struct Scope(Option<Sink>);

impl Scope {
    pub(crate) fn enter(sink: Sink) -> Scope {
        Scope(CURRENT.replace(Some(sink)))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.set(self.0);
    }
}

/// The nginx level of a record: `trace` and `debug` are both nginx's
/// debug (shown with `error_log ... debug` in an nginx built with
/// `--with-debug`, as Debian's is).
fn nginx_level(l: Level) -> c_int {
    match l {
        Level::Error => level::ERR,
        Level::Warn => level::WARN,
        Level::Info => level::INFO,
        Level::Debug | Level::Trace => level::DEBUG,
    }
}

struct Bridge;

impl Log for Bridge {
    fn enabled(&self, _: &Metadata) -> bool {
        CURRENT.get().is_some()
    }

    fn log(&self, record: &Record) {
        let Some(sink) = CURRENT.get() else {
            // a thread of the handler's own, or no call running
            return;
        };
        // Taken, not borrowed: a value whose Display logs gets a new
        // buffer rather than a conflict.
        let mut line = LINE.take();
        line.clear();
        let _ = write!(line, "{}", record.args());
        sink.line(nginx_level(record.level()), &line);
        LINE.set(line);
    }

    fn flush(&self) {}
}

static BRIDGE: Bridge = Bridge;

/// Makes the bridge this library's logger, once. The level filter starts
/// at `Trace` (nginx's `error_log` level decides what is written); a
/// handler may lower it with `log::set_max_level` to skip formatting.
/// If the library set another logger first, that one stays.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if log::set_logger(&BRIDGE).is_ok() {
            log::set_max_level(LevelFilter::Trace);
        }
    });
}
