//! What the module uses of lua-nginx-module, which must be loaded first:
//! its semaphores (to resume a waiting coroutine from the event loop) and
//! its main Lua VM (to give pool threads the same package paths).

use super::conf::Conf;
use super::lua_symbols::{get as lua_module, RawSema};
use super::sys;
use mlua::ffi as lua;
use std::ffi::{c_char, c_int, CStr};
use std::ptr::{self, NonNull};

/// Makes `require(package)` in lua-nginx-module's VMs run `open`, through
/// its public API for modules that extend it: false when it fails (out of
/// memory). The name must live as long as the process (the lua module
/// keeps the pointer for the VMs it creates later).
pub fn add_preload(
    cf: super::conf::Conf,
    package: &'static CStr,
    open: lua::lua_CFunction,
) -> bool {
    // SAFETY: cf is the configuration being parsed, at the end of its http
    // block (postconfiguration: the lua module's main conf exists); the
    // name is static.
    let rc = unsafe { (lua_module().add_package_preload)(cf.raw(), package.as_ptr(), open) };
    rc == sys::NGX_OK as sys::ngx_int_t
}

/// The request of the coroutine `l` runs for (null outside a request).
///
/// # Safety
/// `l` must be a coroutine of lua-nginx-module's VM, running now on the
/// event loop.
pub unsafe fn request_of(l: *mut lua::lua_State) -> *mut sys::ngx_http_request_t {
    // SAFETY: l is a coroutine of lua-nginx-module's VM running now on the
    // event loop (the contract), the only state get_request reads a request
    // from.
    unsafe { (lua_module().get_request)(l) }
}

/// lua-nginx-module's context bits, as `ngx_http_lua_ffi_get_phase` returns
/// them: its NGX_HTTP_LUA_CONTEXT_* macros of src/ngx_http_lua_common.h.
/// A bit keeps its value in every release from 0.10.23 to 0.10.32; 0.10.29
/// widened the field that holds them to 32 bits and added bits above
/// 0x8000, 0.10.31 the precontent phase. (No header of the lua module is
/// installed for bindgen to read: Debian ships its `.so` only.)
mod contexts {
    use std::ffi::c_int;
    pub const REWRITE: c_int = 0x0002;
    pub const ACCESS: c_int = 0x0004;
    pub const CONTENT: c_int = 0x0008;
    pub const TIMER: c_int = 0x0080;
    pub const INIT_WORKER: c_int = 0x0100;
    pub const SSL_CERT: c_int = 0x0400;
    pub const SERVER_REWRITE: c_int = 0x8000;
    pub const PRECONTENT: c_int = 0x0002_0000;
}

/// A context whose coroutines may wait here: its bit, its name in the
/// shim's error, and the first lua-nginx-module release that has it.
struct Waitable {
    bit: c_int,
    name: &'static str,
    since: i64,
}

impl Waitable {
    const fn new(bit: c_int, name: &'static str, since: i64) -> Waitable {
        Waitable { bit, name, since }
    }
}

/// lua-nginx-module's contexts whose coroutines may wait here, in the
/// order the shim's error names them. Of the others where it lets them
/// wait on its semaphores (its NGX_HTTP_LUA_CONTEXT_YIELDABLE), Debian's
/// nginx and OpenSSL cannot resume a handshake paused in ssl_client_hello
/// (nginx fails it) or ssl_session_fetch (the lua module logs "missing
/// async sess get cb support in OpenSSL"), and proxy_ssl_certificate and
/// proxy_ssl_verify (0.10.29 on) pause an upstream's handshake, which only
/// OpenResty's nginx patches resume and no test here covers: a push there
/// is refused with an error naming the context.
const WAITABLE: [Waitable; 7] = [
    Waitable::new(contexts::REWRITE, "rewrite", 0),
    Waitable::new(contexts::SERVER_REWRITE, "server_rewrite", 0),
    Waitable::new(contexts::ACCESS, "access", 0),
    Waitable::new(contexts::PRECONTENT, "precontent", 10_031),
    Waitable::new(contexts::CONTENT, "content", 0),
    Waitable::new(contexts::TIMER, "timer", 0),
    Waitable::new(contexts::SSL_CERT, "ssl_certificate", 0),
];

