//! lua-nginx-module's symbols, looked up when the configuration is read
//! instead of bound when nginx loads this module.
//!
//! nginx dlopen()s modules with RTLD_NOW: had this module linked the lua
//! module's functions, loading it before `ngx_http_lua_module.so` (or
//! without it) would fail with `undefined symbol: ngx_http_lua_ffi_...`,
//! which does not say what to do. Looked up at the `http {` block, the same
//! mistake gets an emerg that names the fix.

use super::{conf::Conf, module, os, sys};
use mlua::ffi::lua_State;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ops::RangeInclusive;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A lua-nginx-module semaphore, opaque here.
#[repr(C)]
pub struct RawSema {
    _opaque: [u8; 0],
}

type Inject = unsafe extern "C" fn(l: *mut lua_State);

/// The lua-nginx-module releases whose private functions (below) this
/// module was checked against, as `ngx.config.ngx_lua_version` numbers
/// them (0.10.23 is 10023): the signatures, the context bits of lua.rs.
/// Declared once, in Cargo.toml (`[package.metadata.lua-nginx-module]`,
/// which the package's dependency reads too).
pub const LUA_MODULE_VERSIONS: RangeInclusive<i64> =
    version_number(env!("NGX_TP_LUA_OLDEST"))..=version_number(env!("NGX_TP_LUA_NEWEST"));

/// "0.10.23" as 10023, the lua module's numbering.
const fn version_number(text: &str) -> i64 {
    let bytes = text.as_bytes();
    let (mut parts, mut part, mut i) = ([0i64; 3], 0, 0);
    while i < bytes.len() {
        if bytes[i] == b'.' {
            part += 1;
        } else {
            parts[part] = parts[part] * 10 + (bytes[i] - b'0') as i64;
        }
        i += 1;
    }
    parts[0] * 1_000_000 + parts[1] * 1000 + parts[2]
}

/// What the module calls in lua-nginx-module (the signatures of every
/// release in LUA_MODULE_VERSIONS; the FFI functions are those
/// lua-resty-core declares).
pub struct LuaModule {
    pub module: *const sys::ngx_module_t,
    /// `ngx.config.ngx_lua_version`, in LUA_MODULE_VERSIONS.
    pub version: i64,
    /// Where `lua_regex_match_limit` keeps its value (an ngx_int_t) in the
    /// lua module's main conf, as its command table says; None when the
    /// module was built without PCRE.
    pub regex_match_limit_offset: Option<usize>,
    /// The version of the PCRE its ngx.re uses ("8.39 2016-06-14",
    /// "10.42 2022-12-11"); None when it was built without PCRE.
    pub pcre_version: Option<unsafe extern "C" fn() -> *const c_char>,
    /// Its public API for other modules (api/ngx_http_lua_inject.h): the main
    /// VM of the configuration `cf` belongs to, null before the lua
    /// module's postconfiguration made it (and under `nginx -t`).
    pub get_global_state: unsafe extern "C" fn(cf: *mut sys::ngx_conf_t) -> *mut lua_State,
    pub sema_new:
        unsafe extern "C" fn(psem: *mut *mut RawSema, n: c_int, err: *mut *const c_char) -> c_int,
    pub sema_post: unsafe extern "C" fn(sem: *mut RawSema, n: c_int) -> c_int,
    pub sema_wait: unsafe extern "C" fn(
        r: *mut sys::ngx_http_request_t,
        sem: *mut RawSema,
        wait_ms: c_int,
        err: *mut u8,
        errlen: *mut usize,
    ) -> c_int,
    pub sema_gc: unsafe extern "C" fn(sem: *mut RawSema),
    /// Its resources less its waiting coroutines (lua-resty-core's
    /// `semaphore:count()`).
    pub sema_count: unsafe extern "C" fn(sem: *mut RawSema) -> c_int,
    /// The public API for modules that extend ngx_lua (api/ngx_http_lua_inject.h).
    pub get_request: unsafe extern "C" fn(l: *mut lua_State) -> *mut sys::ngx_http_request_t,
    pub add_package_preload: unsafe extern "C" fn(
        cf: *mut sys::ngx_conf_t,
        package: *const c_char,
        func: mlua::ffi::lua_CFunction,
    ) -> sys::ngx_int_t,
    pub get_phase:
        unsafe extern "C" fn(r: *mut sys::ngx_http_request_t, err: *mut *const c_char) -> c_int,
    pub inject_core_consts: Inject,
    pub inject_http_consts: Inject,
    pub inject_log_api: Inject,
    pub inject_string_api: Inject,
    pub inject_config_api: Inject,
    pub inject_shdict_api: unsafe extern "C" fn(lmcf: *mut c_void, l: *mut lua_State),
    pub worker_pid: unsafe extern "C" fn() -> c_int,
    pub worker_id: unsafe extern "C" fn() -> c_int,
    pub worker_count: unsafe extern "C" fn() -> c_int,
}

