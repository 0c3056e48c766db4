//! ngx_threadpool: per-worker thread pools of LuaJIT states (or native
//! handlers) for OpenResty.
//!
//! This file wires the module into nginx: the module record, its directive
//! table and its process hooks, each handing over to the folder below that
//! does the work.
//!
//! The map of the crate, which `tests/layout.rs` holds to the files: every
//! folder of src/ is an entry and every file is named in its folder's
//! entry. The entries run from the top down: a file imports from its own
//! folder and from the folders of later entries only, never from an
//! earlier one (`tests/layout.rs` fails on an import against that
//! direction). Folders are roles; a feature that crosses the two sides
//! keeps a file in each role it touches, and its trail is listed after
//! the map.
//!
//! - `api/`: what the event loop offers its Lua code. The C functions
//!   behind lua/resty/threadpool.lua: their registration (`mod.rs`), tasks
//!   (`functions.rs`), streams (`streams.rs`), updates (`updates.rs`);
//!   and `thread_pool_status` (`status.rs`).
//! - `worker/`: the event loop's side of the hand-off. The worker's pools
//!   and completions (`mod.rs`), init_process and exit_process
//!   (`process.rs`), task records (`tasks.rs`), the accept gate
//!   (`gate.rs`), errors (`error.rs`).
//! - `thread/`: the pool threads' side. A thread's loop (`run.rs`), the
//!   seam over the two kinds of handler (`handler.rs`), shadow comparison
//!   (`shadow.rs`: POOL's half, `compare.rs`: SHADOW's half), the watchdog
//!   (`watchdog.rs`), the update thread and a thread's updates
//!   (`updates.rs`), its stack after a deep task (`stack.rs`).
//! - `conf/`: configuration, read in the master. The directives' setters
//!   and the http main conf (`mod.rs`), `*_by_lua_block` reading
//!   (`block.rs`), its errors (`error.rs`), a pool's settings declared in
//!   one place (`settings.rs`).
//! - `vm/`: a pool thread's Lua state (`mod.rs`): its `ngx` table
//!   (`ngx_table.rs`), ngx.re (`ngx_re.rs`), what runs in its protected
//!   calls (`task.rs`), the handler styles (`chunk.rs`), cooperative
//!   cancellation and a stream's calls (`cancel.rs`).
//! - `native/`: a pool thread's native handler: its state and callbacks
//!   (`mod.rs`), the C ABI's structs (`abi.rs`), loading a library
//!   (`library.rs`).
//! - `handoff/`: what crosses between the two sides. A push's work and its
//!   handle (`job.rs`), encoded values (`payload.rs`), cancellation and
//!   outcome (`outcome.rs`), a stream's chunks (`stream.rs`), the wake-up
//!   of the event loop (`notify.rs`), the adaptive poll both sides wait
//!   with (`spin.rs`), a pool's latest update in shared memory
//!   (`update.rs`).
//! - `stats/`: what both sides count and every worker's status page reads.
//!   A pool's numbers declared once, in the one table that lays them out
//!   and names them for `stats()` and `thread_pool_status` (`counters.rs`);
//!   timings (`histogram.rs`), a pool thread's counts of a claim
//!   (`tally.rs`), the queue bound and the admission estimate
//!   (`admission.rs`), the shared-memory table of every worker's
//!   (`status_table.rs`), the accept gate's state in that table
//!   (`gate.rs`), the update versions of every thread in it
//!   (`versions.rs`).
//! - `codec/`: MessagePack between the sides. The format's limits and
//!   writer (`format.rs`), `encode.rs`, `decode.rs`, error texts
//!   (`message.rs`), a payload as a Rust tree (`value.rs`).
//! - `ngx/`: the nginx boundary. bindgen's bindings (`bindings.rs`) and
//!   small wrappers: configuration (`conf.rs`), logs (`log.rs`), the module
//!   record (`module.rs`), memory pools (`palloc.rs`), shared memory
//!   (`shm.rs`), a content handler's response (`http.rs`), the locations'
//!   `aio threads` (`http_locations.rs`), nginx's thread pools
//!   (`thread_pool.rs`), accepting connections (`accept.rs`),
//!   lua-nginx-module's API (`lua.rs`), its symbols (`lua_symbols.rs`)
//!   and what it injects into a thread's `ngx` (`lua_inject.rs`), the
//!   shim's C arguments (`shim.rs`), native libraries (`dl.rs`), OS calls
//!   (`os.rs`), panic guards (`guard.rs`). It calls up only through
//!   callbacks registered with it.
//! - `luajit/`: the Lua C API below mlua's safe API, both sides. A pool
//!   thread's state (`mod.rs`) and its allocator (`alloc.rs`), protected
//!   calls (`call.rs`), values on a raw stack (`stack.rs`).
//!
//! The features that cross the sides, file by file:
//!
//! - a task: `api/functions.rs` (push) → `worker/mod.rs` (queue) →
//!   `thread/run.rs` → `thread/handler.rs` → `vm/` (decode, run, encode
//!   with `codec/`) or `native/` → `handoff/notify.rs` (wake) →
//!   `worker/tasks.rs` (complete, post the semaphore) → `api/functions.rs`
//!   (result).
//! - a stream: `api/streams.rs` (push_stream, read, write) →
//!   `handoff/stream.rs` (the chunks both sides share) → `vm/cancel.rs` or
//!   `native/mod.rs` (send, receive) → `worker/tasks.rs` (the record's
//!   chunks).
//! - an update: `api/updates.rs` (update) → `handoff/update.rs` (the
//!   pool's zone, every worker's) → `thread/updates.rs` (each worker's
//!   update thread) → `thread/run.rs` (applied between two tasks) →
//!   `thread/handler.rs` → `vm/` (the update chunk) or `native/`
//!   (ngx_threadpool_update) → `stats/versions.rs` (each thread's
//!   version, read by the caller's wait).
//! - shadowing: `conf/mod.rs` (thread_pool_shadow) → `thread/shadow.rs`
//!   (POOL's sample) → `handoff/job.rs` (the shadow task) →
//!   `thread/compare.rs` (SHADOW's comparison) → `stats/` (its counters).
//!
//! Where `unsafe` is: each file holding an `unsafe` block, fn, impl or
//! extern block (`tests/layout.rs` counts them in the code and fails when
//! this table and the code disagree). Every block carries a `// SAFETY:`
//! comment with its own reason; the crate denies undocumented ones.
//!
//! | folder | files | what the `unsafe` is for |
//! |---|---|---|
//! | `ngx/` | `mod.rs` `accept.rs` `conf.rs` `dl.rs` `http.rs` `http_locations.rs` `log.rs` `lua.rs` `lua_inject.rs` `lua_symbols.rs` `module.rs` `os.rs` `palloc.rs` `shim.rs` `shm.rs` `thread_pool.rs` | nginx's structures and calls, lua-nginx-module's API, dlsym, libc |
//! | `luajit/` | `mod.rs` `alloc.rs` `call.rs` `stack.rs` | the Lua C API below mlua's safe API |
//! | (root) | `lib.rs` | the module record and the hooks nginx calls with raw pointers |
//! | `conf/` | `mod.rs` | the setters nginx calls with its configuration; the main conf in a cycle |
//! | `api/` | `mod.rs` `functions.rs` `streams.rs` `status.rs` `updates.rs` | the shim's C functions on the caller's Lua stack (their registration, tasks, streams, updates); the status handler |
//! | `worker/` | `mod.rs` `process.rs` `tasks.rs` | task lists in a request's pool, init_process |
//! | `stats/` | `status_table.rs` | counters in shared memory |
//! | `handoff/` | `job.rs` `notify.rs` `stream.rs` `update.rs` | a shadow task's check, unsafe to call on other arguments than its own; the wake-up's nginx event and eventfd; the stream of the task a pool thread runs, which its handler's sends reach; the update zone's memory |
//! | `thread/` | `compare.rs` `handler.rs` `run.rs` `shadow.rs` | a task's borrowed bytes (spans), alive until its completion |
//! | `vm/` | `cancel.rs` `mod.rs` `task.rs` | the protected calls' C functions on a thread's Lua state |
//! | `native/` | `library.rs` `mod.rs` | the handler library's C functions |
//! | `codec/` | `decode.rs` `encode.rs` `mod.rs` `value.rs` `format.rs` `tests/errors.rs` `tests/mod.rs` `tests/speed.rs` `tests/values.rs` | values read from and written to a Lua stack; borrowed spans |

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod codec;
pub mod conf;
pub mod handoff;
pub mod luajit;
pub mod native;
pub mod ngx;
pub mod stats;
pub mod thread;
pub mod vm;
pub mod worker;