/// The contexts of WAITABLE that lua-nginx-module `release` (10031 for
/// 0.10.31) has.
fn waitable_in(release: i64) -> impl Iterator<Item = &'static Waitable> {
    WAITABLE.iter().filter(move |w| w.since <= release)
}

/// The contexts where a push may wait, as the shim's error lists them for
/// the lua module loaded: "rewrite, server_rewrite, ... or ssl_certificate".
pub fn waitable_names() -> String {
    names_in(lua_module().version)
}

fn names_in(release: i64) -> String {
    let names: Vec<_> = waitable_in(release).map(|w| w.name).collect();
    let (last, rest) = names.split_last().expect("WAITABLE is not empty");
    format!("{} or {last}", rest.join(", "))
}

/// Why a push that would wait where its coroutine cannot yield is refused.
pub const NOT_YIELDABLE: &str = "cannot wait here: called from a function that a C function \
     called (a table.sort comparator, a string.gsub callback, a finalizer)";

unsafe extern "C-unwind" {
    /// LuaJIT's: whether the running coroutine may yield from here.
    fn lua_isyieldable(l: *mut lua::lua_State) -> c_int;
}

/// Whether the running coroutine `l` may yield from the C function that
/// asks: not when a C function (table.sort, string.gsub, a finalizer's
/// caller) sits between it and the coroutine's start.
///
/// # Safety
/// `l` must be the running coroutine.
pub unsafe fn may_suspend(l: *mut lua::lua_State) -> bool {
    // SAFETY: l is the running coroutine (the contract); lua_isyieldable only
    // reads its C frame count.
    unsafe { lua_isyieldable(l) != 0 }
}

/// The lua module's context of the Lua handler running for `r` (0 when
/// none).
///
/// # Safety
/// `r` must be the request of the running Lua handler, or null.
unsafe fn context(r: *mut sys::ngx_http_request_t) -> c_int {
    if r.is_null() {
        return 0;
    }
    let mut err = ptr::null();
    // SAFETY: get_phase reads the lua module's request ctx of r.
    unsafe { (lua_module().get_phase)(r, &mut err) }
}

/// Whether the Lua handler running for `r` may wait on a semaphore here
/// (ngx.thread light threads share their request's context).
///
/// # Safety
/// As `context`.
pub unsafe fn may_yield(r: *mut sys::ngx_http_request_t) -> bool {
    // SAFETY: r is the request of the running Lua handler, or null (the
    // contract), as context takes it.
    let context = unsafe { context(r) };
    context > 0 && waitable_in(lua_module().version).any(|w| context & w.bit != 0)
}

/// Whether `r` is the request init_worker_by_lua runs in: before this
/// module's pools start (module order puts them after the lua module's
/// worker start, so that its changes to package.path reach them).
///
/// # Safety
/// As `context`.
pub unsafe fn in_init_worker(r: *mut sys::ngx_http_request_t) -> bool {
    // SAFETY: r is the request of the running Lua handler, or null (the
    // contract), as context takes it.
    unsafe { context(r) == contexts::INIT_WORKER }
}

/// A lua-nginx-module semaphore owned by this module, not by the Lua GC:
/// created and destroyed here, so a pointer to it can never dangle while a
/// task refers to it. Event-loop thread only.
pub struct Sema(NonNull<RawSema>);

impl Sema {
    pub fn new() -> Result<Sema, String> {
        let mut raw = ptr::null_mut();
        let mut err: *const c_char = ptr::null();
        // SAFETY: sema_new fills raw or err; called on the event loop.
        let rc = unsafe { (lua_module().sema_new)(&mut raw, 0, &mut err) };
        match NonNull::new(raw) {
            Some(sem) if rc == sys::NGX_OK as c_int => Ok(Sema(sem)),
            // SAFETY: on failure err points to a static message.
            _ if !err.is_null() => Err(unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()),
            _ => Err("cannot create a semaphore".into()),
        }
    }

    /// Adds one resource and, if a coroutine waits, posts the event that
    /// resumes it; needs no current request.
    pub fn post(&self) {
        // SAFETY: self is a live semaphore; event-loop thread.
        unsafe { (lua_module().sema_post)(self.0.as_ptr(), 1) };
    }

