//! The module's directives and its http main configuration.
//!
//! ```nginx
//! thread_pool_init_by_lua       POOL "code";   # optional, once per thread
//! thread_pool_init_by_lua_file  POOL path.lua;
//! thread_pool_process_by_lua    POOL "code";   # the task handler
//! thread_pool_process_by_lua_file POOL path.lua;
//! thread_pool_init_by_lua_block    POOL { code }   # see block.rs
//! thread_pool_process_by_lua_block POOL { code }
//! thread_pool_update_by_lua       POOL "code";   # applies an update (docs/updates.md)
//! thread_pool_update_by_lua_file  POOL path.lua;
//! thread_pool_update_by_lua_block POOL { code }
//! thread_pool_process_by_rust POOL path.so [CONFIG];   # or a native handler
//! lua_thread_pool NAME threads=N [max_queue=M];
//! thread_pool_slow_task_log POOL time | off;   # and the other settings (settings.rs)
//! thread_pool_accept_gate on | off [high=N] [low=M];
//! thread_pool_shadow POOL SHADOW [sample=RATIO] [log_values=on|off];
//! ```
//! The pool itself is nginx's `thread_pool NAME threads=N [max_queue=M]`.

pub mod block;
mod error;
pub mod settings;

use crate::handoff::job::PoolId;
use crate::handoff::update::{UpdateZone, Wake};
use crate::native::{self, Library};
use crate::ngx::conf::{Conf, NGX_CONF_ERROR, NGX_CONF_OK};
use crate::ngx::http_locations::AioUser;
use crate::ngx::sys;
use crate::ngx::thread_pool::ThreadPool;
use crate::vm::chunk::{self, Chunk, Style};
pub use error::ConfError;
use settings::{lossy, Settings, DIRECTIVES};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// A pool's handler: Lua code, or a native library
/// (`thread_pool_process_by_rust`). A pool runs one kind, never both.
#[derive(Clone)]
pub enum Process {
    Lua(Chunk, Style),
    Native(native::Spec),
}

/// One pool with a handler, as configured.
pub struct PoolConf {
    pub name: String,
    pub pool: ThreadPool,
    pub init: Option<Chunk>,
    pub process: Option<Process>,
    /// `thread_pool_update_by_lua*`: run with an update's arguments.
    pub update: Option<Chunk>,
    /// The directives that set `init` and `process`, for errors naming
    /// them.
    pub init_by: String,
    pub process_by: String,
    /// The first directive naming the pool and where it is, for errors
    /// found after the whole configuration is read.
    pub defined_by: String,
    pub defined_at: String,
    /// Set by the directives of settings.rs.
    pub settings: Settings,
    /// `thread_pool_shadow`: where a share of the pool's tasks runs again.
    pub shadow: Option<ShadowConf>,
    /// From the thread_pool declaration, read at init_module.
    pub threads: usize,
    pub max_queue: usize,
    /// Where the pool's latest update is kept (postconfiguration; None
    /// with `thread_pool_update_size off`).
    pub updates: Option<UpdateZone>,
}

#[derive(Default)]
pub struct MainConf {
    pub pools: Vec<PoolConf>,
    /// Every worker's counters, in shared memory (when there are pools).
    pub status: Option<crate::stats::StatusTable>,
    /// `thread_pool_accept_gate`: None when off.
    pub gate: Option<GateConf>,
    /// The gate's wake-up of paused workers (made at postconfiguration).
    pub nudge: Option<crate::ngx::accept::Nudge>,
    /// lua-nginx-module's main VM, whose package paths the threads get
    /// (found at postconfiguration; None under `nginx -t`).
    pub lua_vm: Option<crate::ngx::lua::MainVm>,
}

/// A pool's shadow as configured.
pub struct ShadowConf {
    /// The shadow's index in MainConf::pools.
    pub pool: PoolId,
    pub options: ShadowOptions,
    /// Where the directive is, for errors found once all is read.
    pub at: String,
}