use api::status;
use conf::{settings, MainConf, BLOCK, FILE, INIT, PROCESS, UPDATE};
use ngx::conf::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::module::{command, module, NULL_COMMAND};
use ngx::{ngx_string, sys};
use std::ffi::{c_char, c_void};
use std::ptr;

const TAKE2_MAIN: u32 = sys::NGX_HTTP_MAIN_CONF | sys::NGX_CONF_TAKE2;
const BLOCK_MAIN: u32 = sys::NGX_HTTP_MAIN_CONF | sys::NGX_CONF_BLOCK | sys::NGX_CONF_TAKE1;

/// The directives other than the settings' (conf/settings.rs).
const COMMANDS_BUT_SETTINGS: [sys::ngx_command_t; 14] = [
    command(
        ngx_string(c"thread_pool_init_by_lua"),
        TAKE2_MAIN,
        conf::set_chunk,
        INIT,
    ),
    command(
        ngx_string(c"thread_pool_init_by_lua_file"),
        TAKE2_MAIN,
        conf::set_chunk,
        INIT | FILE,
    ),
    command(
        ngx_string(c"thread_pool_process_by_lua"),
        TAKE2_MAIN,
        conf::set_chunk,
        PROCESS,
    ),
    command(
        ngx_string(c"thread_pool_process_by_lua_file"),
        TAKE2_MAIN,
        conf::set_chunk,
        PROCESS | FILE,
    ),
    command(
        ngx_string(c"thread_pool_init_by_lua_block"),
        BLOCK_MAIN,
        conf::set_chunk,
        INIT | BLOCK,
    ),
    command(
        ngx_string(c"thread_pool_process_by_lua_block"),
        BLOCK_MAIN,
        conf::set_chunk,
        PROCESS | BLOCK,
    ),
    command(
        ngx_string(c"thread_pool_update_by_lua"),
        TAKE2_MAIN,
        conf::set_chunk,
        UPDATE,
    ),
    command(
        ngx_string(c"thread_pool_update_by_lua_file"),
        TAKE2_MAIN,
        conf::set_chunk,
        UPDATE | FILE,
    ),
    command(
        ngx_string(c"thread_pool_update_by_lua_block"),
        BLOCK_MAIN,
        conf::set_chunk,
        UPDATE | BLOCK,
    ),
    command(
        ngx_string(c"thread_pool_process_by_rust"),
        sys::NGX_HTTP_MAIN_CONF | sys::NGX_CONF_TAKE23,
        conf::set_native,
        0,
    ),
    command(
        ngx_string(c"lua_thread_pool"),
        sys::NGX_HTTP_MAIN_CONF | sys::NGX_CONF_TAKE23,
        conf::set_pool,
        0,
    ),
    command(
        ngx_string(c"thread_pool_accept_gate"),
        sys::NGX_HTTP_MAIN_CONF | sys::NGX_CONF_1MORE,
        conf::set_accept_gate,
        0,
    ),
    command(
        ngx_string(c"thread_pool_shadow"),
        sys::NGX_HTTP_MAIN_CONF | sys::NGX_CONF_TAKE2 | sys::NGX_CONF_TAKE3 | sys::NGX_CONF_TAKE4,
        conf::set_shadow,
        0,
    ),
    command(
        ngx_string(c"thread_pool_status"),
        sys::NGX_HTTP_LOC_CONF | sys::NGX_CONF_NOARGS,
        status::set_status,
        0,
    ),
];