    /// Its resources less its waiting coroutines.
    fn count(&self) -> c_int {
        // SAFETY: self is a live semaphore; event-loop thread.
        unsafe { (lua_module().sema_count)(self.0.as_ptr()) }
    }

    /// Whether a coroutine waits on it. A killed light thread stops
    /// waiting without a word to us: lua-nginx-module's cleanup of the
    /// wait only takes it off the semaphore's queue.
    pub fn has_waiter(&self) -> bool {
        self.count() < 0
    }

    /// Takes back the resources of posts no one consumed; for a
    /// semaphore no coroutine waits on (a free task record's). A post
    /// stays a resource when its waiter stops waiting before the posted
    /// event that would resume it runs: its light thread killed, or its
    /// timeout expired in the same turn of the event loop (nginx runs
    /// expired timers before posted events). lua-nginx-module's post
    /// adds `n` to the resources and posts its event only for a waiting
    /// coroutine, so with none a post of -n takes n back (lua-resty-core's
    /// Lua wrapper refuses n < 1; the C function does not check).
    pub fn take_back(&self) {
        let left = self.count();
        if left > 0 {
            // SAFETY: self is a live semaphore; event-loop thread. With no
            // coroutine waiting (see above), the post only lowers the
            // resources: no event is posted.
            unsafe { (lua_module().sema_post)(self.0.as_ptr(), -left) };
        }
    }

    /// Waits in the current coroutine of `r`: NGX_OK when a resource was
    /// there, NGX_AGAIN after queueing the coroutine (the caller must yield),
    /// NGX_ERROR with a message in `err` (wrong context).
    ///
    /// # Safety
    /// `r` must be the request of the running Lua handler; `err` must hold
    /// `*errlen` writable bytes.
    pub unsafe fn wait(
        &self,
        r: *mut sys::ngx_http_request_t,
        ms: c_int,
        err: *mut u8,
        errlen: *mut usize,
    ) -> c_int {
        // SAFETY: r is the request of the running Lua handler and `err` holds
        // `*errlen` writable bytes (the contract); the semaphore is alive
        // while self is.
        unsafe { (lua_module().sema_wait)(r, self.0.as_ptr(), ms, err, errlen) }
    }
}

impl Drop for Sema {
    fn drop(&mut self) {
        // SAFETY: created by sema_new and dropped once. gc returns the
        // memory to the lua module's allocator but leaves a posted event
        // on nginx's queue: semaphores are kept for reuse (take_back) and
        // dropped when the worker exits, when no posted event runs.
        unsafe { (lua_module().sema_gc)(self.0.as_ptr()) }
    }
}

/// lua-resty-core as the event loop runs it (MainVm::resty_core).
#[derive(Clone, Debug)]
pub struct RestyCore {
    /// `require("resty.core").version`, e.g. "0.1.25".
    pub version: String,
    /// The longest error text of its ngx.re functions.
    pub regex_max_err_len: usize,
}

/// lua-nginx-module's main Lua VM of one configuration (cycle), found
/// while it is read and used once it is running.
#[derive(Clone, Copy)]
pub struct MainVm {
    state: NonNull<lua::lua_State>,
    /// Its registry, which tells its coroutines from other VMs' (a table
    /// stays where it was made, and a VM never replaces its registry).
    registry: *const std::ffi::c_void,
}

impl MainVm {
    /// The VM of the configuration being read, from the lua module's
    /// public API. It exists from the lua module's postconfiguration
    /// (which runs before ours: see lua_symbols::link) until the cycle's
    /// pool is destroyed; None under `nginx -t` or `-s`, where the lua
    /// module makes none.
    pub fn of(cf: Conf) -> Option<MainVm> {
        // SAFETY: cf is a configuration being read whose http block has
        // the lua module's main conf (link() checked the module is there).
        let state = NonNull::new(unsafe { (lua_module().get_global_state)(cf.raw()) })?;
        // SAFETY: the lua module's main state, alive; reads no stack slot.
        let registry = unsafe { lua::lua_topointer(state.as_ptr(), lua::LUA_REGISTRYINDEX) };
        Some(MainVm { state, registry })
    }

