//! Writing to nginx's error log, from the event loop or from pool threads.

use super::sys;

pub use sys::{
    NGX_LOG_ALERT, NGX_LOG_CRIT, NGX_LOG_DEBUG, NGX_LOG_EMERG, NGX_LOG_ERR, NGX_LOG_INFO,
    NGX_LOG_NOTICE, NGX_LOG_STDERR, NGX_LOG_WARN,
};

/// A cycle's error log. nginx's own thread pools log from their threads with
/// the same call, so sharing it across threads is what nginx itself does.
#[derive(Clone, Copy)]
pub struct Log(*mut sys::ngx_log_t);

// SAFETY: an ngx_log_t lives as long as its cycle, which outlives the worker
// threads (they are joined before the cycle goes away); ngx_log_error_core
// only reads it and write()s, as nginx's own thread pools do.
unsafe impl Send for Log {}
// SAFETY: &Log only gives the pointer to ngx_log_error_core, which reads the
// ngx_log_t (alive as long as its cycle) and write()s, as nginx's own thread
// pools do from their threads.
unsafe impl Sync for Log {}

impl Log {
    /// The error log of the current cycle.
    pub fn cycle() -> Option<Log> {
        // SAFETY: ngx_cycle is set before any module code runs.
        let cycle = unsafe { sys::ngx_cycle };
        if cycle.is_null() {
            return None;
        }
        // SAFETY: a non-null ngx_cycle points to a live cycle.
        let log = unsafe { (*cycle).log };
        (!log.is_null()).then_some(Log(log))
    }

    /// Whether a message at `level` would be written (levels count up from
    /// STDERR = 0 to DEBUG = 8).
    pub fn enabled(self, level: u32) -> bool {
        // SAFETY: self.0 is a live log (see the Send impl).
        unsafe { (*self.0).log_level >= level as usize }
    }

    /// Writes `msg` at `level`, if the log's level lets it through.
    pub fn write(self, level: u32, msg: &[u8]) {
        if !self.enabled(level) {
            return;
        }
        // SAFETY: "%*s" takes a size_t length and a pointer to that many
        // bytes; msg outlives the call.
        unsafe {
            sys::ngx_log_error_core(
                level as usize,
                self.0,
                0,
                c"%*s".as_ptr(),
                msg.len(),
                msg.as_ptr(),
            )
        }
    }
}

/// The one prefix of the module's own messages.
pub const PREFIX: &str = "ngx_threadpool: ";

/// How a line a handler logs from a pool thread ends, Lua or native: as
/// lua-nginx-module's lines end with the request's `, client: ...`.
pub fn pool_suffix(pool: &str) -> String {
    format!(", thread pool: {pool}")
}

/// The longest line the module formats: nginx's own (NGX_MAX_ERROR_STR),
/// which cuts longer ones too.
const LINE_MAX: usize = 2048;

/// A line formatted on the stack, cut at LINE_MAX bytes: writing a line
/// allocates nothing, so that a pool thread can say its Lua state ran out
/// of memory while the memory is still short.
struct Line {
    buf: [u8; LINE_MAX],
    len: usize,
}

impl Line {
    fn empty() -> Line {
        Line {
            buf: [0; LINE_MAX],
            len: 0,
        }
    }

    /// The module's message `args`, prefixed with PREFIX.
    fn new(args: std::fmt::Arguments) -> Line {
        let mut line = Line::empty();
        let _ = std::fmt::Write::write_fmt(&mut line, format_args!("{PREFIX}{args}"));
        line
    }

    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(LINE_MAX - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

impl Log {
    /// Writes the module's message `args` at `level`: formatted only if
    /// the level lets it through, prefixed with PREFIX.
    pub fn message(self, level: u32, args: std::fmt::Arguments) {
        if self.enabled(level) {
            self.write(level, Line::new(args).bytes());
        }
    }

    /// Whether nginx's debug log is on for http (`error_log ... debug` or
    /// `debug_http`), as ngx_log_debug checks it.
    pub fn debug_enabled(self) -> bool {
        // SAFETY: self.0 is a live log (see the Send impl).
        unsafe { (*self.0).log_level & sys::NGX_LOG_DEBUG_HTTP as usize != 0 }
    }

    /// Writes the line made of `parts` at `level`, as `message` does
    /// (without the prefix).
    pub fn write_parts(self, level: u32, parts: &[&[u8]]) {
        if self.enabled(level) {
            let mut line = Line::empty();
            for part in parts {
                line.push(part);
            }
            self.write(level, line.bytes());
        }
    }

    /// A step of a task's journey, in nginx's debug log.
    pub fn debug(self, args: std::fmt::Arguments) {
        if self.debug_enabled() {
            self.write(NGX_LOG_DEBUG, Line::new(args).bytes());
        }
    }
}

/// The module's message on the current cycle's log (stderr outside nginx).
pub fn message(level: u32, args: std::fmt::Arguments) {
    match Log::cycle() {
        Some(log) => log.message(level, args),
        None => eprintln!("{PREFIX}{args}"),
    }
}

/// A step of a task's journey on the current cycle's debug log.
pub fn debug(args: std::fmt::Arguments) {
    if let Some(log) = Log::cycle() {
        log.debug(args);
    }
}