/// The table of the last configuration read; replaced only when a reload
/// finds the lua module at another address (the old table is leaked, as
/// `get` hands out 'static references).
static LINKED: AtomicPtr<LuaModule> = AtomicPtr::new(ptr::null_mut());

/// lua-nginx-module's functions, as found when the configuration was read.
///
/// # Panics
/// Before `link` succeeded: nginx calls no code that needs the lua module
/// until the configuration has an http block, where `link` runs first.
pub fn get() -> &'static LuaModule {
    // SAFETY: a non-null pointer is a leaked Box, never freed.
    unsafe { LINKED.load(Ordering::Acquire).as_ref() }
        .expect("lua-nginx-module's symbols are looked up at the http block")
}

/// The advice every load-order error ends with.
const ADVICE: &str = "load ngx_http_lua_module.so first: \
     \"load_module modules/ngx_http_lua_module.so;\" must come before this module's \
     load_module (on Debian: libnginx-mod-http-lua's \
     /etc/nginx/modules-enabled/50-mod-http-lua.conf)";

/// Looks the lua module up in the configuration being read (at its `http
/// {`), after this module registered itself: Err with the message for
/// `nginx -t` when it is not loaded, or loaded after this module.
pub fn link(cf: Conf) -> Result<(), String> {
    let lua = os::global_symbol(c"ngx_http_lua_module")
        .map(|p| p.as_ptr().cast::<sys::ngx_module_t>().cast_const());
    // SAFETY: during parsing, cf->cycle->modules holds modules_n module
    // records of the new cycle.
    let modules = unsafe {
        let cycle = (*cf.raw()).cycle;
        std::slice::from_raw_parts((*cycle).modules, (*cycle).modules_n)
    };
    // The symbol may be an earlier cycle's module that this configuration
    // no longer loads: only this cycle's list counts.
    let Some(lua) = lua.filter(|&m| modules.iter().any(|&x| ptr::eq(x, m))) else {
        return Err(format!(
            "this module needs lua-nginx-module, which is not loaded: {ADVICE}"
        ));
    };
    // The list's order is not the load order (the lua module places itself
    // among nginx's filters), but indexes are: nginx gives each module the
    // lowest free one as it loads it when it starts (and under -t); a
    // reload keeps them. The lua module's hooks must run first (its
    // postconfiguration makes the VM that ours looks up, its init_process
    // runs init_worker_by_lua before ours reads the package paths), which
    // its placement happens to give either way: the order is enforced so
    // that it never depends on that.
    // SAFETY: both are module records nginx has registered (above).
    if unsafe { module::own().as_ref() }.is_some_and(|own| own.index < unsafe { (*lua).index }) {
        return Err(format!(
            "ngx_http_lua_module.so is loaded after this module: {ADVICE}"
        ));
    }
    let current = LINKED.load(Ordering::Acquire);
    // SAFETY: LINKED holds null or a leaked Box, never freed.
    if unsafe { current.as_ref() }.is_some_and(|t| ptr::eq(t.module, lua)) {
        return Ok(());
    }
    let table = resolve(lua)?;
    LINKED.store(Box::into_raw(Box::new(table)), Ordering::Release);
    Ok(())
}

