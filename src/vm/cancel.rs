//! The pool thread's `resty.threadpool` (cancel.lua): cooperative
//! cancellation and a stream's sends, a Lua handler's side. The pool
//! thread marks the task its state runs (`running`), and the handler reads
//! that mark through `ngx_threadpool_task_cancelled`
//! (`require("resty.threadpool").cancelled()`). The flag is handoff::outcome::Cancel.
//! `send(chunk)` hands a chunk to the stream of the running task
//! (crate::handoff::stream).

use crate::codec::{self, Source};
use crate::handoff::outcome::Cancel;
use crate::handoff::payload::Payload;
use crate::handoff::stream::{self, CANCELLED, NO_STREAM};
use mlua::ffi::{self as lua, lua_State};
use mlua::Lua;
use std::cell::Cell;
use std::ffi::c_int;

thread_local! {
    /// The flag of the task this thread runs now (null between tasks and
    /// on the event loop). Points into the task's Work, which the thread
    /// holds for as long as the mark is set (`running`).
    static RUNNING: Cell<*const Cancel> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` (one task's handler) with `cancel` as this thread's running
/// task's flag; the mark is cleared when `f` returns or unwinds.
pub fn running<R>(cancel: &Cancel, f: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            RUNNING.set(std::ptr::null());
        }
    }
    RUNNING.set(cancel);
    let _clear = Clear;
    f()
}

/// Whether the caller of the task this thread runs gave up: false between
/// tasks, outside pool threads, and on the event loop. Called by handlers
/// through the FFI, possibly in an inner loop: a thread-local read and a
/// load.
#[no_mangle]
pub extern "C" fn ngx_threadpool_task_cancelled() -> bool {
    let running = RUNNING.get();
    // SAFETY: a non-null mark points to the flag of the task this thread
    // runs, whose Work the thread holds until `running` clears the mark.
    !running.is_null() && unsafe { &*running }.is_cancelled()
}

/// Makes `require "resty.threadpool"` in a pool thread give the thread's
/// side of the library (cancel.lua) rather than the event loop's, whose
/// pools a thread cannot push to.
pub fn install(lua: &Lua) -> mlua::Result<()> {
    // SAFETY: send is a lua_CFunction that raises only before it owns
    // anything (see send).
    let send = unsafe { lua.create_c_function(send) }?;
    // SAFETY: as send.
    let receive = unsafe { lua.create_c_function(receive) }?;
    let module: mlua::Value = lua
        .load(include_str!("cancel.lua"))
        .set_name("=ngx_threadpool.threadpool")
        .call((send, receive, env!("CARGO_PKG_VERSION")))?;
    let preload: mlua::Table = lua
        .globals()
        .get::<mlua::Table>("package")?
        .get("preload")?;
    let loader = lua.create_function(move |_, ()| Ok(module.clone()))?;
    preload.set("resty.threadpool", loader)
}

/// `ok, err = send(chunk)`: hands one value to the stream of the task
/// this thread runs, waiting while its reader has as many unread as the
/// stream's bound: true, or nil and "cancelled" at once once the reader
/// let go (or nil and why the value cannot cross). Raises outside a
/// stream's handler, and without a value.
///
/// # Safety
/// Called by Lua, as a lua_CFunction, in a pool thread's state.
unsafe extern "C-unwind" fn send(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with LUA_MINSTACK free slots; the raises
    // happen before anything is owned; the encoding reserves its slots.
    unsafe {
        if lua::lua_gettop(l) != 1 {
            lua::luaL_error(
                l,
                c"bad argument #1 to 'send' (one value expected)".as_ptr(),
            );
        }
        if !stream::with_serving(|s| s.is_some()) {
            lua::lua_pushlstring_(l, NO_STREAM.as_ptr().cast(), NO_STREAM.len());
            lua::lua_error(l);
        }
        let mut chunk = Payload::default();
        let encoded = codec::write_values(
            l,
            Source::Stack(1),
            1,
            "chunk",
            None,
            &mut chunk.bytes,
            &mut chunk.spans,
        );
        let err = match encoded {
            Ok(_) => {
                let sent = stream::with_serving(|s| {
                    s.map(|s| s.send(chunk, crate::handoff::notify::wake))
                });
                if let Some(Ok(_)) = sent {
                    lua::lua_pushboolean(l, 1);
                    return 1;
                }
                CANCELLED.to_string()
            }
            Err(e) => e.to_string(),
        };
        lua::lua_pushnil(l);
        lua::lua_pushlstring_(l, err.as_ptr().cast(), err.len());
        2
    }
}

/// `chunk = receive()`: the next chunk the stream's caller wrote, waiting
/// for it; nil at the end of its input (close_write); nil and "cancelled"
/// at once once the caller let go. Raises outside a stream's handler.
///
/// # Safety
/// Called by Lua, as a lua_CFunction, in a pool thread's state.
unsafe extern "C-unwind" fn receive(l: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; the raise happens before anything is owned;
    // the chunk's values are built by push_values, which reserves its
    // slots (a raise there drops the chunk).
    unsafe {
        if !stream::with_serving(|s| s.is_some()) {
            lua::lua_pushlstring_(l, NO_STREAM.as_ptr().cast(), NO_STREAM.len());
            lua::lua_error(l);
        }
        lua::lua_settop(l, 0);
        let got = stream::with_serving(|s| s.map(|s| s.receive(crate::handoff::notify::wake)));
        let err = match got {
            Some(Ok(Some(chunk))) => match codec::push_values(l, &chunk.bytes, &chunk.spans) {
                Ok(n) => return n as c_int,
                Err(e) => e.to_string(),
            },
            Some(Ok(None)) => return 0,
            _ => CANCELLED.to_string(),
        };
        lua::lua_settop(l, 0);
        lua::lua_pushnil(l);
        lua::lua_pushlstring_(l, err.as_ptr().cast(), err.len());
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_follows_the_running_task() {
        let (a, b) = (Cancel::default(), Cancel::default());
        assert!(!ngx_threadpool_task_cancelled());
        b.cancel();
        running(&a, || assert!(!ngx_threadpool_task_cancelled()));
        running(&b, || assert!(ngx_threadpool_task_cancelled()));
        let unwound = std::panic::catch_unwind(|| running(&b, || panic!("handler")));
        assert!(unwound.is_err());
        assert!(!ngx_threadpool_task_cancelled());
    }
}
