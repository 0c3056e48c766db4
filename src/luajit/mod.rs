//! The raw Lua layer: what calls the Lua C API directly, below mlua's safe
//! API. A pool thread's state (created with the ffi library and a fallible
//! allocator, alloc.rs), protected calls into it (call.rs), and the codec's
//! walks over a raw stack (stack.rs).

mod alloc;
pub mod call;
pub mod stack;

pub use alloc::Swapped as Allocator;

use mlua::Lua;

/// LuaJIT's own message for a failed allocation, used for ours too.
pub const NOT_ENOUGH_MEMORY: &str = "not enough memory";

/// A new state for a pool thread: every standard library with ffi (pool
/// code uses it as event-loop code does), the collector stopped while the
/// module sets the state up (see vm/mod.rs) and the fallible allocator
/// installed. Drop the allocator only after the state.
pub fn new_thread_state() -> mlua::Result<(Lua, Allocator)> {
    let lua = scratch_state();
    lua.gc_stop();
    let allocator = alloc::install(&lua)?;
    Ok((lua, allocator))
}

/// A state with every standard library, ffi and jit included.
pub fn scratch_state() -> Lua {
    // SAFETY: unsafe_new only adds the ffi library, which thread code uses
    // as event-loop code does; the state never leaves its thread.
    unsafe { Lua::unsafe_new() }
}