const COMMAND_COUNT: usize = COMMANDS_BUT_SETTINGS.len() + settings::DIRECTIVES.len() + 1;

static mut COMMANDS: [sys::ngx_command_t; COMMAND_COUNT] = commands();

/// Every directive: COMMANDS_BUT_SETTINGS, one per setting, the end mark.
const fn commands() -> [sys::ngx_command_t; COMMAND_COUNT] {
    let mut all = [NULL_COMMAND; COMMAND_COUNT];
    let mut i = 0;
    while i < COMMANDS_BUT_SETTINGS.len() {
        all[i] = COMMANDS_BUT_SETTINGS[i];
        i += 1;
    }
    let mut j = 0;
    while j < settings::DIRECTIVES.len() {
        let d = &settings::DIRECTIVES[j];
        all[i + j] = command(
            ngx_string(d.name),
            sys::NGX_HTTP_MAIN_CONF | d.args,
            conf::set_setting,
            j,
        );
        j += 1;
    }
    all
}

static mut HTTP_CTX: sys::ngx_http_module_t = sys::ngx_http_module_t {
    preconfiguration: None,
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(create_main_conf),
    init_main_conf: Some(init_main_conf),
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: None,
    merge_loc_conf: None,
};

#[no_mangle]
pub static mut ngx_threadpool_module: sys::ngx_module_t = {
    let mut m = module(
        &raw mut HTTP_CTX as *mut c_void,
        &raw mut COMMANDS as *mut sys::ngx_command_t,
        sys::NGX_HTTP_MODULE,
    );
    m.init_module = Some(init_module);
    m.init_process = Some(init_process);
    m.exit_process = Some(exit_process);
    m
};

