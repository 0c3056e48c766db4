//! Protected calls into a pool thread's state with the raw C API, and the
//! values they leave: what lets the collector run freely in a pool thread.
//!
//! LuaJIT may run a collector step inside any allocation, and a step may
//! run a `__gc` finalizer whose error then propagates from that
//! allocation. Raised outside a protected call, such an error would
//! unwind through the module's Rust frames, which abort on a foreign
//! exception. So once a thread's state is built, every stretch of the
//! module's code that calls the Lua C API runs inside one `lua_pcall` of a
//! C function (`protected`), entered without allocating: the function is
//! made once and kept in the registry, and the call pushes only it and a
//! light userdata. Whatever it raises stops at that boundary.

use mlua::ffi::{self, lua_CFunction, lua_State};
use std::ffi::{c_int, c_void, CStr};

/// How a protected call ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// LuaJIT could not allocate (LUA_ERRMEM).
    OutOfMemory,
    /// Any other error, with its value's text.
    Error(String),
}

/// The registry reference of a C function made once in a state.
#[derive(Clone, Copy)]
pub struct CFunction(c_int);

impl CFunction {
    /// Makes `f` a function of `l` kept in its registry.
    ///
    /// # Safety
    /// `l` must be a live state of this thread, its collector stopped (this
    /// allocates outside a protected call).
    pub unsafe fn new(l: *mut lua_State, f: lua_CFunction) -> CFunction {
        // SAFETY: l is a live state of this thread whose collector is stopped
        // (the contract): the allocations cannot run a finalizer; out of
        // memory here is LuaJIT's panic, as for any state being built.
        unsafe {
            ffi::lua_pushcfunction(l, f);
            CFunction(ffi::luaL_ref(l, ffi::LUA_REGISTRYINDEX))
        }
    }

    /// Calls the function with `ud` as its only argument, protected; it
    /// returns nothing (its results, if any, are dropped).
    ///
    /// # Safety
    /// `l` must be the live state the function was made in, on its
    /// thread, with two free stack slots; `ud` is what the function
    /// expects.
    pub unsafe fn call(self, l: *mut lua_State, ud: *mut c_void) -> Status {
        // SAFETY: l is the live state the function was made in, on its thread,
        // with two free slots (the contract). lua_rawgeti and
        // lua_pushlightuserdata do not allocate, so nothing can raise before
        // lua_pcall has its frame; lua_pcall catches what the function raises
        // and leaves its value on top.
        unsafe {
            let top = ffi::lua_gettop(l);
            ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, self.0);
            ffi::lua_pushlightuserdata(l, ud);
            let status = match ffi::lua_pcall(l, 1, 0, 0) {
                ffi::LUA_OK => Status::Ok,
                ffi::LUA_ERRMEM => Status::OutOfMemory,
                _ => Status::Error(plain_text(l, -1)),
            };
            ffi::lua_settop(l, top);
            status
        }
    }
}

/// The light userdata a C function made by CFunction was called with.
///
/// # Safety
/// `l` must be the state running that function, as its first argument.
pub unsafe fn argument<T>(l: *mut lua_State) -> *mut T {
    // SAFETY: l runs a function CFunction::call called with its light userdata
    // as argument 1 (the contract); lua_touserdata only reads that slot.
    unsafe { ffi::lua_touserdata(l, 1).cast() }
}

/// The text of the error value at `idx`, without calling into Lua: a
/// string or a number as it is, anything else by its type.
///
/// # Safety
/// `l` must be a live state of this thread with a value at `idx`.
pub unsafe fn plain_text(l: *mut lua_State, idx: c_int) -> String {
    // SAFETY: l is a live state of this thread with a value at idx (the
    // contract); lua_tolstring on a string does not convert or allocate
    // (numbers are read with lua_tonumber instead).
    unsafe {
        match ffi::lua_type(l, idx) {
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(l, idx, &mut len);
                String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len))
                    .into_owned()
            }
            ffi::LUA_TNUMBER => ffi::lua_tonumber(l, idx).to_string(),
            t => format!(
                "error object is a {}",
                CStr::from_ptr(ffi::lua_typename(l, t)).to_string_lossy()
            ),
        }
    }
}
