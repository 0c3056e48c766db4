//! The request-free part of lua-nginx-module's API, for the `ngx` table of
//! pool threads: what the lua module builds with its own C code (constants,
//! ngx.config, the string functions written against the Lua C API,
//! ngx.shared with its list methods), and the worker's identity as the event
//! loop sees it. vm/ngx_ffi.lua adds what lua-resty-core builds over
//! the lua module's FFI functions.
//!
//! The inject functions are the ones lua-nginx-module itself runs on the
//! Lua states of its own worker threads (ngx.run_worker_thread, see
//! ngx_http_lua_worker_thread.c). What they put in a thread, checked
//! against the 0.10.23 sources:
//! - constants and ngx.config: plain values; `prefix()` reads
//!   `ngx_cycle->prefix`, which a worker never changes.
//! - encode_args, decode_args, quote_sql_str: without a request they build
//!   their output in Lua userdata of the calling state (no pool, no static
//!   buffer); hmac_sha1 calls OpenSSL's HMAC() with an output buffer on the
//!   stack (its static buffer is only used for a NULL output).
//! - ngx.shared: the zones list is configuration data, read once here. The
//!   list methods (lpush ... get_keys) take the zone's shm mutex like every
//!   shared dict call; see ngx_ffi.lua for why that mutex holds
//!   between threads of one process.

use super::lua_symbols::get as lua_module;
use super::{conf, sys};
use mlua::{Lua, Table};
use std::ffi::c_void;
use std::ptr::NonNull;

/// lua-nginx-module's main conf (`ngx_http_lua_main_conf_t`) of the
/// worker's cycle, kept opaque: only the lua module reads it.
#[derive(Clone, Copy)]
pub struct LuaConf(NonNull<c_void>);

// SAFETY: the conf lives in the cycle's pool, which outlives the pool
// threads (they are joined at exit_process); the inject functions only read
// its shared dict list, which is written while the configuration is parsed.
unsafe impl Send for LuaConf {}
// SAFETY: &LuaConf only reaches the inject functions, which read the conf's
// shared dict list, written only while the configuration is parsed, before any
// thread starts.
unsafe impl Sync for LuaConf {}

impl LuaConf {
    /// The lua module's main conf in `cycle`; None without an http block.
    ///
    /// # Safety
    /// `cycle` must be a live, configured cycle; the lua module is linked.
    pub unsafe fn of(cycle: *mut sys::ngx_cycle_t) -> Option<LuaConf> {
        // SAFETY: cycle is live and configured and the lua module linked (the
        // contract): its http main conf holds the lua module's conf in that
        // module's slot.
        NonNull::new(unsafe { conf::http_main_conf(cycle, lua_module().module) }).map(LuaConf)
    }

    /// `lua_regex_match_limit` as the event loop applies it (0: none), read
    /// where the lua module's command table says its directive stores it.
    ///
    /// # Safety
    /// The cycle's configuration is fully read (the lua module's init main
    /// conf has replaced an unset value by 0).
    pub unsafe fn regex_match_limit(self) -> u64 {
        let Some(offset) = lua_module().regex_match_limit_offset else {
            return 0;
        };
        // SAFETY: the directive's ngx_int_t lies at `offset` in this main
        // conf (its command entry, see lua_symbols::command_offset).
        let limit = unsafe {
            self.0
                .as_ptr()
                .cast::<u8>()
                .add(offset)
                .cast::<sys::ngx_int_t>()
                .read()
        };
        u64::try_from(limit).unwrap_or(0)
    }
}

/// The worker as `ngx.worker.pid()`, `id()` and `count()` report it on the
/// event loop.
#[derive(Clone, Copy, Debug)]
pub struct WorkerInfo {
    pub pid: i32,
    /// None outside worker processes, where ngx.worker.id() is nil.
    pub id: Option<i32>,
    pub count: i32,
}

impl WorkerInfo {
    /// Asks the lua module's FFI functions, as lua-resty-core does.
    ///
    /// # Safety
    /// Event-loop thread of a process whose cycle is set up (init_process).
    pub unsafe fn current() -> WorkerInfo {
        // SAFETY: the three read ngx_pid, ngx_worker, ngx_process and the
        // core conf of ngx_cycle, all set before init_process.
        unsafe {
            let lua = lua_module();
            let id = (lua.worker_id)();
            WorkerInfo {
                pid: (lua.worker_pid)(),
                id: (id >= 0).then_some(id),
                count: (lua.worker_count)(),
            }
        }
    }
}

/// Fills `ngx` (a fresh table of `lua`) with what the lua module injects
/// itself: core, HTTP and log-level constants, ngx.null, ngx.config, the
/// Lua C API string functions and, given `conf`, ngx.shared. It also sets
/// ngx.log and the global print to the lua module's; the caller replaces
/// both (a thread's log lines name the pool).
pub fn inject(lua: &Lua, ngx: &Table, conf: Option<LuaConf>) -> mlua::Result<()> {
    let m = lua_module();
    // SAFETY: exec_raw runs the closure protected, with `ngx` alone on the
    // stack; each inject function pushes a value, sets it as a field of the
    // table below it and so leaves the stack as it found it. They touch no
    // request and no event-loop state (see the module comment), which is
    // why the lua module runs them in its own worker threads too.
    unsafe {
        lua.exec_raw::<()>(ngx, |l| {
            (m.inject_core_consts)(l);
            (m.inject_http_consts)(l);
            (m.inject_log_api)(l);
            (m.inject_string_api)(l);
            (m.inject_config_api)(l);
            if let Some(conf) = conf {
                (m.inject_shdict_api)(conf.0.as_ptr(), l);
            }
        })
    }
}

/// The version of the PCRE lua-nginx-module's ngx.re runs on, as it
/// reports it to lua-resty-core; None when it has no PCRE.
pub fn pcre_version() -> Option<String> {
    let f = lua_module().pcre_version?;
    // SAFETY: the lua module's `const char *(void)`; it returns PCRE's
    // static version string (PCRE2: a buffer it fills on each call, only
    // ever called on the event loop).
    let v = unsafe { std::ffi::CStr::from_ptr(f()) };
    Some(v.to_string_lossy().into_owned())
}

/// `lua_regex_cache_max_entries` when lua-nginx-module is loaded (in
/// nginx); None elsewhere (unit tests).
pub fn regex_cache_max_entries() -> Option<u32> {
    let f = super::os::global_symbol(c"ngx_http_lua_ffi_max_regex_cache_size")?;
    // SAFETY: lua-nginx-module's `uint32_t (void)` function; it reads the
    // cycle's http lua main conf, which is set before the pool threads
    // start (they start in init_process) and read-only afterwards.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(f.as_ptr()) };
    Some(f())
}