/// `thread_pool_shadow`'s options.
#[derive(Clone, Copy)]
pub struct ShadowOptions {
    /// `sample=RATIO`: the share of tasks run again, in (0, 1].
    pub sample: f64,
    /// `log_values=on`: a mismatch's log line shows the arguments and
    /// results (request data) instead of their lengths and digests.
    pub log_values: bool,
}

/// The accept gate's marks as configured (None: derived from the threads).
#[derive(Default, Clone, Copy)]
pub struct GateConf {
    pub high: Option<usize>,
    pub low: Option<usize>,
}

/// The pools' main conf in `cycle`, if the configuration has an http block.
///
/// # Safety
/// `cycle` must be live and configured.
pub unsafe fn main_conf<'a>(cycle: *mut sys::ngx_cycle_t) -> Option<&'a mut MainConf> {
    // SAFETY: our slot holds the MainConf from create_main_conf (lib.rs).
    unsafe {
        (crate::ngx::conf::http_main_conf(cycle, crate::ngx::module::own()) as *mut MainConf)
            .as_mut()
    }
}

/// The running configuration's main conf (None without an http block).
pub fn running() -> Option<&'static MainConf> {
    // SAFETY: ngx_cycle is the running, configured cycle, whose main conf
    // lives as long as the process uses this configuration.
    unsafe { main_conf(sys::ngx_cycle) }.map(|c| &*c)
}

/// The pools of the running configuration (none without an http block).
pub fn running_pools() -> &'static [PoolConf] {
    running().map_or(&[], |c| &c.pools)
}

/// What a setter sets, carried in the command's `post` field.
pub const INIT: usize = 0;
pub const PROCESS: usize = 1;
pub const UPDATE: usize = 8;
/// Added to INIT/PROCESS/UPDATE: the argument is a file name.
pub const FILE: usize = 2;
/// Added to INIT/PROCESS/UPDATE: the code is the `{ ... }` block that
/// follows.
pub const BLOCK: usize = 4;

impl MainConf {
    fn pool_mut(&mut self, cf: Conf, name: &[u8]) -> Result<&mut PoolConf, ConfError> {
        let i = self.pool_index(cf, name)?;
        Ok(&mut self.pools[i])
    }

    /// The index of pool `name`, added at its first mention.
    fn pool_index(&mut self, cf: Conf, name: &[u8]) -> Result<usize, ConfError> {
        if let Some(i) = self.pools.iter().position(|p| p.name.as_bytes() == name) {
            return Ok(i);
        }
        let text = std::str::from_utf8(name).map_err(|_| ConfError::PoolNameNotUtf8)?;
        // SAFETY: cf is the configuration being parsed.
        let pool = unsafe { ThreadPool::add(cf.raw(), name) }.ok_or(ConfError::NoMemory)?;
        self.pools.push(PoolConf {
            name: text.into(),
            pool,
            init: None,
            process: None,
            update: None,
            init_by: String::new(),
            process_by: String::new(),
            defined_by: cf.args().first().map(|d| lossy(d)).unwrap_or_default(),
            defined_at: cf.file_line(),
            settings: Settings::default(),
            shadow: None,
            threads: 0,
            max_queue: 0,
            updates: None,
        });
        Ok(self.pools.len() - 1)
    }

    /// Adds the shared memory of every pool's updates and of the status
    /// table (postconfiguration): false if nginx refused a zone.
    ///
    /// # Safety
    /// `cf` must be the http configuration being parsed, in
    /// postconfiguration.
    pub unsafe fn add_zones(&mut self, cf: *mut sys::ngx_conf_t) -> bool {
        let mut wake = None;
        for p in &mut self.pools {
            if let Some(size) = p.settings.update_size {
                // SAFETY: the caller's contract.
                let Some(w) = wake.or_else(|| unsafe { Wake::add(cf) }) else {
                    return false;
                };
                wake = Some(w);
                // SAFETY: the caller's contract.
                p.updates = unsafe { UpdateZone::add(cf, &p.name, size, w) };
                if p.updates.is_none() {
                    return false;
                }
            }
        }
        let slots = self
            .pools
            .iter()
            .map(|p| {
                p.pool
                    .declared_threads(p.name.as_bytes())
                    .unwrap_or(crate::stats::UNKNOWN_THREADS)
            })
            .collect();
        // SAFETY: the caller's contract.
        self.status = unsafe { crate::stats::StatusTable::add(cf, slots) };
        self.status.is_some()
    }

