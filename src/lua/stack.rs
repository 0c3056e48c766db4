//! Walking and building Lua values on the raw stack, for the codec: the
//! encoder walks tables through `Slot`, the decoder builds values through
//! `Builder`. Both run inside `Lua::exec_raw`, a protected call, so a Lua
//! error raised here (only out of memory: a pool thread's collector does
//! not run outside its protected calls, see vm/protect.lua) unwinds to
//! exec_raw across these frames, which own nothing that needs dropping.

use super::NOT_ENOUGH_MEMORY;
use mlua::ffi::{self, lua_State};
use mlua::{Lua, MultiValue, Table};
use std::ffi::{c_int, c_void};

/// Runs `walk` on the table `t` pushed on the raw stack, with `slots`
/// slots reserved above it (enough for the deepest walk); an error if the
/// stack cannot grow (a Lua error, out of memory). `ctx` rides along in
/// every Slot, for the walker's own use.
pub fn walk_table<C, R>(
    t: &Table,
    slots: c_int,
    ctx: &C,
    walk: impl FnOnce(Slot<'_, C>) -> R,
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
            res = Some(if ffi::lua_checkstack(l, slots) == 0 {
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
/// value is there.  The closure reserved enough slots above the top-level
/// table for the deepest walk (see walk_table).
pub struct Slot<'a, C> {
    l: *mut lua_State,
    pub idx: c_int,
    /// Number of tables enclosing the value.
    pub depth: usize,
    pub ctx: &'a C,
}

// Copy whatever C is: a Slot only holds a reference to it.
impl<C> Clone for Slot<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Slot<'_, C> {}

impl<'a, C> Slot<'a, C> {
    pub fn lua_type(&self) -> c_int {
        // SAFETY: `l` and `idx` are valid (Slot's invariant).
        unsafe { ffi::lua_type(self.l, self.idx) }
    }

    pub fn boolean(&self) -> bool {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_toboolean(self.l, self.idx) != 0 }
    }

    /// The number, for a number value (other types would be converted).
    pub fn number(&self) -> f64 {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_tonumber(self.l, self.idx) }
    }

    /// The bytes of a string value.
    pub fn bytes(&self) -> &[u8] {
        let mut len = 0;
        // SAFETY: as in lua_type; for a string value lua_tolstring neither
        // converts nor allocates, and the string stays on the stack while
        // callers use the bytes (they use them at once).
        unsafe {
            let p = ffi::lua_tolstring(self.l, self.idx, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }

    pub fn pointer(&self) -> *const c_void {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_topointer(self.l, self.idx) }
    }

    pub fn is_null(&self) -> bool {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_touserdata(self.l, self.idx).is_null() }
    }

    /// The index of the top of the stack.
    pub fn top(&self) -> c_int {
        // SAFETY: `l` is valid (Slot's invariant).
        unsafe { ffi::lua_gettop(self.l) }
    }

    /// The value at `idx`, inside this table.
    pub fn at(&self, idx: c_int, depth: usize) -> Slot<'a, C> {
        Slot {
            idx,
            depth,
            ..*self
        }
    }

    /// Pops everything above `idx`.
    pub fn pop_to(&self, idx: c_int) {
        // SAFETY: `l` is valid; callers only pop what they pushed.
        unsafe { ffi::lua_settop(self.l, idx) }
    }

    /// Pushes `t[i]` of this table (no metamethods).
    pub fn push_index(&self, i: c_int) {
        // SAFETY: `l`/`idx` are valid and `idx` holds a table; a slot is
        // reserved (walk_table).  lua_rawgeti does not allocate.
        unsafe { ffi::lua_rawgeti_(self.l, self.idx, i) }
    }

    /// Starts iterating this table: pushes the nil first key for `next`.
    pub fn start_pairs(&self) {
        // SAFETY: `l` is valid; a slot is reserved (walk_table).
        unsafe { ffi::lua_pushnil(self.l) }
    }

    /// Replaces the key on top with the next key and value of this table;
    /// false (and the key popped) at the end.
    pub fn next(&self) -> bool {
        // SAFETY: `idx` holds a table and a key of it (or the starting nil)
        // is on top, as lua_next requires; one more slot is reserved.  No
        // table is modified during the walk, so the key is always valid and
        // lua_next neither raises nor allocates.
        unsafe { ffi::lua_next(self.l, self.idx) != 0 }
    }
}

/// Builds decoded values on the raw stack of a running `exec_raw` closure
/// (see `build_values`). Every push has a reserved slot: `slots` above the
/// value being built, enough for the deepest nesting the decoder allows.
pub struct Builder {
    l: *mut lua_State,
    /// The stack top below the values.
    base: c_int,
}

impl Builder {
    /// Pushes ngx.null (the NULL light userdata).
    pub fn push_null(&self) {
        // SAFETY: a reserved slot (Builder's invariant).
        unsafe { ffi::lua_pushlightuserdata(self.l, std::ptr::null_mut()) }
    }

    pub fn push_bool(&self, b: bool) {
        // SAFETY: a reserved slot.
        unsafe { ffi::lua_pushboolean(self.l, c_int::from(b)) }
    }

    pub fn push_number(&self, f: f64) {
        // SAFETY: a reserved slot.
        unsafe { ffi::lua_pushnumber(self.l, f) }
    }

    pub fn push_bytes(&self, b: &[u8]) {
        // SAFETY: a reserved slot; may raise only out of memory (see the
        // module comment).  LuaJIT copies the bytes and reads none when the
        // length is 0 (the pointer is then dangling but non-null).  The raw
        // lua_pushlstring, as mlua's wrapper also reads the string back.
        unsafe { ffi::lua_pushlstring_(self.l, b.as_ptr().cast(), b.len()) }
    }

    /// Pushes a new table with room for `narr` array and `nrec` hash
    /// items; returns its stack index.
    pub fn push_table(&self, narr: c_int, nrec: c_int) -> c_int {
        // SAFETY: a reserved slot; may raise only out of memory or on a huge
        // size (see the module comment).
        unsafe {
            ffi::lua_createtable(self.l, narr, nrec);
            ffi::lua_gettop(self.l)
        }
    }

    /// Pops the value on top into `t[i]` (the table at stack index `t`).
    pub fn set_index(&self, t: c_int, i: c_int) {
        // SAFETY: the table is at `t` (from push_table) and the element on
        // top of it; lua_rawseti may raise only out of memory.
        unsafe { ffi::lua_rawseti_(self.l, t, i) }
    }

    /// Pops the key and value on top into the table at stack index `t`.
    /// The key must be neither nil nor NaN (the decoder checks).
    pub fn set_field(&self, t: c_int) {
        // SAFETY: the table is at `t`, key and value on top of it, the key
        // valid, so lua_rawset may raise only out of memory.
        unsafe { ffi::lua_rawset(self.l, t) }
    }

    /// Pops the value on top into value slot `pos` (1-based, at most the
    /// `n` of build_values).
    pub fn place(&self, pos: usize) {
        // SAFETY: the value is on top and its slot below it (pos <= n).
        unsafe { ffi::lua_replace(self.l, self.base + pos as c_int) }
    }
}

/// Runs `build` with `n` nil values on the stack of `lua` (and `slots`
/// free above them, enough for the deepest value), and returns the values
/// it leaves there. An error from `build` or a Lua error (out of memory)
/// returns no value.
pub fn build_values(
    lua: &Lua,
    n: usize,
    slots: c_int,
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
            if ffi::lua_checkstack(l, n as c_int + slots) == 0 {
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
