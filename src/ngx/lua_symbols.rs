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
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A lua-nginx-module semaphore, opaque here.
#[repr(C)]
pub struct RawSema {
    _opaque: [u8; 0],
}

type Inject = unsafe extern "C" fn(l: *mut lua_State);

/// What the module calls in lua-nginx-module (0.10.23 signatures; the
/// FFI functions are those lua-resty-core declares).
pub struct LuaModule {
    pub module: *const sys::ngx_module_t,
    /// Its public API for other modules (api/ngx_http_lua_api.h): the main
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
    /// The public API for modules that extend ngx_lua (api/ngx_http_lua_api.h).
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
    /// Returns an `ngx_http_lua_regex_t` (see lua_api.rs) or null.
    pub compile_regex: unsafe extern "C" fn(
        pat: *const u8,
        pat_len: usize,
        flags: c_int,
        pcre_opts: c_int,
        errstr: *mut u8,
        errstr_size: usize,
    ) -> *mut c_void,
    /// Takes an `ngx_http_lua_regex_t` from compile_regex.
    pub destroy_regex: unsafe extern "C" fn(re: *mut c_void),
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
    // SAFETY: as in get().
    if unsafe { current.as_ref() }.is_some_and(|t| ptr::eq(t.module, lua)) {
        return Ok(());
    }
    let table = resolve(lua)?;
    LINKED.store(Box::into_raw(Box::new(table)), Ordering::Release);
    Ok(())
}

fn resolve(module: *const sys::ngx_module_t) -> Result<LuaModule, String> {
    // SAFETY: each name below is a function lua-nginx-module exports with
    // the signature of its field (lua-nginx-module 0.10.23's sources and
    // lua-resty-core's cdefs); F is that function pointer type.
    unsafe fn f<F: Copy>(name: &CStr) -> Result<F, String> {
        let p = os::global_symbol(name).ok_or_else(|| {
            format!(
                "ngx_http_lua_module.so has no {}: this module needs \
                 lua-nginx-module 0.10.23 or a compatible version",
                name.to_string_lossy()
            )
        })?;
        // SAFETY: the caller vouches that F is the symbol's type.
        Ok(unsafe { std::mem::transmute_copy(&p.as_ptr()) })
    }
    // SAFETY: see f().
    unsafe {
        Ok(LuaModule {
            module,
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
            inject_config_api: f(c"ngx_http_lua_inject_config_api")?,
            inject_shdict_api: f(c"ngx_http_lua_inject_shdict_api")?,
            worker_pid: f(c"ngx_http_lua_ffi_worker_pid")?,
            worker_id: f(c"ngx_http_lua_ffi_worker_id")?,
            worker_count: f(c"ngx_http_lua_ffi_worker_count")?,
            compile_regex: f(c"ngx_http_lua_ffi_compile_regex")?,
            destroy_regex: f(c"ngx_http_lua_ffi_destroy_regex")?,
        })
    }
}