/// What nginx's dlopen looks for in a dynamic module.
#[no_mangle]
pub static mut ngx_modules: [*const sys::ngx_module_t; 2] =
    [&raw const ngx_threadpool_module, ptr::null()];

#[no_mangle]
pub static mut ngx_module_names: [*const c_char; 2] =
    [c"ngx_threadpool_module".as_ptr(), ptr::null()];

unsafe extern "C" fn create_main_conf(cf: *mut sys::ngx_conf_t) -> *mut c_void {
    ngx::guard::no_unwind("create_main_conf", ptr::null_mut(), || {
        ngx::module::register_own(&raw mut ngx_threadpool_module);
        // SAFETY: nginx passes the configuration being parsed.
        let parsing = unsafe { ngx::conf::Conf::from_raw(cf) };
        if let Err(msg) = ngx::lua_symbols::link(parsing) {
            parsing.emerg(&msg);
            return ptr::null_mut();
        }

        // SAFETY: cf->pool is the new cycle's pool: the conf is dropped with
        // it at the next reload.
        unsafe { ngx::palloc::adopt((*cf).pool, MainConf::default()) }
            .map_or(ptr::null_mut(), |p| p.as_ptr().cast())
    })
}

/// The http block is read: the shim's C functions for lua-nginx-module's
/// VMs. Every main conf exists now, the lua module's included, and no
/// postconfiguration has run yet: the lua module's, which may create its
/// VM and run init_by_lua, comes later.
unsafe extern "C" fn init_main_conf(cf: *mut sys::ngx_conf_t, _conf: *mut c_void) -> *mut c_char {
    ngx::guard::no_unwind("init_main_conf", NGX_CONF_ERROR, || {
        // SAFETY: nginx passes the configuration being parsed.
        let parsing = unsafe { ngx::conf::Conf::from_raw(cf) };
        if ngx::lua::add_preload(parsing, api::PACKAGE, api::open) {
            NGX_CONF_OK
        } else {
            NGX_CONF_ERROR
        }
    })
}

