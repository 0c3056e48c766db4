//! Walking and building Lua values on the raw stack of a state, for the
//! codec, on the event loop (the caller's coroutine) and in pool threads
//! alike: the encoder walks values through `Slot`, the decoder's `Op`s are
//! pushed by `build`.
//!
//! Lua errors unwind through these frames (LuaJIT throws them as foreign
//! exceptions on x64), so what may raise and what may not is part of each
//! function's contract. The walk never raises: it reads, and pushes only
//! into slots reserved beforehand (`reserve`, which may raise), without
//! allocating. `build` allocates and may raise (out of memory, or the
//! error of a `__gc` finalizer that an allocation's collector step runs);
//! it owns nothing and panics nowhere, so it needs no guard and leaves
//! nothing half-owned behind.

use mlua::ffi::{self, lua_State};
use std::ffi::{c_int, c_void};

/// Makes room for `n` more values on the stack of `l`; false when the
/// stack cannot grow that far.
///
/// # Safety
/// `l` must be a live state of this thread. May raise (out of memory):
/// call it where a Lua error may unwind.
pub unsafe fn reserve(l: *mut lua_State, n: usize) -> bool {
    // SAFETY: l is a live state of this thread, where a Lua error may unwind
    // (the contract): lua_checkstack may raise out of memory.
    c_int::try_from(n).is_ok_and(|n| unsafe { ffi::lua_checkstack(l, n) } != 0)
}

