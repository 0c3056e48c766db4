//! The allocator of a pool thread's Lua state: C's malloc family, which
//! returns NULL when memory runs out. mlua's own allocator aborts the
//! process on a failed allocation; with this one LuaJIT raises "not enough
//! memory", which the task's protected call turns into an error value.
//!
//! When memory runs out, the state holds it. So that the module's code in
//! the thread can go on until the state is closed (the task's error value,
//! the decision to rebuild), the first failure spends the state: it frees a
//! reserve the allocator took when it was installed (room in this thread's
//! malloc arena), and from then on every allocation of the state that
//! would grow fails too, so that the handler's Lua, which may catch the
//! error, cannot eat that room again. The thread closes a spent state
//! after the task (thread/run.rs).
//!
//! mlua's allocator is Rust's global allocator, which on Linux is the same
//! malloc, realloc and free: blocks from either can be resized and freed by
//! the other. This allocator stays in place while the state closes (the
//! finalizers that run then allocate through it and fail, not abort), and
//! frees mlua's bookkeeping of its own allocator afterwards (`Drop`).

use mlua::{ffi, Lua};
use std::cell::Cell;
use std::ffi::c_void;

extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn free(ptr: *mut c_void);
}

/// The room a spent state gives back to its thread: enough for what the
/// module's code allocates between the failure and the state's close (an
/// error text or two), with a wide margin.
const RESERVE: usize = 256 << 10;

/// What one state's allocator keeps; only the state's thread touches it.
struct Budget {
    /// Freed at the first failure; null from then on (or if it could not
    /// be taken).
    reserve: Cell<*mut c_void>,
    spent: Cell<bool>,
}

unsafe extern "C" fn lua_alloc(
    ud: *mut c_void,
    ptr: *mut c_void,
    osize: usize,
    nsize: usize,
) -> *mut c_void {
    // SAFETY: ud is the Budget install boxed, alive until the state is
    // closed (Swapped's drop order), used by this thread only.
    let budget = unsafe { &*ud.cast::<Budget>() };
    if nsize == 0 {
        // SAFETY: ptr is null or a block of this allocator family.
        unsafe { free(ptr) };
        return std::ptr::null_mut();
    }
    // LuaJIT passes osize 0 for a new block.
    if budget.spent.get() && (ptr.is_null() || nsize > osize) {
        return std::ptr::null_mut();
    }
    // SAFETY: ptr is null or a block of this allocator family, as realloc
    // needs; NULL on failure leaves the block as it was.
    let p = unsafe { realloc(ptr, nsize) };
    if p.is_null() {
        budget.spent.set(true);
        // SAFETY: the reserve is null or this family's block, freed once.
        unsafe { free(budget.reserve.replace(std::ptr::null_mut())) };
    }
    p
}

/// The fallible allocator installed in a state, and mlua's, which it
/// replaced. Drop it after the state is closed.
pub struct Swapped {
    budget: Box<Budget>,
    /// mlua's data for its allocator (its bookkeeping box), or null.
    ud: *mut c_void,
}

impl Swapped {
    /// Whether an allocation of the state failed: it is spent, and should
    /// be closed before anything else needs memory.
    pub fn spent(&self) -> bool {
        self.budget.spent.get()
    }
}

impl Drop for Swapped {
    fn drop(&mut self) {
        // SAFETY: the state is closed (our contract), so nothing uses its
        // allocator's data: the reserve (if still held) is ours, and mlua's
        // box, which it frees only while its own allocator is installed,
        // came from the global allocator, malloc (module comment).
        unsafe {
            free(self.budget.reserve.replace(std::ptr::null_mut()));
            free(self.ud);
        }
    }
}

/// Installs the fallible allocator in `lua`; drop what it returns only
/// after `lua` is closed.
pub fn install(lua: &Lua) -> mlua::Result<Swapped> {
    let mut swapped = Swapped {
        budget: Box::new(Budget {
            // SAFETY: plain malloc; null (no reserve) is allowed.
            reserve: Cell::new(unsafe { malloc(RESERVE) }),
            spent: Cell::new(false),
        }),
        ud: std::ptr::null_mut(),
    };
    let data = (&raw const *swapped.budget).cast_mut().cast::<c_void>();
    // SAFETY: exec_raw gives the main state; get/setallocf neither allocate
    // nor raise, and the state's blocks are compatible (module comment).
    unsafe {
        lua.exec_raw::<()>((), |l| {
            ffi::lua_getallocf(l, &mut swapped.ud);
            ffi::lua_setallocf(l, lua_alloc, data);
        })?;
    }
    Ok(swapped)
}
