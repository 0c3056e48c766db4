//! The codec's raw Lua stack layer: the one place where it calls the Lua C
//! API. The encoder walks tables through `Slot`, the decoder builds values
//! through `Builder`; both run inside `Lua::exec_raw`, a protected call, so
//! a Lua error raised here (only out of memory: a pool thread's collector
//! does not run outside its protected calls, see vm/protect.lua) unwinds to
//! exec_raw across these frames, which own nothing that needs dropping.

use super::message::Ctx;
use super::wire::{NEST_SLOTS, NOT_ENOUGH_MEMORY};
use mlua::ffi::{self, lua_State};
use mlua::{Lua, MultiValue, Table};
use std::ffi::{c_int, c_void};

/// Runs `walk` on the table `t` pushed on the raw stack, with NEST_SLOTS
/// slots reserved above it; an error if the stack cannot grow (a Lua
/// error, out of memory).
pub(super) fn walk_table<'c, R>(
    t: &Table,
    ctx: &Ctx<'c>,
    walk: impl FnOnce(Slot<'_, 'c>) -> R,
) -> Result<R, String> {
    let Some(lua) = t.weak_lua().try_upgrade() else {
        return Err("Lua state is closed".to_string());
    };
    let mut res = None;
    // SAFETY: `l` is only used while exec_raw runs the closure, on this
    // thread, with the table as the closure's only stack value.  The one call
    // that can raise (lua_checkstack, out of memory) comes before the
    // closure has made anything; the walk then only pushes into the reserved
    // slots (lua_pushnil, lua_next on tables nobody modifies, lua_rawgeti),
    // reads (lua_type, lua_to*, lua_topointer) and pops, none of which
    // allocates or raises.
    let run = unsafe {
        lua.exec_raw::<()>(t, |l| {
            res = Some(if ffi::lua_checkstack(l, NEST_SLOTS) == 0 {
                Err("Lua stack overflow".to_string())
            } else {
                Ok(walk(Slot {
                    l,
                    idx: ffi::lua_gettop(l),
                    depth: 0,
                    ctx,
                }))
            });
        })
    };
    match res {
        Some(res) => res,
        // The closure did not finish: a Lua error (out of memory).
        None => Err(run.err().map_or_else(String::new, |e| e.to_string())),
    }
}

/// A value on the Lua stack of a running `exec_raw` closure, at absolute
/// index `idx`.  A walk makes the slots of a table's keys and values once and
/// reads them after each `next` or push, so a Slot is only read while its
/// value is there.  The closure reserved NEST_SLOTS slots above the
/// top-level table, enough for the deepest walk the depth limit allows.
#[derive(Clone, Copy)]
pub(super) struct Slot<'a, 'c> {
    l: *mut lua_State,
    pub(super) idx: c_int,
    /// Number of tables enclosing the value.
    pub(super) depth: usize,
    pub(super) ctx: &'a Ctx<'c>,
}

impl<'a, 'c> Slot<'a, 'c> {
    pub(super) fn lua_type(&self) -> c_int {
        // SAFETY: `l` and `idx` are valid (Slot's invariant).
        unsafe { ffi::lua_type(self.l, self.idx) }
    }

    pub(super) fn boolean(&self) -> bool {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_toboolean(self.l, self.idx) != 0 }
    }

    /// The number, for a number value (other types would be converted).
    pub(super) fn number(&self) -> f64 {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_tonumber(self.l, self.idx) }
    }

    /// The bytes of a string value.
    pub(super) fn bytes(&self) -> &[u8] {
        let mut len = 0;
        // SAFETY: as in lua_type; for a string value lua_tolstring neither
        // converts nor allocates, and the string stays on the stack while
        // callers use the bytes (they use them at once).
        unsafe {
            let p = ffi::lua_tolstring(self.l, self.idx, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }

    pub(super) fn pointer(&self) -> *const c_void {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_topointer(self.l, self.idx) }
    }

    pub(super) fn is_null(&self) -> bool {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_touserdata(self.l, self.idx).is_null() }
    }

    /// The index of the top of the stack.
    pub(super) fn top(&self) -> c_int {
        // SAFETY: `l` is valid (Slot's invariant).
        unsafe { ffi::lua_gettop(self.l) }
    }

    /// The value at `idx`, inside this table.
    pub(super) fn at(&self, idx: c_int, depth: usize) -> Slot<'a, 'c> {
        Slot {
            idx,
            depth,
            ..*self
        }
    }

    /// Pops everything above `idx`.
    pub(super) fn pop_to(&self, idx: c_int) {
        // SAFETY: `l` is valid; callers only pop what they pushed.
        unsafe { ffi::lua_settop(self.l, idx) }
    }

    /// Pushes `t[i]` of this table (no metamethods).
    pub(super) fn push_index(&self, i: c_int) {
        // SAFETY: `l`/`idx` are valid and `idx` holds a table; a slot is
        // reserved (NEST_SLOTS).  lua_rawgeti does not allocate.
        unsafe { ffi::lua_rawgeti_(self.l, self.idx, i) }
    }

    /// Starts iterating this table: pushes the nil first key for `next`.
    pub(super) fn start_pairs(&self) {
        // SAFETY: `l` is valid; a slot is reserved (NEST_SLOTS).
        unsafe { ffi::lua_pushnil(self.l) }
    }

    /// Replaces the key on top with the next key and value of this table;
    /// false (and the key popped) at the end.
    pub(super) fn next(&self) -> bool {
        // SAFETY: `idx` holds a table and a key of it (or the starting nil)
        // is on top, as lua_next requires; one more slot is reserved.  No
        // table is modified during the walk, so the key is always valid and
        // lua_next neither raises nor allocates.
        unsafe { ffi::lua_next(self.l, self.idx) != 0 }
    }
}

