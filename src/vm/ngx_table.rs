//! Installs the thread's `ngx` table: what lua-nginx-module injects itself
//! (ngx::lua_inject), ngx.log and print (ngx.lua), the request-free API over the
//! lua module's FFI functions (ngx_ffi.lua) and errors for the rest
//! (ngx_unavailable.lua).
//!
//! A LuaJIT state has one C namespace, where the first `ffi.cdef` of a name
//! wins. So that user code may declare any C name with its own types, as it
//! may on the event loop, these chunks declare only `ngx_tp_` names (libc
//! functions renamed with `asm("symbol")`) and lua-resty-core's own
//! declarations of the lua module's functions, which the event loop has
//! too (tests/ffi_namespace.rs).

use crate::ngx::log::{self, Log, NGX_LOG_DEBUG};
use crate::ngx::lua_inject::{self, LuaConf, WorkerInfo};
use mlua::{Lua, Value};

/// What a thread's `ngx` needs from the event loop, taken at init_process.
#[derive(Clone)]
pub struct NgxEnv {
    /// For ngx.shared; None when the lua module has no main conf.
    pub lua_conf: Option<LuaConf>,
    /// For ngx.worker.
    pub worker: WorkerInfo,
    /// For ngx.re.
    pub regex: super::ngx_re::RegexEnv,
    /// lua-resty-core's version, which the thread's `require "resty.core"`
    /// and `require "ngx.re"` report; None when unknown.
    pub resty_core_version: Option<String>,
}

/// Sets the globals `ngx` and `print` in `lua`. Log lines go to `log` with
/// the pool's name, or to stderr when there is none (unit tests).
pub fn install(lua: &Lua, pool: &str, log: Option<Log>, env: &NgxEnv) -> mlua::Result<()> {
    let ngx = lua.create_table()?;
    lua_inject::inject(lua, &ngx, env.lua_conf)?;

    let prim = lua.create_table()?;
    let suffix = log::pool_suffix(pool);
    prim.set(
        "log_write",
        lua.create_function(move |_, (level, msg): (u32, mlua::LuaString)| {
            let mut line = Vec::with_capacity(6 + msg.as_bytes().len() + suffix.len());
            line.extend_from_slice(b"[lua] ");
            line.extend_from_slice(&msg.as_bytes());
            line.extend_from_slice(suffix.as_bytes());
            match log {
                Some(log) => log.write(level, &line),
                None => eprintln!("{}", String::from_utf8_lossy(&line)),
            }
            Ok(())
        })?,
    )?;
    // The most verbose level the log writes: ngx.log checks its arguments
    // only for messages that pass, as the lua module does.
    let log_level = log.map_or(NGX_LOG_DEBUG, |log| {
        (0..=NGX_LOG_DEBUG)
            .rev()
            .find(|&level| log.enabled(level))
            .unwrap_or(0)
    });
    prim.set("log_level", log_level)?;
    prim.set("worker_pid", env.worker.pid)?;
    prim.set("worker_id", env.worker.id)?;
    prim.set("worker_count", env.worker.count)?;

    let print: Value = lua
        .load(include_str!("ngx.lua"))
        .set_name("=ngx_threadpool.ngx")
        .call((&ngx, &prim))?;
    lua.load(include_str!("ngx_ffi.lua"))
        .set_name("=ngx_threadpool.api")
        .call::<()>((&ngx, &prim))?;
    let re_internal = super::ngx_re::install(lua, &ngx, env.regex)?;
    lua.load(include_str!("ngx_unavailable.lua"))
        .set_name("=ngx_threadpool.unavailable")
        .call::<()>(&ngx)?;
    let re_module = lua
        .load(include_str!("ngx_re_module.lua"))
        .set_name("=ngx_threadpool.ngx_re_module")
        .into_function()?;
    lua.load(include_str!("ngx_require.lua"))
        .set_name("=ngx_threadpool.require")
        .call::<()>((re_module, re_internal, env.resty_core_version.as_deref()))?;
    lua.globals().set("ngx", ngx)?;
    lua.globals().set("print", print)?;
    Ok(())
}