    /// Reads each pool's declaration and takes it from nginx (init_module).
    /// `aio` lists the pools nginx's own file I/O uses: a pool this module
    /// runs has no thread that would take nginx's tasks.
    pub fn resolve(&mut self, aio: &[AioUser]) -> Result<(), ConfError> {
        for p in &mut self.pools {
            if p.process.is_none() {
                return Err(ConfError::NoProcess {
                    pool: p.name.clone(),
                    by: p.defined_by.clone(),
                    at: p.defined_at.clone(),
                });
            }
            if let Some(user) = aio.iter().find(|u| p.pool.is(u.pool)) {
                let place = if user.location.is_empty() {
                    "a server".to_string()
                } else {
                    format!("location \"{}\"", user.location)
                };
                return Err(ConfError::SharedWithAio {
                    pool: p.name.clone(),
                    by: short_name(&p.process_by).into(),
                    place,
                    at: p.defined_at.clone(),
                });
            }
            let (threads, max_queue) = p.pool.take(p.name.as_bytes()).map_err(ConfError::Layout)?;
            p.threads = threads;
            p.max_queue = max_queue;
        }
        // A shadow's own shadow would run tasks of neither pool's callers,
        // and a cycle would keep both pools' channels open at exit.
        for p in &self.pools {
            if let Some(s) = &p.shadow {
                let shadow = &self.pools[s.pool];
                if shadow.shadow.is_some() {
                    return Err(ConfError::ShadowChain {
                        pool: p.name.clone(),
                        shadow: shadow.name.clone(),
                        at: s.at.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Runs a directive's `set` on our main conf: nginx prints its error as
/// `"<directive>" directive <error> in <file>:<line>`.
///
/// # Safety
/// `cf` and `conf` as nginx passes them to a setter of ours.
unsafe fn setter(
    cf: *mut sys::ngx_conf_t,
    conf: *mut c_void,
    set: impl FnOnce(Conf, &mut MainConf) -> Result<(), ConfError>,
) -> *mut c_char {
    crate::ngx::guard::no_unwind("directive", NGX_CONF_ERROR, || {
        // SAFETY: nginx passes the parsed configuration and our main conf
        // (created by create_main_conf).
        let (cf, main) = unsafe { (Conf::from_raw(cf), &mut *(conf as *mut MainConf)) };
        match set(cf, main) {
            Ok(()) => NGX_CONF_OK,
            Err(e) => cf.error(&e.to_string()),
        }
    })
}

/// Defines `$name`, the setter nginx calls for a directive of our main
/// conf, which runs `$set` through `setter`.
macro_rules! main_conf_setter {
    ($name:ident, $set:ident) => {
        /// # Safety
        /// Called by nginx only, with `conf` our MainConf.
        pub unsafe extern "C" fn $name(
            cf: *mut sys::ngx_conf_t,
            _cmd: *mut sys::ngx_command_t,
            conf: *mut c_void,
        ) -> *mut c_char {
            // SAFETY: nginx calls a setter with the configuration being parsed
            // and `conf` our MainConf (the contract), what setter needs.
            unsafe { setter(cf, conf, $set) }
        }
    };
}

/// The setter of every directive of settings.rs, whose command's `post`
/// is its index in DIRECTIVES.
///
/// # Safety
/// Called by nginx only, with `conf` our MainConf.
pub unsafe extern "C" fn set_setting(
    cf: *mut sys::ngx_conf_t,
    cmd: *mut sys::ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx passes this command, whose post is its entry.
    let directive = &DIRECTIVES[unsafe { (*cmd).post as usize }];
    // SAFETY: nginx calls a setter with the configuration being parsed and
    // `conf` our MainConf (the contract), what setter needs.
    unsafe {
        setter(cf, conf, |cf, main| {
            let args = cf.args();
            let settings = &mut main.pool_mut(cf, args[1])?.settings;
            (directive.parse)(settings, cf, &args[2..])
        })
    }
}

main_conf_setter!(set_accept_gate, accept_gate);

/// `thread_pool_accept_gate on | off [high=N] [low=M];`.
fn accept_gate(cf: Conf, main: &mut MainConf) -> Result<(), ConfError> {
    let args = cf.args();
    let mut gate = GateConf::default();
    let on = match args[1] {
        b"on" => true,
        b"off" => false,
        other => return Err(ConfError::BadGateParameter(lossy(other))),
    };
    for arg in &args[2..] {
        let arg = lossy(arg);
        let number = |prefix: &str| arg.strip_prefix(prefix)?.parse::<usize>().ok();
        if let Some(n) = number("high=").filter(|&n| n > 0) {
            gate.high = Some(n);
        } else if let Some(n) = number("low=") {
            gate.low = Some(n);
        } else {
            return Err(ConfError::BadGateParameter(arg));
        }
    }
    if let (Some(high), Some(low)) = (gate.high, gate.low) {
        if low >= high {
            return Err(ConfError::BadGateParameter(format!(
                "low={low} is not below high={high}"
            )));
        }
    }
    main.gate = on.then_some(gate);
    Ok(())
}

main_conf_setter!(set_shadow, shadow);

/// `thread_pool_shadow POOL SHADOW [sample=RATIO] [log_values=on|off];`.
fn shadow(cf: Conf, main: &mut MainConf) -> Result<(), ConfError> {
    let args = cf.args();
    let mut options = ShadowOptions {
        sample: 1.0,
        log_values: false,
    };
    for arg in args.iter().skip(3).map(|a| lossy(a)) {
        if let Some(ratio) = arg.strip_prefix("sample=") {
            options.sample = ratio
                .parse::<f64>()
                .ok()
                .filter(|r| *r > 0.0 && *r <= 1.0)
                .ok_or(ConfError::BadShadowOption(arg))?;
        } else {
            options.log_values = match arg.strip_prefix("log_values=") {
                Some("on") => true,
                Some("off") => false,
                _ => return Err(ConfError::BadShadowOption(arg)),
            };
        }
    }
    if args[1] == args[2] {
        return Err(ConfError::ShadowOfItself(lossy(args[1])));
    }
    let shadow = main.pool_index(cf, args[2])?;
    let pool = main.pool_mut(cf, args[1])?;
    if pool.shadow.is_some() {
        return Err(ConfError::Duplicate {
            pool: pool.name.clone(),
        });
    }
    pool.shadow = Some(ShadowConf {
        pool: shadow,
        options,
        at: cf.file_line(),
    });
    Ok(())
}

/// nginx's default max_queue of a thread pool.
const DEFAULT_MAX_QUEUE: usize = 65536;

main_conf_setter!(set_pool, declare_pool);

/// `lua_thread_pool NAME threads=N [max_queue=M];` (http):
/// nginx's own declaration, from the http block, so that one conf.d
/// snippet can hold a pool with its handler.
fn declare_pool(cf: Conf, main: &mut MainConf) -> Result<(), ConfError> {
    let args = cf.args();
    let mut threads = None;
    let mut max_queue = DEFAULT_MAX_QUEUE;
    for arg in &args[2..] {
        let arg = lossy(arg);
        let number = |prefix: &str| arg.strip_prefix(prefix)?.parse::<usize>().ok();
        if let Some(n) = number("threads=").filter(|&n| n > 0) {
            threads = Some(n);
        } else if let Some(n) = number("max_queue=").filter(|&n| n > 0) {
            max_queue = n;
        } else {
            return Err(ConfError::BadPoolParameter(arg));
        }
    }
    let threads = threads.ok_or_else(|| ConfError::BadPoolParameter("threads=N missing".into()))?;
    let pool = main.pool_mut(cf, args[1])?;
    pool.pool
        .declare(args[1], threads, max_queue)
        .map_err(ConfError::Layout)
}

/// The setter of every `thread_pool_{init,process}_by_lua[_file]`.
///
/// # Safety
/// Called by nginx only, with `conf` our MainConf.
pub unsafe extern "C" fn set_chunk(
    cf: *mut sys::ngx_conf_t,
    cmd: *mut sys::ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx passes this command, whose post says what it sets.
    let kind = unsafe { (*cmd).post as usize };
    // SAFETY: nginx calls a setter with the configuration being parsed and
    // `conf` our MainConf (the contract), what setter needs.
    unsafe { setter(cf, conf, |cf, main| set_chunk_in(cf, kind, main)) }
}

fn set_chunk_in(cf: Conf, kind: usize, main: &mut MainConf) -> Result<(), ConfError> {
    let args = cf.args();
    let (directive, name) = (lossy(args[0]), args[1]);
    let short = short_name(&directive);
    // The line of a block's `{`: its Lua line 1.
    let block_start = (kind & BLOCK != 0).then(|| cf.line());
    let chunk = if let Some(start) = block_start {
        Chunk {
            code: block::read(cf).map_err(ConfError::Block)?,
            name: format!("={short}({})", cf.position_at(start)),
        }
    } else if kind & FILE != 0 {
        let path = cf.full_path(args[2]);
        let code = std::fs::read(&path).map_err(|err| ConfError::Read {
            path: path.display().to_string(),
            err,
        })?;
        Chunk {
            code,
            name: format!("@{}", path.display()),
        }
    } else {
        Chunk {
            code: args[2].to_vec(),
            name: format!("={short}({})", cf.position()),
        }
    };
    let style = chunk::check(&chunk).map_err(|e| {
        // nginx names the file and the line of the error: for a block, the
        // line of the Lua error itself.
        if let (Some(start), Some(line)) = (block_start, block::error_line(&chunk.name, &e)) {
            cf.set_line(start + line - 1);
        }
        ConfError::Compile(e)
    })?;
    let pool = main.pool_mut(cf, name)?;
    if let Some(Process::Native(_)) = pool.process {
        return Err(pool.mixed_with(&pool.process_by));
    }
    let slot_taken = if kind & UPDATE != 0 {
        pool.update.replace(chunk).is_some()
    } else if kind & PROCESS != 0 {
        pool.process_by = directive;
        pool.process.replace(Process::Lua(chunk, style)).is_some()
    } else {
        pool.init_by = directive;
        pool.init.replace(chunk).is_some()
    };
    if slot_taken {
        return Err(ConfError::Duplicate {
            pool: pool.name.clone(),
        });
    }
    Ok(())
}

/// A Lua directive's name without its `_file` or `_block`.
fn short_name(directive: &str) -> &str {
    directive
        .trim_end_matches("_file")
        .trim_end_matches("_block")
}

impl PoolConf {
    /// The error of a directive of one kind on a pool that `other` gave
    /// the other kind.
    fn mixed_with(&self, other: &str) -> ConfError {
        ConfError::Mixed {
            pool: self.name.clone(),
            other: other.into(),
        }
    }
}

main_conf_setter!(set_native, native);

/// `thread_pool_process_by_rust POOL PATH [CONFIG];`: the library is
/// loaded now, so that `nginx -t` checks it. PATH is relative to the
/// prefix, like nginx's other paths.
fn native(cf: Conf, main: &mut MainConf) -> Result<(), ConfError> {
    let args = cf.args();
    let directive = lossy(args[0]);
    let pool = main.pool_mut(cf, args[1])?;
    match pool.process {
        Some(Process::Native(_)) => {
            return Err(ConfError::Duplicate {
                pool: pool.name.clone(),
            })
        }
        Some(Process::Lua(..)) => return Err(pool.mixed_with(&pool.process_by)),
        None if pool.init.is_some() => return Err(pool.mixed_with(&pool.init_by)),
        None if pool.update.is_some() => return Err(pool.mixed_with("thread_pool_update_by_lua")),
        None => {}
    }
    let library = Library::load(&cf.full_path(args[2])).map_err(ConfError::Library)?;
    pool.process = Some(Process::Native(native::Spec {
        library: Arc::new(library),
        config: args.get(3).map(|c| c.to_vec()),
    }));
    pool.process_by = directive;
    Ok(())
}
