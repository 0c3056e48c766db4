//! The allocator of a pool thread's Lua state: C's malloc family, which
//! returns NULL when memory runs out. mlua's own allocator aborts the
//! process on a failed allocation; with this one LuaJIT raises "not enough
//! memory", which the task's protected call turns into an error value.
//!
//! mlua's allocator is Rust's global allocator, which on Linux is the same
//! malloc, realloc and free: blocks from either can be resized and freed by
//! the other. mlua's allocator (and its bookkeeping) is put back before the
//! state closes, so that mlua frees what it owns.

use mlua::{ffi, Lua};
use std::ffi::c_void;

extern "C" {
    fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn free(ptr: *mut c_void);
}

unsafe extern "C" fn lua_alloc(
    _ud: *mut c_void,
    ptr: *mut c_void,
    _osize: usize,
    nsize: usize,
) -> *mut c_void {
    if nsize == 0 {
        // SAFETY: ptr is null or a block of this allocator family.
        unsafe { free(ptr) };
        std::ptr::null_mut()
    } else {
        // SAFETY: as above; NULL on failure leaves the block as it was.
        unsafe { realloc(ptr, nsize) }
    }
}

/// mlua's allocator and its data, while ours is installed.
pub struct Swapped {
    f: ffi::lua_Alloc,
    ud: *mut c_void,
}

/// Installs the fallible allocator in `lua`; returns what to restore.
pub fn install(lua: &Lua) -> mlua::Result<Swapped> {
    let mut swapped = None;
    // SAFETY: exec_raw gives the main state; get/setallocf neither allocate
    // nor raise, and the state's blocks are compatible (module comment).
    unsafe {
        lua.exec_raw::<()>((), |l| {
            let mut ud = std::ptr::null_mut();
            let f = ffi::lua_getallocf(l, &mut ud);
            ffi::lua_setallocf(l, lua_alloc, std::ptr::null_mut());
            swapped = Some(Swapped { f, ud });
        })?;
    }
    swapped.ok_or_else(|| mlua::Error::RuntimeError("allocator not swapped".into()))
}

/// Puts mlua's allocator back (before the state is closed).
pub fn restore(lua: &Lua, swapped: &Swapped) {
    // SAFETY: as in install.
    let _ = unsafe { lua.exec_raw::<()>((), |l| ffi::lua_setallocf(l, swapped.f, swapped.ud)) };
}