/// A value on the Lua stack, at absolute index `idx`. A walk makes the
/// slots of a table's keys and values once and reads them after each
/// `next` or push, so a Slot is only read while its value is there. The
/// walker reserved enough slots above the top for the deepest walk
/// (`reserve`) before making the first Slot.
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
    /// The value at absolute index `idx` of `l`'s stack, outside any table.
    ///
    /// # Safety
    /// `l` must be a live state of this thread with a value at `idx`, and
    /// every push the walk makes must have a reserved slot.
    pub unsafe fn new(l: *mut lua_State, idx: c_int, ctx: &'a C) -> Slot<'a, C> {
        Slot {
            l,
            idx,
            depth: 0,
            ctx,
        }
    }

    pub fn lua_type(&self) -> c_int {
        // SAFETY: `l` and `idx` are valid (Slot's invariant).
        unsafe { ffi::lua_type(self.l, self.idx) }
    }

    pub fn boolean(&self) -> bool {
        // SAFETY: `l` and `idx` are valid (Slot's invariant); lua_toboolean
        // only reads the slot.
        unsafe { ffi::lua_toboolean(self.l, self.idx) != 0 }
    }

    /// The number, for a number value (other types would be converted).
    pub fn number(&self) -> f64 {
        // SAFETY: `l` and `idx` are valid (Slot's invariant); lua_tonumber on
        // a number reads it, allocating nothing.
        unsafe { ffi::lua_tonumber(self.l, self.idx) }
    }

    /// The bytes of a string value.
    pub fn bytes(&self) -> &[u8] {
        let mut len = 0;
        // SAFETY: `l` and `idx` are valid (Slot's invariant); for a string
        // value lua_tolstring neither converts nor allocates, and the string
        // stays on the stack while callers use the bytes (they use them at
        // once).
        unsafe {
            let p = ffi::lua_tolstring(self.l, self.idx, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }

    /// A border of a table value, as Lua's `#` finds it (t[1] is nil when
    /// it is 0).
    pub fn border(&self) -> usize {
        // SAFETY: `l` and `idx` are valid (Slot's invariant); for a table
        // lua_objlen reads the border without metamethods, allocating nothing.
        unsafe { ffi::lua_objlen(self.l, self.idx) }
    }

    pub fn pointer(&self) -> *const c_void {
        // SAFETY: `l` and `idx` are valid (Slot's invariant); lua_topointer
        // only reads the slot.
        unsafe { ffi::lua_topointer(self.l, self.idx) }
    }

    pub fn is_null(&self) -> bool {
        // SAFETY: `l` and `idx` are valid (Slot's invariant); lua_touserdata
        // only reads the slot.
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
        // reserved (Slot's invariant).  lua_rawgeti does not allocate.
        unsafe { ffi::lua_rawgeti_(self.l, self.idx, i) }
    }

    /// Starts iterating this table: pushes the nil first key for `next`.
    pub fn start_pairs(&self) {
        // SAFETY: `l` is valid; a slot is reserved (Slot's invariant).
        unsafe { ffi::lua_pushnil(self.l) }
    }

    /// Stores this value in `t[i]`, `t` a table at absolute index `table`
    /// with room for `i` in its array part (so nothing is allocated).
    pub fn store_in(&self, table: c_int, i: c_int) {
        // SAFETY: `l`/`idx` are valid and a slot is reserved for the copy;
        // `table` holds a table whose array part has index i (the caller's
        // word), so lua_rawseti neither allocates nor raises.
        unsafe {
            ffi::lua_pushvalue(self.l, self.idx);
            ffi::lua_rawseti_(self.l, table, i);
        }
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

/// One step of building decoded values: the decoder checks a whole
/// payload into these before anything is pushed, so a bad payload pushes
/// nothing, and pushing them is a loop with nothing left to check.
#[derive(Clone, Copy, Debug)]
pub enum Op<'a> {
    /// ngx.null (the NULL light userdata).
    Null,
    Bool(bool),
    Number(f64),
    Bytes(&'a [u8]),
    /// A new table with room for this many array and hash items.
    Table(c_int, c_int),
    /// Pops the value on top into `t[i]` of the table below it.
    SetIndex(c_int),
    /// Pops the key and value on top into the table below them; the
    /// decoder made sure the key is neither nil nor NaN.
    SetField,
    /// Pops the value on top into value slot `i` (1-based) of `build`.
    Place(c_int),
}

/// Pushes `n` values built by `ops` (nil where no Place fills a slot).
/// The decoder's ops need at most `slots` stack slots above the values.
///
/// # Safety
/// `l` must be a live state of this thread; `ops` must come from the
/// decoder (every Set has its table and values below it, every Place is
/// within 1..=n). Allocates, so it may raise: call it where a Lua error
/// may unwind (it leaves the stack with extra values then).
pub unsafe fn build(l: *mut lua_State, n: usize, slots: usize, ops: &[Op]) -> bool {
    // SAFETY: l is a live state of this thread, where a Lua error may unwind,
    // and `ops` come from the decoder (the contract); the slots they need are
    // reserved here first.
    unsafe {
        if !reserve(l, n + slots) {
            return false;
        }
        let base = ffi::lua_gettop(l);
        ffi::lua_settop(l, base + n as c_int);
        run(l, base, ops);
    }
    true
}

/// Runs `ops`: a Place(i) fills slot `base + i`.
///
/// # Safety
/// As build, with the slots `ops` need reserved and, for a Place, its
/// slot on the stack.
pub unsafe fn run(l: *mut lua_State, base: c_int, ops: &[Op]) {
    // SAFETY: l is a live state of this thread with the slots `ops` need
    // reserved, and the ops come from the decoder (the contract): each Set and
    // Place finds what it pops. LuaJIT copies the bytes of a string and reads
    // none when the length is 0 (the pointer is then dangling but non-null).
    unsafe {
        for op in ops {
            match *op {
                Op::Null => ffi::lua_pushlightuserdata(l, std::ptr::null_mut()),
                Op::Bool(b) => ffi::lua_pushboolean(l, c_int::from(b)),
                Op::Number(f) => ffi::lua_pushnumber(l, f),
                Op::Bytes(b) => ffi::lua_pushlstring_(l, b.as_ptr().cast(), b.len()),
                Op::Table(narr, nrec) => ffi::lua_createtable(l, narr, nrec),
                Op::SetIndex(i) => ffi::lua_rawseti_(l, -2, i),
                Op::SetField => ffi::lua_rawset(l, -3),
                Op::Place(i) => ffi::lua_replace(l, base + i),
            }
        }
    }
}