/// End of the http block: lua-nginx-module's VM and the shared table of
/// every worker's counters.
unsafe extern "C" fn postconfiguration(cf: *mut sys::ngx_conf_t) -> sys::ngx_int_t {
    ngx::guard::no_unwind(
        "postconfiguration",
        sys::NGX_ERROR as sys::ngx_int_t,
        || {
            // SAFETY: nginx passes the configuration being parsed, whose http
            // main conf holds our MainConf.
            let Some(conf) = (unsafe { conf::main_conf((*cf).cycle) }) else {
                return sys::NGX_OK as sys::ngx_int_t;
            };
            if conf.pools.is_empty() {
                return sys::NGX_OK as sys::ngx_int_t;
            }
            // SAFETY: cf is the configuration nginx passed to this hook, used
            // only during the call, as from_raw asks.
            conf.lua_vm = ngx::lua::MainVm::of(unsafe { ngx::conf::Conf::from_raw(cf) });
            // SAFETY: cf is the http configuration being parsed, in
            // postconfiguration, where shared zones may be added.
            if !unsafe { conf.add_zones(cf) } {
                return sys::NGX_ERROR as sys::ngx_int_t;
            }
            if conf.gate.is_some() {
                // SAFETY: cf is the http configuration being parsed, in
                // postconfiguration, where a log-phase handler may be added.
                if !unsafe { ngx::accept::add_log_handler(cf) } {
                    return sys::NGX_ERROR as sys::ngx_int_t;
                }
                conf.nudge = ngx::accept::Nudge::create();
            }
            sys::NGX_OK as sys::ngx_int_t
        },
    )
}

/// Master, after the whole configuration is read (also under `nginx -t`):
/// reads the thread_pool declarations and takes our pools from nginx.
unsafe extern "C" fn init_module(cycle: *mut sys::ngx_cycle_t) -> sys::ngx_int_t {
    ngx::guard::no_unwind("init_module", sys::NGX_ERROR as sys::ngx_int_t, || {
        // SAFETY: nginx passes the configured cycle.
        let Some(conf) = (unsafe { conf::main_conf(cycle) }) else {
            return sys::NGX_OK as sys::ngx_int_t;
        };
        // SAFETY: nginx passes the configured cycle to init_module: its http
        // block and location trees are built, as aio_users needs.
        let aio = unsafe { ngx::http_locations::aio_users(cycle) };
        match conf.resolve(&aio) {
            Ok(()) => sys::NGX_OK as sys::ngx_int_t,
            Err(msg) => {
                ngx::log::message(ngx::log::NGX_LOG_EMERG, format_args!("{msg}"));
                sys::NGX_ERROR as sys::ngx_int_t
            }
        }
    })
}

/// Each worker: start the pools (worker/process.rs).
unsafe extern "C" fn init_process(cycle: *mut sys::ngx_cycle_t) -> sys::ngx_int_t {
    ngx::guard::no_unwind("init_process", sys::NGX_ERROR as sys::ngx_int_t, || {
        // SAFETY: nginx passes the worker's cycle.
        let Some(conf) = (unsafe { conf::main_conf(cycle) }) else {
            return sys::NGX_OK as sys::ngx_int_t;
        };
        if conf.pools.is_empty() {
            return sys::NGX_OK as sys::ngx_int_t;
        }
        // SAFETY: init_process of the worker whose cycle this is, on its
        // event loop; the lua module is loaded before this module.
        match unsafe { worker::process::init_process(cycle, conf) } {
            Ok(()) => sys::NGX_OK as sys::ngx_int_t,
            Err(msg) => {
                ngx::log::message(ngx::log::NGX_LOG_EMERG, format_args!("{msg}"));
                sys::NGX_ERROR as sys::ngx_int_t
            }
        }
    })
}

/// Worker exit (quit, reload, terminate): stop and join the threads.
unsafe extern "C" fn exit_process(_cycle: *mut sys::ngx_cycle_t) {
    ngx::guard::no_unwind("exit_process", (), || {
        worker::stop(std::time::Duration::from_secs(5))
    })
}