/// Builds decoded values on the raw stack of a running `exec_raw` closure
/// (see `build_values`). Every push has a reserved slot: NEST_SLOTS above
/// the value being built, enough for the deepest nesting the decoder's
/// depth check allows.
pub(super) struct Builder {
    l: *mut lua_State,
    /// The stack top below the values.
    base: c_int,
}

impl Builder {
    /// Pushes ngx.null (the NULL light userdata).
    pub(super) fn push_null(&self) {
        // SAFETY: a reserved slot (Builder's invariant).
        unsafe { ffi::lua_pushlightuserdata(self.l, std::ptr::null_mut()) }
    }

    pub(super) fn push_bool(&self, b: bool) {
        // SAFETY: a reserved slot.
        unsafe { ffi::lua_pushboolean(self.l, c_int::from(b)) }
    }

    pub(super) fn push_number(&self, f: f64) {
        // SAFETY: a reserved slot.
        unsafe { ffi::lua_pushnumber(self.l, f) }
    }

    pub(super) fn push_bytes(&self, b: &[u8]) {
        // SAFETY: a reserved slot; may raise only out of memory (see the
        // module comment).  LuaJIT copies the bytes and reads none when the
        // length is 0 (the pointer is then dangling but non-null).  The raw
        // lua_pushlstring, as mlua's wrapper also reads the string back.
        unsafe { ffi::lua_pushlstring_(self.l, b.as_ptr().cast(), b.len()) }
    }

    /// Pushes a new table with room for `narr` array and `nrec` hash
    /// items; returns its stack index.
    pub(super) fn push_table(&self, narr: c_int, nrec: c_int) -> c_int {
        // SAFETY: a reserved slot; may raise only out of memory or on a huge
        // size (see the module comment).
        unsafe {
            ffi::lua_createtable(self.l, narr, nrec);
            ffi::lua_gettop(self.l)
        }
    }

    /// Pops the value on top into `t[i]` (the table at stack index `t`).
    pub(super) fn set_index(&self, t: c_int, i: c_int) {
        // SAFETY: the table is at `t` (from push_table) and the element on
        // top of it; lua_rawseti may raise only out of memory.
        unsafe { ffi::lua_rawseti_(self.l, t, i) }
    }

    /// Pops the key and value on top into the table at stack index `t`.
    /// The key must be neither nil nor NaN (the decoder checks).
    pub(super) fn set_field(&self, t: c_int) {
        // SAFETY: the table is at `t`, key and value on top of it, the key
        // valid, so lua_rawset may raise only out of memory.
        unsafe { ffi::lua_rawset(self.l, t) }
    }

    /// Pops the value on top into value slot `pos` (1-based, at most the
    /// `n` of build_values).
    pub(super) fn place(&self, pos: usize) {
        // SAFETY: the value is on top and its slot below it (pos <= n).
        unsafe { ffi::lua_replace(self.l, self.base + pos as c_int) }
    }
}

/// Runs `build` with `n` nil values on the stack of `lua` (and NEST_SLOTS
/// free above them), and returns the values it leaves there. An error from
/// `build` or a Lua error (out of memory) returns no value.
pub(super) fn build_values(
    lua: &Lua,
    n: usize,
    build: impl FnOnce(&Builder) -> Result<(), String>,
) -> Result<MultiValue, String> {
    let mut res = Ok(());
    // SAFETY: `l` is only used while exec_raw runs the closure, on this
    // thread; exec_raw is a protected call.  n <= MAX_VALUES, far below
    // LuaJIT's limit of 8000 slots per frame; lua_checkstack may raise only
    // out of memory.
    let values = unsafe {
        lua.exec_raw::<MultiValue>((), |l| {
            let base = ffi::lua_gettop(l);
            if ffi::lua_checkstack(l, n as c_int + NEST_SLOTS) == 0 {
                res = Err("Lua stack overflow".to_string());
                return;
            }
            // One nil per value; decoded values replace theirs.
            ffi::lua_settop(l, base + n as c_int);
            res = build(&Builder { l, base });
            if res.is_err() {
                ffi::lua_settop(l, base);
            }
        })
    }
    .map_err(|e| match e {
        mlua::Error::MemoryError(_) => NOT_ENOUGH_MEMORY.to_string(),
        other => other.to_string(),
    })?;
    res.map(|()| values)
}