    /// Whether `l` is one of this VM's coroutines. lua-nginx-module runs
    /// Lua in other VMs too: with `lua_code_cache off`, each request gets
    /// a VM of its own, closed with the request (ngx_http_lua_create_ctx).
    ///
    /// # Safety
    /// `l` must be a live Lua state, on its thread.
    pub unsafe fn runs(self, l: *mut lua::lua_State) -> bool {
        // SAFETY: l is a live Lua state on its thread (the contract);
        // lua_topointer on the registry reads no stack slot.
        unsafe { lua::lua_topointer(l, lua::LUA_REGISTRYINDEX) == self.registry }
    }

    /// Its `package.path` and `package.cpath` now: as lua_package_path and
    /// lua_package_cpath made them, with what init_by_lua and
    /// init_worker_by_lua changed when read at init_process.
    ///
    /// # Safety
    /// Event-loop thread of the VM's cycle, with no Lua code running.
    pub unsafe fn package_paths(self) -> Option<(Vec<u8>, Vec<u8>)> {
        let l = self.state.as_ptr();
        let field = |name: &CStr| -> Option<Vec<u8>> {
            // SAFETY: l is the lua module's main state, alive and idle (the
            // caller vouches); the stack is restored.
            unsafe {
                let top = lua::lua_gettop(l);
                lua::lua_getfield(l, lua::LUA_GLOBALSINDEX, c"package".as_ptr());
                let mut out = None;
                if lua::lua_type(l, -1) == lua::LUA_TTABLE {
                    lua::lua_getfield(l, -1, name.as_ptr());
                    let mut len = 0;
                    let s = lua::lua_tolstring(l, -1, &mut len);
                    if !s.is_null() {
                        out = Some(std::slice::from_raw_parts(s as *const u8, len).to_vec());
                    }
                }
                lua::lua_settop(l, top);
                out
            }
        };
        Some((field(c"path")?, field(c"cpath")?))
    }

    /// What pool threads copy of lua-resty-core as the event loop runs it:
    /// its version, and the longest error text its ngx.re returns (its
    /// error buffer differs between releases), found by asking it for a
    /// compile error longer than any buffer. None when the probe fails
    /// (lua-resty-core not loaded, an error).
    ///
    /// # Safety
    /// Event-loop thread of a worker of the VM's cycle, with no Lua code
    /// running.
    pub unsafe fn resty_core(self) -> Option<RestyCore> {
        const PROBE: &[u8] = br#"
            local base = package.loaded["resty.core.base"]
            local _, err = ngx.re.match("", ("x"):rep(1000) .. "(")
            return base and base.version, err and #err
        "#;
        let l = self.state.as_ptr();
        // SAFETY: l is the lua module's main state, idle (the caller
        // vouches); the chunk runs under lua_pcall, with no Rust frame
        // between it and its errors; the stack is restored.
        unsafe {
            let top = lua::lua_gettop(l);
            let mut out = None;
            if lua::luaL_loadbuffer(l, PROBE.as_ptr().cast(), PROBE.len(), c"=probe".as_ptr())
                == lua::LUA_OK
                && lua::lua_pcall(l, 0, 2, 0) == lua::LUA_OK
                && lua::lua_isnumber(l, -1) != 0
            {
                let mut len = 0;
                let version = lua::lua_tolstring(l, -2, &mut len);
                out = (!version.is_null()).then(|| RestyCore {
                    version: String::from_utf8_lossy(std::slice::from_raw_parts(
                        version.cast::<u8>(),
                        len,
                    ))
                    .into_owned(),
                    regex_max_err_len: lua::lua_tointeger(l, -1) as usize,
                });
            }
            lua::lua_settop(l, top);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names_in;

    #[test]
    fn precontent_is_a_waitable_context_from_0_10_31_on() {
        let before = "rewrite, server_rewrite, access, content, timer or ssl_certificate";
        assert_eq!(names_in(10_023), before);
        assert_eq!(names_in(10_029), before);
        assert_eq!(
            names_in(10_031),
            "rewrite, server_rewrite, access, precontent, content, timer or ssl_certificate"
        );
    }
}