fn resolve(module: *const sys::ngx_module_t) -> Result<LuaModule, String> {
    // SAFETY: each name below is a function lua-nginx-module exports with
    // the signature of its field (the sources of every release in
    // LUA_MODULE_VERSIONS, and lua-resty-core's cdefs); F is that function
    // pointer type.
    unsafe fn optional<F: Copy>(name: &CStr) -> Option<F> {
        let p = os::global_symbol(name)?;
        // SAFETY: the caller vouches that F is the symbol's type.
        Some(unsafe { std::mem::transmute_copy(&p.as_ptr()) })
    }
    // SAFETY: the caller vouches that F is the symbol's type.
    unsafe fn f<F: Copy>(name: &CStr) -> Result<F, String> {
        // SAFETY: F is the symbol's type (this function's contract), what
        // optional needs.
        unsafe { optional(name) }.ok_or_else(|| {
            format!(
                "ngx_http_lua_module.so has no {}: {}",
                name.to_string_lossy(),
                supported()
            )
        })
    }
    // SAFETY: lua-nginx-module exports ngx_http_lua_inject_config_api with the
    // Inject signature in every release of LUA_MODULE_VERSIONS.
    let inject_config_api: Inject = unsafe { f(c"ngx_http_lua_inject_config_api")? };
    let version = lua_module_version(inject_config_api)?;
    check_version(version)?;
    // SAFETY: every release of LUA_MODULE_VERSIONS (its version checked just
    // above) exports each name below with the signature of its field
    // (lua-resty-core's cdefs agree).
    unsafe {
        Ok(LuaModule {
            module,
            version,
            regex_match_limit_offset: command_offset(module, b"lua_regex_match_limit"),
            pcre_version: optional(c"ngx_http_lua_ffi_pcre_version"),
            get_global_state: f(c"ngx_http_lua_get_global_state")?,
            sema_new: f(c"ngx_http_lua_ffi_sema_new")?,
            sema_post: f(c"ngx_http_lua_ffi_sema_post")?,
            sema_wait: f(c"ngx_http_lua_ffi_sema_wait")?,
            sema_gc: f(c"ngx_http_lua_ffi_sema_gc")?,
            sema_count: f(c"ngx_http_lua_ffi_sema_count")?,
            get_request: f(c"ngx_http_lua_get_request")?,
            add_package_preload: f(c"ngx_http_lua_add_package_preload")?,
            get_phase: f(c"ngx_http_lua_ffi_get_phase")?,
            inject_core_consts: f(c"ngx_http_lua_inject_core_consts")?,
            inject_http_consts: f(c"ngx_http_lua_inject_http_consts")?,
            inject_log_api: f(c"ngx_http_lua_inject_log_api")?,
            inject_string_api: f(c"ngx_http_lua_inject_string_api")?,
            inject_config_api,
            inject_shdict_api: f(c"ngx_http_lua_inject_shdict_api")?,
            worker_pid: f(c"ngx_http_lua_ffi_worker_pid")?,
            worker_id: f(c"ngx_http_lua_ffi_worker_id")?,
            worker_count: f(c"ngx_http_lua_ffi_worker_count")?,
        })
    }
}

/// What the error for an unknown release says this module supports.
fn supported() -> String {
    format!(
        "this module supports lua-nginx-module {} to {}",
        version_text(*LUA_MODULE_VERSIONS.start()),
        version_text(*LUA_MODULE_VERSIONS.end())
    )
}

/// 10028 as "0.10.28" (the lua module's own numbering).
fn version_text(v: i64) -> String {
    format!("{}.{}.{}", v / 1_000_000, v / 1000 % 1000, v % 1000)
}

/// Err naming the release found and the ones supported when `version` is
/// not in LUA_MODULE_VERSIONS.
fn check_version(version: i64) -> Result<(), String> {
    if LUA_MODULE_VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(format!(
        "the lua-nginx-module loaded is {}: {}",
        version_text(version),
        supported()
    ))
}

/// `ngx.config.ngx_lua_version`, as the lua module's own config API puts
/// it in a table of a scratch state (its public number, read without
/// knowing the module's layout).
fn lua_module_version(inject_config_api: Inject) -> Result<i64, String> {
    let lua = crate::luajit::scratch_state();
    let read = || -> mlua::Result<i64> {
        let ngx = lua.create_table()?;
        // SAFETY: exec_raw runs the closure protected, with `ngx` alone on
        // the stack; the function sets ngx.config to a table of numbers
        // and C functions, reads nothing of a cycle, and leaves the stack
        // as it found it.
        unsafe { lua.exec_raw::<()>(&ngx, |l| inject_config_api(l)) }?;
        ngx.get::<mlua::Table>("config")?.get("ngx_lua_version")
    };
    read().map_err(|e| format!("cannot read lua-nginx-module's version: {e}"))
}

/// The `offset` of the lua module's directive `name` in its main conf,
/// from nginx's public command table; None when the module has no such
/// directive or keeps it elsewhere.
fn command_offset(module: *const sys::ngx_module_t, name: &[u8]) -> Option<usize> {
    // SAFETY: a registered module's `commands` is null or an array ended
    // by an entry with an empty name (ngx_null_command); names are byte
    // strings of `len` bytes.
    unsafe {
        let mut cmd = (*module).commands;
        while !cmd.is_null() && (*cmd).name.len != 0 {
            let n = &(*cmd).name;
            if std::slice::from_raw_parts(n.data, n.len) == name {
                let main = (*cmd).conf == sys::NGX_RS_HTTP_MAIN_CONF_OFFSET;
                // lua-nginx-module built without PCRE gives the directive
                // no storage (offset 0, a handler that ignores it).
                return (main && (*cmd).offset != 0).then_some((*cmd).offset);
            }
            cmd = cmd.add(1);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_outside_the_checked_range_are_refused_by_name() {
        assert!(check_version(10_023).is_ok());
        assert!(check_version(10_029).is_ok());
        assert!(check_version(10_032).is_ok());
        assert_eq!(
            check_version(10_033).unwrap_err(),
            "the lua-nginx-module loaded is 0.10.33: \
             this module supports lua-nginx-module 0.10.23 to 0.10.32"
        );
        assert!(check_version(10_022)
            .unwrap_err()
            .contains("loaded is 0.10.22: "));
    }
}
