//! What the event loop offers: the C functions behind
//! lua/resty/threadpool.lua (`require "ngx_threadpool"`: tasks in
//! functions.rs, streams in streams.rs, updates in updates.rs), and the
//! `thread_pool_status` content handler (status.rs).

pub mod functions;
pub mod status;
pub mod streams;
pub mod updates;

use crate::ngx::lua::waitable_names;
use functions::*;
use mlua::ffi::{self as lua, lua_State};
use std::ffi::{c_int, CStr};
use streams::{close, close_write, push_stream, read, write};
use updates::{update, update_state};

/// The name `require` finds these functions under.
pub const PACKAGE: &CStr = c"ngx_threadpool";

/// Bumped when a function below changes; the shim, which may be installed
/// apart from the module, says which it needs and refuses others (a test
/// below ties the two).
pub const API_VERSION: c_int = 16;

/// The loader `require "ngx_threadpool"` runs: the table of functions.
///
/// # Safety
/// Called by Lua, as a lua_CFunction, on the event loop.
pub unsafe extern "C-unwind" fn open(l: *mut lua_State) -> c_int {
    type F = unsafe extern "C-unwind" fn(*mut lua_State) -> c_int;
    let functions: [(&CStr, F); 16] = [
        (c"pool_id", pool_id),
        (c"stats", stats),
        (c"push", push),
        (c"push_batch", push_batch),
        (c"post", post),
        (c"result", result),
        (c"results", results),
        (c"release", release),
        (c"reap", reap),
        (c"push_stream", push_stream),
        (c"read", read),
        (c"close", close),
        (c"write", write),
        (c"close_write", close_write),
        (c"update", update),
        (c"update_state", update_state),
    ];
    // SAFETY: a loader runs as a Lua function on the event loop, with
    // LUA_MINSTACK free slots; it only pushes and sets fields (raising
    // only out of memory, before anything is made).
    unsafe {
        lua::lua_createtable(l, 0, functions.len() as c_int + 3);
        let module = lua::lua_gettop(l);
        lua::lua_createtable(l, 0, 0);
        lua::lua_pushlstring_(l, c"n".as_ptr(), 1);
        for (name, f) in functions {
            lua::lua_pushvalue(l, module + 1);
            lua::lua_pushvalue(l, module + 2);
            lua::lua_pushcclosure(l, f, 2);
            lua::lua_setfield(l, module, name.as_ptr());
        }
        lua::lua_pushinteger(l, API_VERSION as lua::lua_Integer);
        lua::lua_setfield(l, module, c"version".as_ptr());
        lua::lua_pushlstring_(l, NOT_STARTED.as_ptr().cast(), NOT_STARTED.len());
        lua::lua_setfield(l, module, c"not_started".as_ptr());
        let names = waitable_names();
        lua::lua_pushlstring_(l, names.as_ptr().cast(), names.len());
        lua::lua_setfield(l, module, c"yieldable".as_ptr());
        lua::lua_settop(l, module);
    }
    1
}

#[cfg(test)]
mod tests {
    use super::API_VERSION;

    #[test]
    fn the_shim_needs_this_version() {
        let shim = include_str!("../../lua/resty/threadpool.lua");
        let line = format!("\nlocal API_VERSION = {API_VERSION}\n");
        assert!(
            shim.contains(&line),
            "lua/resty/threadpool.lua lacks {line:?}"
        );
    }
}
