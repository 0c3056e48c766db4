//! MessagePack codec for values crossing between the nginx event loop's
//! LuaJIT VM and the worker threads' LuaJIT VMs.
//!
//! `lua/resty/threadpool/codec.lua` implements the same format on the event
//! loop side; the two must agree byte for byte:
//!
//! ```text
//! payload := uint(n) map(k) { uint(position) value }*k
//! ```
//!
//! `n` is the number of values (`select('#', ...)`); only the non-nil ones
//! are in the map, so nils, trailing ones included, survive the trip.
//! `ngx.null` (the NULL light userdata) is msgpack nil; integral numbers use
//! the smallest int encoding, others float64; strings are always bin; a table
//! whose keys are exactly `1..n` is an array, any other table a map.
//!
//! Tables are walked and built on the raw Lua stack, inside
//! `Lua::exec_raw`, rather than through an mlua `Value` per element: mlua's
//! reference bookkeeping for each value cost more than the codec itself.
//! exec_raw runs its closure in a protected call (lua_pcall), so a Lua error
//! raised inside unwinds to it across our frames (LuaJIT throws with the
//! system unwinder on x64; elsewhere it would longjmp).  That is sound
//! because of what can raise where:
//! - encoding: only the one lua_checkstack at the start (out of memory),
//!   before the closure has made anything; the walk itself only reads and
//!   pushes into the reserved slots, which never allocates;
//! - decoding: lua_createtable, lua_pushlstring, lua_rawset(i) (out of
//!   memory, an error from a `__gc` finalizer that an allocation's GC step
//!   runs, or a size overflow from a huge corrupt payload), and the frames
//!   then between exec_raw and LuaJIT (the closure, rmp_serde's deserializer
//!   over a slice, our seeds) own nothing with a destructor: error strings
//!   only exist after the last Lua call.
//!
//! Nothing leaks, and exec_raw restores the stack; the half-built tables are
//! garbage.
//!
//! Speed in µs per call, mlua values -> raw stack (release build, minimum
//! of 3 x 7 runs on a shared 2-core VM; `codec_speed` in the tests):
//!
//! ```text
//!                           encode            decode
//! 16 B string               0.05 -> 0.05      0.14 -> 0.31
//! 1 KiB string              0.06 -> 0.05      0.15 -> 0.32
//! 64 KiB string             2.17 -> 2.16      1.56 -> 1.70
//! 100 records x 10 strings   439 -> 91         247 -> 90
//! 1000 numbers               124 -> 55          65 -> 18
//! ```
//!
//! A decode now pays ~0.15 µs for exec_raw's protected call.  Most of what
//! tables still cost is LuaJIT's own work behind its C API: interning
//! strings, allocating and filling tables (and collecting them), and when
//! encoding four API calls per element in each of the two passes (count,
//! then write).

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::fmt;
use std::io;

use mlua::ffi::{self, lua_State};
use mlua::{Lua, MultiValue, Table, Value};
use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer as _, MapAccess, SeqAccess, Visitor,
};
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, Serializer};

/// Deepest table nesting that can be passed (a top-level table is level 1).
pub const MAX_DEPTH: usize = 100;

/// Largest payload, in encoded bytes.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// Most values in one payload.  LuaJIT cannot push or `unpack` more than
/// about 8000 values at once, so this leaves room and bounds what a count in
/// a corrupt payload can make the decoder allocate.
pub const MAX_VALUES: usize = 4096;
/// LuaJIT's own message for a failed allocation, used for ours too.
pub const NOT_ENOUGH_MEMORY: &str = "not enough memory";

const TWO63: f64 = 9_223_372_036_854_775_808.0;

/// Lua stack slots that walking or building MAX_DEPTH nested tables needs
/// above the outermost one: at most two per level (key and value while
/// walking a map; table and key while building one) and a leaf.  Reserved
/// once up front, so that pushes need no check each.
const NEST_SLOTS: c_int = 2 * MAX_DEPTH as c_int + 2;

// ---------------------------------------------------------------------------
// Encoding

/// Appends the payload for `values` to `out`.  `what` names the values in
/// error messages ("argument", "return value").  On error `out` is left as
/// it was.
pub fn encode_values(values: &MultiValue, out: &mut Vec<u8>, what: &str) -> Result<(), String> {
    let start = out.len();
    let res = encode_into(values, out, what);
    if res.is_err() {
        out.truncate(start);
    }
    res
}

fn encode_into(values: &MultiValue, out: &mut Vec<u8>, what: &str) -> Result<(), String> {
    let n = values.len();
    // The Lua side only checks this on its multi-value path, where n can be
    // that large; one value always passes, so the order of checks agrees.
    if n > MAX_VALUES {
        return Err(format!("too many {what}s (max {MAX_VALUES})"));
    }
    let k = values.iter().filter(|v| !v.is_nil()).count();

    let written = Cell::new(0);
    let oom = Cell::new(false);
    let mut w = CountingWriter {
        out,
        written: &written,
        oom: &oom,
    };
    // Only running out of memory makes these fail.
    rmp::encode::write_uint(&mut w, n as u64).map_err(|_| NOT_ENOUGH_MEMORY.to_string())?;
    rmp::encode::write_map_len(&mut w, k as u32).map_err(|_| NOT_ENOUGH_MEMORY.to_string())?;

    let ctx = Ctx {
        stack: RefCell::new(Vec::new()),
        written: &written,
        err: RefCell::new(None),
    };
    let mut ser = rmp_serde::Serializer::new(&mut w);
    for (i, v) in values.iter().enumerate() {
        if v.is_nil() {
            continue;
        }
        let pos = i + 1;
        (&mut ser)
            .serialize_u64(pos as u64)
            .map_err(|_| NOT_ENOUGH_MEMORY.to_string())?;
        let enc = Enc { v, ctx: &ctx };
        if let Err(e) = enc.serialize(&mut ser) {
            if oom.get() {
                return Err(NOT_ENOUGH_MEMORY.into());
            }
            return Err(ctx.message(what, pos, e));
        }
    }
    if written.get() > MAX_PAYLOAD {
        return Err(size_message(what));
    }
    Ok(())
}

fn size_message(what: &str) -> String {
    format!("{what}s exceed {MAX_PAYLOAD} bytes")
}

/// Appends to the output and counts the payload's bytes, so that the
/// `Serialize` impls (which never see the writer) can enforce MAX_PAYLOAD.
struct CountingWriter<'a> {
    out: &'a mut Vec<u8>,
    written: &'a Cell<usize>,
    /// Set when the output could not grow: the payload's size comes from
    /// user data, so running out of memory is an error, not an abort.
    oom: &'a Cell<bool>,
}

impl io::Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.out.try_reserve(buf.len()).is_err() {
            self.oom.set(true);
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        self.out.extend_from_slice(buf);
        self.written.set(self.written.get() + buf.len());
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Kind {
    /// Value of this Lua type cannot be passed.
    Type(&'static str),
    /// Table key of this Lua type cannot be passed.
    Key(&'static str),
    Cyclic,
    Deep,
    Size,
    /// A Lua error (out of memory) while walking a table.
    Lua(String),
}

struct EncError {
    kind: Kind,
    /// Path segments, innermost first: they are added while unwinding so
    /// that the success path never formats anything.
    segs: Vec<String>,
}

/// State shared by the whole encoding of one payload.
struct Ctx<'a> {
    /// Tables being visited, to tell a cycle from a shared subtable.
    stack: RefCell<Vec<*const c_void>>,
    /// Bytes of the payload written so far.
    written: &'a Cell<usize>,
    /// The real error; the serializer only carries a placeholder.
    err: RefCell<Option<EncError>>,
}

impl Ctx<'_> {
    fn fail<E: ser::Error>(&self, kind: Kind) -> E {
        *self.err.borrow_mut() = Some(EncError {
            kind,
            segs: Vec::new(),
        });
        E::custom("lua value cannot be encoded")
    }

    fn add_seg(&self, seg: impl FnOnce() -> String) {
        if let Some(e) = self.err.borrow_mut().as_mut() {
            e.segs.push(seg());
        }
    }

    fn message(&self, what: &str, pos: usize, fallback: impl fmt::Display) -> String {
        let Some(e) = self.err.borrow_mut().take() else {
            return format!("cannot encode {what} #{pos}: {fallback}");
        };
        let path: String = e.segs.iter().rev().map(String::as_str).collect();
        let at = if path.is_empty() {
            String::new()
        } else {
            format!(" at {path}")
        };
        match e.kind {
            Kind::Type(t) => format!("cannot pass {t} in {what} #{pos}{at}"),
            Kind::Key(t) => format!("cannot pass table key {t} in {what} #{pos}{at}"),
            Kind::Cyclic => format!("cyclic table in {what} #{pos}{at}"),
            Kind::Deep => format!("table nested deeper than {MAX_DEPTH} in {what} #{pos}{at}"),
            Kind::Size => size_message(what),
            Kind::Lua(msg) => format!("cannot encode {what} #{pos}{at}: {msg}"),
        }
    }
}

/// Lua's `type()` name of a value (mlua says "integer" for some numbers).
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "boolean",
        Value::Integer(_) | Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Table(_) => "table",
        Value::Function(_) => "function",
        Value::Thread(_) => "thread",
        // Error is a userdata inside Lua; light userdata is "userdata" too.
        Value::LightUserData(_) | Value::UserData(_) | Value::Error(_) => "userdata",
        // On LuaJIT the only type mlua does not know is cdata.
        _ => "cdata",
    }
}

/// Lua's `type()` name for a `lua_type` code.
fn lua_type_name(t: c_int) -> &'static str {
    match t {
        ffi::LUA_TNIL => "nil",
        ffi::LUA_TBOOLEAN => "boolean",
        ffi::LUA_TLIGHTUSERDATA | ffi::LUA_TUSERDATA => "userdata",
        ffi::LUA_TNUMBER => "number",
        ffi::LUA_TSTRING => "string",
        ffi::LUA_TTABLE => "table",
        ffi::LUA_TFUNCTION => "function",
        ffi::LUA_TTHREAD => "thread",
        // LuaJIT's only other type a value can have.
        _ => "cdata",
    }
}

/// A top-level value being encoded.
struct Enc<'a, 'c> {
    v: &'a Value,
    ctx: &'a Ctx<'c>,
}

fn bin_header_len(len: usize) -> usize {
    if len < 256 {
        2
    } else if len < 65536 {
        3
    } else {
        5
    }
}

impl Serialize for Enc<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.v {
            Value::Boolean(b) => s.serialize_bool(*b),
            Value::Integer(i) => s.serialize_i64(*i),
            Value::Number(f) => serialize_number(*f, s),
            Value::String(st) => serialize_string(&st.as_bytes(), self.ctx, s),
            Value::Table(t) => serialize_table(t, self.ctx, s),
            // ngx.null; Nil only reaches here if a caller nests it oddly.
            Value::LightUserData(ud) if ud.0.is_null() => s.serialize_unit(),
            Value::Nil => s.serialize_unit(),
            other => Err(self.ctx.fail(Kind::Type(type_name(other)))),
        }
    }
}

/// `f` as an i64 when it is integral and in int64 range.  (Not through
/// `f.trunc()`: without SSE4.1 that is a slow library call.)
fn as_int(f: f64) -> Option<i64> {
    let i = f as i64;
    ((-TWO63..TWO63).contains(&f) && i as f64 == f).then_some(i)
}

fn serialize_number<S: Serializer>(f: f64, s: S) -> Result<S::Ok, S::Error> {
    // Same rule as the Lua side: integral, in int64 range and not -0.0.
    match as_int(f) {
        Some(i) if !(f == 0.0 && f.is_sign_negative()) => s.serialize_i64(i),
        _ => s.serialize_f64(f),
    }
}

fn serialize_string<S: Serializer>(bytes: &[u8], ctx: &Ctx, s: S) -> Result<S::Ok, S::Error> {
    // Checked before copying, so a huge string is never copied just to be
    // refused (and never truncated to a u32 length).
    let total = ctx.written.get() + bin_header_len(bytes.len()) + bytes.len();
    if total > MAX_PAYLOAD {
        return Err(ctx.fail(Kind::Size));
    }
    s.serialize_bytes(bytes)
}

/// Encodes a top-level table: pushes it and walks it on the raw stack.
fn serialize_table<S: Serializer>(t: &Table, ctx: &Ctx, s: S) -> Result<S::Ok, S::Error> {
    let Some(lua) = t.weak_lua().try_upgrade() else {
        return Err(ctx.fail(Kind::Lua("Lua state is closed".to_string())));
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
                Err(ctx.fail(Kind::Lua("Lua stack overflow".to_string())))
            } else {
                let table = Slot {
                    l,
                    idx: ffi::lua_gettop(l),
                    depth: 0,
                    ctx,
                };
                table.serialize(s)
            });
        })
    };
    match res {
        Some(res) => res,
        // The closure did not finish: a Lua error (out of memory).
        None => {
            let msg = run.err().map_or_else(String::new, |e| e.to_string());
            Err(ctx.fail(Kind::Lua(msg)))
        }
    }
}

/// A value on the Lua stack of a running `exec_raw` closure, at absolute
/// index `idx`.  A walk makes the slots of a table's keys and values once and
/// reads them after each `next` or push, so a Slot is only read while its
/// value is there.  The closure reserved NEST_SLOTS slots above the
/// top-level table, enough for the deepest walk the depth limit allows.
#[derive(Clone, Copy)]
struct Slot<'a, 'c> {
    l: *mut lua_State,
    idx: c_int,
    /// Number of tables enclosing the value.
    depth: usize,
    ctx: &'a Ctx<'c>,
}

/// A table key being encoded.
struct Key<'s, 'a, 'c>(&'s Slot<'a, 'c>);

impl<'a, 'c> Slot<'a, 'c> {
    fn lua_type(&self) -> c_int {
        // SAFETY: `l` and `idx` are valid (Slot's invariant).
        unsafe { ffi::lua_type(self.l, self.idx) }
    }

    fn boolean(&self) -> bool {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_toboolean(self.l, self.idx) != 0 }
    }

    /// The number, for a number value (other types would be converted).
    fn number(&self) -> f64 {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_tonumber(self.l, self.idx) }
    }

    /// The bytes of a string value.
    fn bytes(&self) -> &[u8] {
        let mut len = 0;
        // SAFETY: as in lua_type; for a string value lua_tolstring neither
        // converts nor allocates, and the string stays on the stack while
        // callers use the bytes (they use them at once).
        unsafe {
            let p = ffi::lua_tolstring(self.l, self.idx, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }

    fn pointer(&self) -> *const c_void {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_topointer(self.l, self.idx) }
    }

    fn is_null(&self) -> bool {
        // SAFETY: as in lua_type.
        unsafe { ffi::lua_touserdata(self.l, self.idx).is_null() }
    }

    /// The index of the top of the stack.
    fn top(&self) -> c_int {
        // SAFETY: `l` is valid (Slot's invariant).
        unsafe { ffi::lua_gettop(self.l) }
    }

    /// The value at `idx`, inside this table.
    fn at(&self, idx: c_int, depth: usize) -> Slot<'a, 'c> {
        Slot {
            idx,
            depth,
            ..*self
        }
    }

    /// Pops everything above `idx`.
    fn pop_to(&self, idx: c_int) {
        // SAFETY: `l` is valid; callers only pop what they pushed.
        unsafe { ffi::lua_settop(self.l, idx) }
    }

    /// Pushes `t[i]` of this table (no metamethods).
    fn push_index(&self, i: c_int) {
        // SAFETY: `l`/`idx` are valid and `idx` holds a table; a slot is
        // reserved (NEST_SLOTS).  lua_rawgeti does not allocate.
        unsafe { ffi::lua_rawgeti_(self.l, self.idx, i) }
    }

    /// Starts iterating this table: pushes the nil first key for `next`.
    fn start_pairs(&self) {
        // SAFETY: `l` is valid; a slot is reserved (NEST_SLOTS).
        unsafe { ffi::lua_pushnil(self.l) }
    }

    /// Replaces the key on top with the next key and value of this table;
    /// false (and the key popped) at the end.
    fn next(&self) -> bool {
        // SAFETY: `idx` holds a table and a key of it (or the starting nil)
        // is on top, as lua_next requires; one more slot is reserved.  No
        // table is modified during the walk, so the key is always valid and
        // lua_next neither raises nor allocates.
        unsafe { ffi::lua_next(self.l, self.idx) != 0 }
    }
}

impl Serialize for Slot<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.serialize_as(self.lua_type(), s)
    }
}

impl Slot<'_, '_> {
    /// Serializes the value, whose `lua_type` is `ty`.
    fn serialize_as<S: Serializer>(&self, ty: c_int, s: S) -> Result<S::Ok, S::Error> {
        match ty {
            ffi::LUA_TBOOLEAN => s.serialize_bool(self.boolean()),
            ffi::LUA_TNUMBER => serialize_number(self.number(), s),
            ffi::LUA_TSTRING => serialize_string(self.bytes(), self.ctx, s),
            ffi::LUA_TTABLE => self.serialize_table(s),
            ffi::LUA_TLIGHTUSERDATA if self.is_null() => s.serialize_unit(),
            ffi::LUA_TNIL => s.serialize_unit(),
            t => Err(self.ctx.fail(Kind::Type(lua_type_name(t)))),
        }
    }

    fn serialize_table<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ctx = self.ctx;
        let ptr = self.pointer();
        // Same order of checks as the Lua side: cycle, depth, contents.
        if ctx.stack.borrow().contains(&ptr) {
            return Err(ctx.fail(Kind::Cyclic));
        }
        let level = self.depth + 1;
        if level > MAX_DEPTH {
            return Err(ctx.fail(Kind::Deep));
        }
        let (count, is_array) = self.shape();

        ctx.stack.borrow_mut().push(ptr);
        let res = if is_array {
            self.serialize_array(count, level, s)
        } else {
            self.serialize_pairs(count, level, s)
        };
        ctx.stack.borrow_mut().pop();
        res
    }

    /// Returns the table's key count and whether its keys are exactly
    /// 1..=count.
    fn shape(&self) -> (usize, bool) {
        let mut count = 0usize;
        let mut max = 0usize;
        let mut ints = true;
        let key = self.at(self.top() + 1, 0);
        self.start_pairs();
        while self.next() {
            count += 1;
            if ints {
                let i = match key.lua_type() {
                    ffi::LUA_TNUMBER => match as_int(key.number()) {
                        Some(i) if i >= 1 => i as usize,
                        _ => 0,
                    },
                    _ => 0,
                };
                if i == 0 {
                    ints = false;
                }
                max = max.max(i);
            }
            self.pop_to(key.idx);
        }
        // Distinct positive integer keys whose maximum is their count are 1..=n.
        (count, count > 0 && ints && max == count)
    }

    fn serialize_array<S: Serializer>(
        &self,
        n: usize,
        level: usize,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let ctx = self.ctx;
        let mut seq = s.serialize_seq(Some(n))?;
        let v = self.at(self.top() + 1, level);
        // LuaJIT tables hold fewer than 2^28 keys, so `n` fits a c_int.
        for i in 1..=n as c_int {
            self.push_index(i);
            let res = seq.serialize_element(&v);
            self.pop_to(v.idx - 1);
            res.inspect_err(|_| ctx.add_seg(|| format!("[{i}]")))?;
        }
        seq.end()
    }

    fn serialize_pairs<S: Serializer>(
        &self,
        n: usize,
        level: usize,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let ctx = self.ctx;
        let mut map = s.serialize_map(Some(n))?;
        // Raw `next` order, as the Lua side iterates, so maps come out
        // identical.
        let k = self.at(self.top() + 1, level);
        let v = self.at(k.idx + 1, level);
        self.start_pairs();
        while self.next() {
            map.serialize_key(&Key(&k))?;
            map.serialize_value(&v)
                .inspect_err(|_| ctx.add_seg(|| k.key_segment()))?;
            // Pops the value (and whatever nested walks left); the key stays
            // for `next`.
            self.pop_to(k.idx);
        }
        map.end()
    }

    /// Path segment for this table key, as the Lua side renders it.
    fn key_segment(&self) -> String {
        match self.lua_type() {
            ffi::LUA_TSTRING => format!("[\"{}\"]", escape(self.bytes())),
            ffi::LUA_TNUMBER => format!("[{}]", format_g14(self.number())),
            ffi::LUA_TBOOLEAN => format!("[{}]", self.boolean()),
            t => format!("[{}]", lua_type_name(t)),
        }
    }
}

impl Serialize for Key<'_, '_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let k = self.0;
        match k.lua_type() {
            ty @ (ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN) => k.serialize_as(ty, s),
            ffi::LUA_TTABLE => k
                .serialize_as(ffi::LUA_TTABLE, s)
                .inspect_err(|_| k.ctx.add_seg(|| "(key)".to_string())),
            // ngx.null included: it would come back as a key nobody can
            // look up.
            t => Err(k.ctx.fail(Kind::Key(lua_type_name(t)))),
        }
    }
}

/// Escapes a key for an error message: a valid Lua string literal body,
/// ASCII only.
fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0..=0x1f | 0x7f..=0xff => out.push_str(&format!("\\{b:03}")),
            _ => out.push(b as char),
        }
    }
    out
}

/// Formats like LuaJIT's `tostring(number)` ("%.14g", ties away from zero),
/// so both sides print numeric keys alike.
fn format_g14(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // Plenty of digits to round from by hand: Rust rounds ties to even,
    // LuaJIT away from zero, and only the 15th digit decides.
    let sci = format!("{:.40e}", x.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let mut exp: i32 = exp.parse().unwrap_or(0);
    let mut digits: Vec<u8> = mant
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|d| d - b'0')
        .collect();
    let round_up = digits.get(14).is_some_and(|&d| d >= 5);
    digits.truncate(14);
    if round_up {
        let mut i = digits.len();
        loop {
            if i == 0 {
                digits.insert(0, 1);
                digits.truncate(14);
                exp += 1;
                break;
            }
            i -= 1;
            if digits[i] == 9 {
                digits[i] = 0;
            } else {
                digits[i] += 1;
                break;
            }
        }
    }
    while digits.len() > 1 && digits.last() == Some(&0) {
        digits.pop();
    }
    let ds: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
    if !(-4..14).contains(&exp) {
        let (head, tail) = ds.split_at(1);
        let dot = if tail.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}{dot}{tail}e{esign}{:02}", exp.abs())
    } else if exp < 0 {
        format!("{sign}0.{}{ds}", "0".repeat((-exp - 1) as usize))
    } else {
        let int_len = exp as usize + 1;
        if ds.len() <= int_len {
            format!("{sign}{ds}{}", "0".repeat(int_len - ds.len()))
        } else {
            let (i, f) = ds.split_at(int_len);
            format!("{sign}{i}.{f}")
        }
    }
}

// ---------------------------------------------------------------------------
// Decoding

/// Decodes a payload into Lua values in `lua`.  Absent positions are nil;
/// msgpack nil becomes `Value::NULL` (ngx.null).
pub fn decode_values(lua: &Lua, bytes: &[u8]) -> Result<MultiValue, String> {
    decode_inner(lua, bytes).map_err(|e| {
        if e == NOT_ENOUGH_MEMORY {
            e
        } else {
            format!("bad payload: {e}")
        }
    })
}

fn decode_inner(lua: &Lua, bytes: &[u8]) -> Result<MultiValue, String> {
    let mut rd = bytes;
    let n: u64 = rmp::decode::read_int(&mut rd).map_err(|_| "bad value count".to_string())?;
    if n > MAX_VALUES as u64 {
        return Err("bad value count".to_string());
    }
    let n = n as usize;
    let k = rmp::decode::read_map_len(&mut rd).map_err(|_| "expected a map".to_string())? as usize;
    if k > n {
        return Err("more values than the count".to_string());
    }

    let mut res = Ok(());
    // SAFETY: `l` is only used while exec_raw runs the closure, on this
    // thread; decode_on_stack's other requirements are met by exec_raw (a
    // protected call) and by the closure, which only holds references.
    let values = unsafe {
        lua.exec_raw::<MultiValue>((), |l| {
            res = decode_on_stack(l, rd, n, k, bytes.len());
        })
    }
    // A Lua error (out of memory) inside the closure.
    .map_err(|e| match e {
        mlua::Error::MemoryError(_) => NOT_ENOUGH_MEMORY.to_string(),
        other => other.to_string(),
    })?;
    res.map(|()| values)
}

/// Decodes the `k` map entries left in `rd` and leaves the `n` values on the
/// stack of `l`, above what was there; on error leaves nothing.
///
/// # Safety
///
/// `l` must be the state of a running `exec_raw` closure (a protected call,
/// where a Lua error unwinds to `exec_raw`), and the caller's frames in that
/// closure must own nothing with a destructor.
unsafe fn decode_on_stack(
    l: *mut lua_State,
    rd: &[u8],
    n: usize,
    k: usize,
    cap: usize,
) -> Result<(), String> {
    // n <= MAX_VALUES, far below LuaJIT's limit of 8000 slots per frame.
    // SAFETY: `l` is live (the caller's contract); lua_checkstack may raise
    // only out of memory, which the contract makes harmless.
    let (base, room) = unsafe {
        (
            ffi::lua_gettop(l),
            ffi::lua_checkstack(l, n as c_int + NEST_SLOTS),
        )
    };
    if room == 0 {
        return Err("Lua stack overflow".to_string());
    }
    // One nil per value; decoded values replace theirs.
    // SAFETY: the slots were just reserved.
    unsafe { ffi::lua_settop(l, base + n as c_int) };

    let mut de = rmp_serde::Deserializer::from_read_ref(rd);
    let seed = ValueSeed { l, depth: 0, cap };
    let mut entries = || {
        for _ in 0..k {
            let pos = u64::deserialize(&mut de).map_err(|e| format!("bad position: {e}"))?;
            let pos = usize::try_from(pos)
                .ok()
                .filter(|p| (1..=n).contains(p))
                .ok_or_else(|| "bad position".to_string())?;
            seed.deserialize(&mut de).map_err(|e| e.to_string())?;
            // SAFETY: the value is on top and its slot is below it (pos <= n).
            unsafe { ffi::lua_replace(l, base + pos as c_int) };
        }
        // The slice reader does not say what is left, but reading an option
        // takes exactly one marker byte, and only an empty input fails there.
        match (&mut de).deserialize_option(EndProbe) {
            Err(rmp_serde::decode::Error::InvalidMarkerRead(e))
                if e.kind() == io::ErrorKind::UnexpectedEof =>
            {
                Ok(())
            }
            _ => Err("trailing bytes".to_string()),
        }
    };
    let res = entries();
    if res.is_err() {
        // SAFETY: pops only what this function pushed.
        unsafe { ffi::lua_settop(l, base) };
    }
    res
}

/// Accepts whatever marker comes without reading past it.
struct EndProbe;

impl<'de> Visitor<'de> for EndProbe {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Ok(())
    }
}

/// What a seed pushed, as far as table keys care.
enum Pushed {
    Null,
    NaN,
    Other,
}

/// Builds one Lua value straight from the msgpack stream, pushing it on the
/// stack of `l`.
///
/// Invariant: `l` is the state of the running `exec_raw` closure of
/// decode_on_stack; NEST_SLOTS slots are free above the value being built when
/// its outermost table starts, enough for the deepest nesting the depth
/// check allows.  Lua calls here raise only out of memory (or "table
/// overflow" for a huge corrupt size), which decode_on_stack's contract
/// makes harmless: rmp_serde's deserializer over a slice and these seeds own
/// nothing with a destructor, and errors only exist after the last Lua call.
#[derive(Clone, Copy)]
struct ValueSeed {
    l: *mut lua_State,
    /// Number of tables enclosing the value.
    depth: usize,
    /// Upper bound for table preallocation: a count in a corrupt payload must
    /// not make us allocate more than the payload could hold.
    cap: usize,
}

impl ValueSeed {
    fn inner(self) -> Self {
        ValueSeed {
            depth: self.depth + 1,
            ..self
        }
    }

    fn check_depth<E: de::Error>(&self) -> Result<(), E> {
        if self.depth + 1 > MAX_DEPTH {
            return Err(E::custom(format!("tables nested deeper than {MAX_DEPTH}")));
        }
        Ok(())
    }

    /// Pushes a new table with room for `narr` array and `nrec` hash items;
    /// returns its stack index.
    fn push_table(&self, narr: usize, nrec: usize) -> c_int {
        let size = |n: usize| n.min(self.cap).min(c_int::MAX as usize) as c_int;
        // SAFETY: ValueSeed's invariant (a reserved slot; may raise only out
        // of memory or on a huge size, harmlessly).
        unsafe {
            ffi::lua_createtable(self.l, size(narr), size(nrec));
            ffi::lua_gettop(self.l)
        }
    }

    fn push_number<E: de::Error>(&self, f: f64) -> Result<Pushed, E> {
        // SAFETY: ValueSeed's invariant (a reserved slot).
        unsafe { ffi::lua_pushnumber(self.l, f) };
        Ok(if f.is_nan() {
            Pushed::NaN
        } else {
            Pushed::Other
        })
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = Pushed;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Pushed, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed {
    type Value = Pushed;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a msgpack value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Pushed, E> {
        // SAFETY: ValueSeed's invariant (a reserved slot).
        unsafe { ffi::lua_pushlightuserdata(self.l, std::ptr::null_mut()) };
        Ok(Pushed::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Pushed, E> {
        self.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Pushed, E> {
        // SAFETY: ValueSeed's invariant (a reserved slot).
        unsafe { ffi::lua_pushboolean(self.l, c_int::from(b)) };
        Ok(Pushed::Other)
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Pushed, E> {
        // Through f64: that is all a Lua number can hold.
        self.push_number(i as f64)
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Pushed, E> {
        self.push_number(u as f64)
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Pushed, E> {
        self.push_number(f)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Pushed, E> {
        self.visit_bytes(s.as_bytes())
    }

    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Pushed, E> {
        // SAFETY: ValueSeed's invariant (a reserved slot; may raise only out
        // of memory, harmlessly).  LuaJIT copies the bytes and reads none
        // when the length is 0 (the pointer is then dangling but non-null).
        // The raw lua_pushlstring, as mlua's wrapper also reads the string
        // back.
        unsafe { ffi::lua_pushlstring_(self.l, b.as_ptr().cast(), b.len()) };
        Ok(Pushed::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Pushed, A::Error> {
        self.check_depth()?;
        let t = self.push_table(seq.size_hint().unwrap_or(0), 0);
        let mut i: c_int = 0;
        while seq.next_element_seed(self.inner())?.is_some() {
            i = i
                .checked_add(1)
                .ok_or_else(|| de::Error::custom("array too long"))?;
            // SAFETY: ValueSeed's invariant; the element is on top of the
            // table at `t` (lua_rawseti may raise only out of memory).
            unsafe { ffi::lua_rawseti_(self.l, t, i) };
        }
        Ok(Pushed::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pushed, A::Error> {
        self.check_depth()?;
        let t = self.push_table(0, map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key_seed(self.inner())? {
            match key {
                Pushed::Null => return Err(de::Error::custom("nil table key")),
                Pushed::NaN => return Err(de::Error::custom("NaN table key")),
                Pushed::Other => {}
            }
            map.next_value_seed(self.inner())?;
            // SAFETY: ValueSeed's invariant; key and value are on top of the
            // table at `t`, the key neither nil nor NaN, so lua_rawset may
            // raise only out of memory.
            unsafe { ffi::lua_rawset(self.l, t) };
        }
        Ok(Pushed::Other)
    }
}

/// The payload of one string value (an error message), for when no Lua
/// state is at hand.
pub fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_uint(out, 1);
    let _ = rmp::encode::write_map_len(out, 1);
    let _ = rmp::encode::write_uint(out, 1);
    let _ = rmp::encode::write_bin(out, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlua::{Function, IntoLua, LightUserData, LuaString};

    type R = Result<(), Box<dyn std::error::Error>>;

    /// Test-side Lua: the event-loop codec plus comparison helpers.
    const HELPERS: &str = r##"
        ffi = require "ffi"
        codec = require "resty.threadpool.codec"
        null = codec.null
        local buffer = require "string.buffer"

        function lua_encode(what, ...)
            local b = buffer.new()
            local ok, err = codec.encode(b, what, select("#", ...), ...)
            if not ok then
                return nil, err
            end
            return b:tostring()
        end

        function pack(...)
            return { n = select("#", ...), ... }
        end

        function deep_eq(a, b)
            if type(a) ~= type(b) then
                return false
            end
            if type(a) == "number" then
                if a ~= a then
                    return b ~= b
                end
                return a == b and (a ~= 0 or 1 / a == 1 / b)
            end
            if type(a) ~= "table" then
                return a == b
            end
            local na, nb = 0, 0
            for _ in pairs(a) do na = na + 1 end
            for _ in pairs(b) do nb = nb + 1 end
            if na ~= nb then
                return false
            end
            for k, v in pairs(a) do
                if type(k) == "table" then
                    local found = false
                    for kb, vb in pairs(b) do
                        if type(kb) == "table" and deep_eq(k, kb)
                           and deep_eq(v, vb)
                        then
                            found = true
                            break
                        end
                    end
                    if not found then
                        return false
                    end
                elseif b[k] == nil or not deep_eq(v, b[k]) then
                    return false
                end
            end
            return true
        end

        function packed_eq(a, b)
            if a.n ~= b.n then
                return false
            end
            for i = 1, a.n do
                if a[i] == nil or b[i] == nil then
                    if a[i] ~= b[i] then
                        return false
                    end
                elseif not deep_eq(a[i], b[i]) then
                    return false
                end
            end
            return true
        end

        -- Decodes s as the shim does; returns a packed table, or nil, err.
        function lua_decode(s)
            local p = ffi.cast("const char *", s)
            local r = pack(codec.decode_results(p, #s))
            if not r[1] then
                return nil, r[2]
            end
            local v = { n = r.n - 1 }
            for i = 1, v.n do
                v[i] = r[i + 1]
            end
            return v
        end

        function nest(n, leaf)
            local t = { leaf }
            for _ = 2, n do
                t = { t }
            end
            return t
        end
    "##;

    #[test]
    fn encode_string_decodes_as_one_string() -> R {
        let lua = Lua::new();
        let mut out = Vec::new();
        encode_string(b"boom\0\xff", &mut out);
        let vals = decode_values(&lua, &out).map_err(mlua::Error::runtime)?;
        assert_eq!(vals.len(), 1);
        let s = vals[0].as_string().expect("a string").as_bytes().to_vec();
        assert_eq!(s, b"boom\0\xff");
        Ok(())
    }

    fn new_lua() -> mlua::Result<Lua> {
        new_lua_with("")
    }

    /// `prelude` runs before the codec is required.
    fn new_lua_with(prelude: &str) -> mlua::Result<Lua> {
        // unsafe_new: the codec needs ffi and string.buffer.
        let lua = unsafe { Lua::unsafe_new() };
        let dir = env!("CARGO_MANIFEST_DIR");
        lua.load(format!(
            "package.path = [[{dir}/lua/?.lua;]] .. package.path"
        ))
        .exec()?;
        lua.load(prelude).exec()?;
        lua.load(HELPERS).exec()?;
        Ok(lua)
    }

    fn global_fn(lua: &Lua, name: &str) -> mlua::Result<Function> {
        lua.globals().get(name)
    }

    fn packed(lua: &Lua, vals: &MultiValue) -> mlua::Result<Table> {
        let t = lua.create_table()?;
        t.raw_set("n", vals.len())?;
        for (i, v) in vals.iter().enumerate() {
            if !v.is_nil() {
                t.raw_set(i + 1, v.clone())?;
            }
        }
        Ok(t)
    }

    fn same(lua: &Lua, a: &MultiValue, b: &MultiValue) -> mlua::Result<bool> {
        global_fn(lua, "packed_eq")?.call((packed(lua, a)?, packed(lua, b)?))
    }

    fn rust_encode(vals: &MultiValue, what: &str) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        encode_values(vals, &mut out, what)?;
        Ok(out)
    }

    fn lua_encode(
        lua: &Lua,
        vals: &MultiValue,
        what: &str,
    ) -> mlua::Result<Result<Vec<u8>, String>> {
        let mut args = vals.clone();
        args.push_front(what.into_lua(lua)?);
        let (s, err): (Option<LuaString>, Option<String>) =
            global_fn(lua, "lua_encode")?.call(args)?;
        Ok(match s {
            Some(s) => Ok(s.as_bytes().to_vec()),
            None => Err(err.unwrap_or_default()),
        })
    }

    /// Decodes in Lua; Ok(packed values) or Err(message).
    fn lua_decode(lua: &Lua, bytes: &[u8]) -> mlua::Result<Result<Table, String>> {
        let (t, err): (Option<Table>, Option<String>) =
            global_fn(lua, "lua_decode")?.call(lua.create_string(bytes)?)?;
        Ok(t.ok_or_else(|| err.unwrap_or_default()))
    }

    fn eval(lua: &Lua, code: &str) -> mlua::Result<MultiValue> {
        lua.load(code).eval()
    }

    /// Rust encode -> Rust decode in one state must give equal values.
    fn rust_roundtrip(lua: &Lua, vals: &MultiValue) -> R {
        let bytes = rust_encode(vals, "argument")?;
        let back = decode_values(lua, &bytes)?;
        assert_eq!(back.len(), vals.len(), "value count");
        assert!(
            same(lua, vals, &back)?,
            "round trip changed values: {bytes:02x?}"
        );
        Ok(())
    }

    fn mv(vals: Vec<Value>) -> MultiValue {
        MultiValue::from_vec(vals)
    }

    #[test]
    fn roundtrip_scalars() -> R {
        let lua = new_lua()?;
        let s = |b: &[u8]| lua.create_string(b).map(Value::String);
        let cases = vec![
            mv(vec![]),
            mv(vec![Value::Nil]),
            mv(vec![Value::Boolean(true), Value::Boolean(false)]),
            mv(vec![
                Value::Integer(0),
                Value::Integer(-1),
                Value::Integer(1 << 53),
                Value::Integer(-(1 << 53)),
                Value::Integer(1 << 31),
                Value::Integer((1 << 32) + 1),
                Value::Number(2f64.powi(63)),
                Value::Number(-(2f64.powi(63))),
            ]),
            mv(vec![
                Value::Number(0.5),
                Value::Number(-0.0),
                Value::Number(f64::INFINITY),
                Value::Number(f64::NEG_INFINITY),
                Value::Number(f64::NAN),
                Value::Number(1e300),
                Value::Number(-1.25e-300),
            ]),
            mv(vec![
                s(b"")?,
                s(b"a\0b")?,
                s(b"\xff\xfe\xc3")?,
                s(&[b'x'; 255])?,
                s(&[b'x'; 256])?,
                s(&[b'y'; 65535])?,
                s(&[b'z'; 65536])?,
                s(&vec![7u8; 70 * 1024])?,
            ]),
            mv(vec![Value::NULL]),
            mv(vec![
                Value::Nil,
                Value::Integer(1),
                Value::Nil,
                Value::NULL,
                Value::Nil,
                Value::Nil,
            ]),
        ];
        for vals in &cases {
            rust_roundtrip(&lua, vals)?;
        }
        Ok(())
    }

    #[test]
    fn negative_zero_stays_float() -> R {
        let lua = new_lua()?;
        let bytes = rust_encode(
            &mv(vec![Value::Number(-0.0), Value::Number(0.0)]),
            "argument",
        )?;
        assert_eq!(
            bytes,
            [0x02, 0x82, 0x01, 0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x00]
        );
        let back = decode_values(&lua, &bytes)?;
        match back.front() {
            Some(Value::Number(f)) => assert!(*f == 0.0 && f.is_sign_negative()),
            other => panic!("expected -0.0, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn exact_bytes() -> R {
        let lua = new_lua()?;
        let cases: &[(&str, &[u8])] = &[
            ("", &[0x00, 0x80]),
            ("nil", &[0x01, 0x80]),
            ("'abc'", &[0x01, 0x81, 0x01, 0xc4, 3, b'a', b'b', b'c']),
            ("nil, 1, nil, nil", &[0x04, 0x81, 0x02, 0x01]),
            (
                "null, true, false",
                &[0x03, 0x83, 0x01, 0xc0, 0x02, 0xc3, 0x03, 0xc2],
            ),
            (
                "127, 128, -32, -33",
                &[0x04, 0x84, 1, 0x7f, 2, 0xcc, 0x80, 3, 0xe0, 4, 0xd0, 0xdf],
            ),
            (
                "65535, -32769",
                &[
                    0x02, 0x82, 1, 0xcd, 0xff, 0xff, 2, 0xd2, 0xff, 0xff, 0x7f, 0xff,
                ],
            ),
            ("2^53", &[0x01, 0x81, 1, 0xcf, 0, 0x20, 0, 0, 0, 0, 0, 0]),
            (
                "-2^53",
                &[0x01, 0x81, 1, 0xd3, 0xff, 0xe0, 0, 0, 0, 0, 0, 0],
            ),
            ("0.5", &[0x01, 0x81, 1, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0]),
            ("{}", &[0x01, 0x81, 1, 0x80]),
            ("{1, 'a'}", &[0x01, 0x81, 1, 0x92, 0x01, 0xc4, 1, b'a']),
            ("{x = null}", &[0x01, 0x81, 1, 0x81, 0xc4, 1, b'x', 0xc0]),
        ];
        for (code, want) in cases {
            let vals = eval(&lua, &format!("return {code}"))?;
            assert_eq!(rust_encode(&vals, "argument")?, *want, "rust: {code}");
            assert_eq!(lua_encode(&lua, &vals, "argument")??, *want, "lua: {code}");
        }
        Ok(())
    }

    #[test]
    fn roundtrip_tables() -> R {
        let lua = new_lua()?;
        let cases = [
            "{1, 2, 3}",
            "{a = 1, b = 'x'}",
            "{1, 2, x = 3}",
            "{1, nil, 3}",
            "{[0] = 1, [-1] = 2, [1.5] = 3}",
            "{[true] = 1, [false] = 2}",
            "{[{1, 2}] = 'tk', [{a = {}}] = {}}",
            "{{}, {{}}, {a = {b = {c = {}}}}}",
            "{null, null, x = null}",
            "nest(100, 'leaf')",
            "(function() local s = {1} return {s, s, k = s} end)()",
            "(function() local t = {} for i = 1, 70000 do t[i] = i end return t end)()",
            "(function() local t = {} for i = 1, 20 do t['k' .. i] = i end return t end)()",
            "1, {2}, nil, {x = {}}, nil",
        ];
        for code in cases {
            let vals = eval(&lua, &format!("return {code}"))?;
            rust_roundtrip(&lua, &vals).map_err(|e| format!("{code}: {e}"))?;
        }
        Ok(())
    }

    #[test]
    fn holes_make_a_map() -> R {
        let lua = new_lua()?;
        let vals = eval(&lua, "return {1, nil, 3}")?;
        let bytes = rust_encode(&vals, "argument")?;
        assert_eq!(bytes[3] & 0xf0, 0x80, "{bytes:02x?}");
        let back = decode_values(&lua, &bytes)?;
        let Some(Value::Table(t)) = back.front() else {
            panic!("expected a table");
        };
        assert_eq!(t.raw_get::<i64>(1)?, 1);
        assert_eq!(t.raw_get::<Value>(2)?, Value::Nil);
        assert_eq!(t.raw_get::<i64>(3)?, 3);
        Ok(())
    }

    fn err_of(lua: &Lua, code: &str, what: &str) -> Result<String, Box<dyn std::error::Error>> {
        let vals = eval(lua, &format!("return {code}"))?;
        let mut out = vec![0xaa];
        let err = encode_values(&vals, &mut out, what).expect_err(code);
        assert_eq!(out, [0xaa], "output not restored after error");
        let lua_err = lua_encode(lua, &vals, what)?.expect_err(code);
        assert_eq!(err, lua_err, "Rust and Lua disagree on {code}");
        Ok(err)
    }

    #[test]
    fn error_messages() -> R {
        let lua = new_lua()?;
        let cases: &[(&str, &str)] = &[
            ("print", "cannot pass function in argument #1"),
            (
                "1, {a = {1, 2, print}}",
                r#"cannot pass function in argument #2 at ["a"][3]"#,
            ),
            (
                "nil, nil, coroutine.create(print)",
                "cannot pass thread in argument #3",
            ),
            ("newproxy()", "cannot pass userdata in argument #1"),
            (
                "{x = ffi.new('int')}",
                r#"cannot pass cdata in argument #1 at ["x"]"#,
            ),
            ("ffi.cast('void *', 0)", "cannot pass cdata in argument #1"),
            (
                "nil, ffi.cast('void *', 0)",
                "cannot pass cdata in argument #2",
            ),
            (
                "{1, ffi.cast('void *', 0)}",
                "cannot pass cdata in argument #1 at [2]",
            ),
            (
                "{[ffi.cast('void *', 0)] = 1}",
                "cannot pass table key cdata in argument #1",
            ),
            (
                "(function() local t = {} t.self = t return t end)()",
                r#"cyclic table in argument #1 at ["self"]"#,
            ),
            (
                "(function() local t = {a = {}} t.a[1] = t return 1, t end)()",
                r#"cyclic table in argument #2 at ["a"][1]"#,
            ),
            (
                "nest(100, {})",
                &format!(
                    "table nested deeper than 100 in argument #1 at {}",
                    "[1]".repeat(100)
                ),
            ),
            (
                "{[print] = 1}",
                "cannot pass table key function in argument #1",
            ),
            (
                "{x = {[null] = 1}}",
                r#"cannot pass table key userdata in argument #1 at ["x"]"#,
            ),
            (
                r#"{['a\"b\\\n\0\200\r\t9'] = print}"#,
                r#"cannot pass function in argument #1 at ["a\"b\\\n\000\200\r\t9"]"#,
            ),
            (
                "{[1.5] = print}",
                "cannot pass function in argument #1 at [1.5]",
            ),
            (
                "{[2^53] = print}",
                "cannot pass function in argument #1 at [9.007199254741e+15]",
            ),
            (
                "{[123456789012345] = print}",
                "cannot pass function in argument #1 at [1.2345678901235e+14]",
            ),
            (
                "{[1e-7] = print}",
                "cannot pass function in argument #1 at [1e-07]",
            ),
            (
                "{[0.0001] = print}",
                "cannot pass function in argument #1 at [0.0001]",
            ),
            (
                "{[true] = {print}}",
                "cannot pass function in argument #1 at [true][1]",
            ),
            (
                "{[{}] = print}",
                "cannot pass function in argument #1 at [table]",
            ),
            (
                "{[{print}] = 1}",
                "cannot pass function in argument #1 at (key)[1]",
            ),
            (
                "{[{[print] = 1}] = 1}",
                "cannot pass table key function in argument #1 at (key)",
            ),
            (
                "(function() local t = {} t[t] = 1 return t end)()",
                "cyclic table in argument #1 at (key)",
            ),
        ];
        for (code, want) in cases {
            assert_eq!(err_of(&lua, code, "argument")?, *want, "{code}");
        }
        assert_eq!(
            err_of(&lua, "1, print", "return value")?,
            "cannot pass function in return value #2"
        );
        Ok(())
    }

    #[test]
    fn numbers_print_like_luajit() -> R {
        let lua = new_lua()?;
        let nums = [
            0.0,
            -0.0,
            1.0,
            -7.0,
            0.1,
            1.5,
            1e-5,
            1e-4,
            0.000123456789012345,
            123.456e20,
            1e100,
            5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            2f64.powi(53),
            2f64.powi(63),
            99999999999999.0,
            99999999999999.5,
            999999999999995.0,
            123456789012345.0,
            1234567890123.25,
            -1234567890123.25,
            1234567890123.75,
            1e14,
            1e15,
            std::f64::consts::PI,
        ];
        let tostring: Function = lua.globals().get("tostring")?;
        for x in nums {
            assert_eq!(format_g14(x), tostring.call::<String>(x)?, "{x:e}");
        }
        Ok(())
    }

    #[test]
    fn rust_only_error_values() -> R {
        let lua = new_lua()?;
        let ud = lua.create_any_userdata(5u32)?;
        let light = Value::LightUserData(LightUserData(std::ptr::dangling_mut()));
        let nested = lua.create_table()?;
        nested.raw_set("u", ud.clone())?;
        let cases = [
            (Value::UserData(ud), "cannot pass userdata in argument #1"),
            (light.clone(), "cannot pass userdata in argument #1"),
            (
                Value::Table(nested),
                r#"cannot pass userdata in argument #1 at ["u"]"#,
            ),
            (
                Value::Error(Box::new(mlua::Error::runtime("x"))),
                "cannot pass userdata in argument #1",
            ),
        ];
        for (v, want) in cases {
            assert_eq!(rust_encode(&mv(vec![v]), "argument").unwrap_err(), want);
        }
        // A non-NULL light userdata made in Rust fails in Lua the same way.
        assert_eq!(
            lua_encode(&lua, &mv(vec![light]), "argument")?.unwrap_err(),
            "cannot pass userdata in argument #1"
        );
        Ok(())
    }

    #[test]
    fn too_big() -> R {
        let lua = new_lua()?;
        // One string exactly filling the limit: 3 header bytes + bin32 header.
        let fits = "string.rep('x', 16 * 1024 * 1024 - 8)";
        let vals = eval(&lua, &format!("return {fits}"))?;
        assert_eq!(rust_encode(&vals, "argument")?.len(), MAX_PAYLOAD);
        assert_eq!(lua_encode(&lua, &vals, "argument")??.len(), MAX_PAYLOAD);

        let over = "string.rep('x', 16 * 1024 * 1024 - 7)";
        assert_eq!(
            err_of(&lua, over, "argument")?,
            "arguments exceed 16777216 bytes"
        );
        assert_eq!(
            err_of(&lua, over, "return value")?,
            "return values exceed 16777216 bytes"
        );
        // Caught at the second string, before the function after it.
        let two = "{string.rep('x', 9000000), string.rep('y', 9000000), print}";
        assert_eq!(
            err_of(&lua, two, "argument")?,
            "arguments exceed 16777216 bytes"
        );
        // Crossed by floats, so only the final check sees it; both sides
        // first report the function that comes before that check.
        let floats = "string.rep('x', 16 * 1024 * 1024 - 20), {0.5, 0.5, 0.5, print}";
        assert_eq!(
            err_of(&lua, floats, "argument")?,
            "cannot pass function in argument #2 at [4]"
        );
        let floats = "string.rep('x', 16 * 1024 * 1024 - 20), {0.5, 0.5, 0.5}";
        assert_eq!(
            err_of(&lua, floats, "argument")?,
            "arguments exceed 16777216 bytes"
        );
        Ok(())
    }

    #[test]
    fn too_many_values() -> R {
        let lua = new_lua()?;
        let vals = eval(&lua, "return unpack({}, 1, 4096)")?;
        assert_eq!(vals.len(), MAX_VALUES);
        rust_roundtrip(&lua, &vals)?;
        let err = err_of(&lua, "unpack({}, 1, 4097)", "argument")?;
        assert_eq!(err, "too many arguments (max 4096)");
        Ok(())
    }

    #[test]
    fn depth_limit() -> R {
        let lua = new_lua()?;
        let ok = eval(&lua, "return nest(100, 1)")?;
        rust_roundtrip(&lua, &ok)?;
        let bytes = rust_encode(&ok, "argument")?;
        assert!(lua_decode(&lua, &bytes)?.is_ok());
        assert_eq!(
            err_of(&lua, "nest(101, 1)", "argument")?,
            format!(
                "table nested deeper than 100 in argument #1 at {}",
                "[1]".repeat(100)
            )
        );
        // A hand-made payload one level deeper is refused by both decoders.
        let mut deep = vec![0x01, 0x81, 0x01];
        deep.extend(std::iter::repeat_n(0x91, 101));
        deep.push(0x01);
        let err = decode_values(&lua, &deep).unwrap_err();
        assert!(err.starts_with("bad payload: "), "{err}");
        assert!(lua_decode(&lua, &deep)?
            .unwrap_err()
            .starts_with("bad payload: "));
        Ok(())
    }

    /// Values built in Lua; each must encode to the same bytes on both sides
    /// and decode on both sides to equal values.
    const BATTERY: &str = r#"
        local big = {}
        for i = 1, 70000 do big[i] = i % 7 == 0 and ('s' .. i) or i end
        local m16 = {}
        for i = 1, 16 do m16['k' .. i] = i end
        local shared = {1, 2}
        return {
            function() return end,
            function() return nil end,
            function() return nil, nil, nil end,
            function() return 1, nil, 3, nil end,
            function() return true, false, null end,
            function() return 0, 1, -1, 127, 128, 255, 256, 65535, 65536 end,
            function() return 2^32 - 1, 2^32, 2^32 + 1, 2^53, 2^53 + 2, 2^63 - 1024 end,
            function() return -32, -33, -128, -129, -32768, -32769 end,
            function() return -2^31, -2^31 - 1, -2^53, -2^63, 2^63, -2^63 - 4096 end,
            function() return 0.5, -0.0, 1/0, -1/0, 0/0, 1e300, 5e-324, 0.1 end,
            function() return "", "a\0b", "\255\254\192", ("x"):rep(255) end,
            function() return ("x"):rep(256), ("y"):rep(65535), ("z"):rep(65536) end,
            function() return ("\0"):rep(70 * 1024) end,
            function() return {} end,
            function() return {1, 2, 3}, {"a", {"b"}} end,
            function() return {a = 1, b = "x", [true] = false, [1.5] = -2} end,
            function() return {1, 2, x = 3}, {1, nil, 3}, {[2] = 2}, {[0] = 0} end,
            function() return {null, null, n = null} end,
            function() return {[{1}] = "k", [{a = {}}] = {}} end,
            function() return {{}, {{}}, {a = {b = {c = {}}}}} end,
            function() return nest(100, "deep") end,
            function() return {shared, shared, s = shared} end,
            function() return big, m16 end,
            function()
                local t = {}
                for i = 1, 15 do t[i] = i end
                local u = {}
                for i = 1, 16 do u[i] = -i end
                return t, u
            end,
            function() return unpack({}, 1, 20) end,
            function() return 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                              16, 17, "x", nil, {}, nil end,
        }
    "#;

    #[test]
    fn cross_language_battery() -> R {
        battery(&new_lua()?)
    }

    #[test]
    fn cross_language_battery_without_table_extensions() -> R {
        // Plain LuaJIT 2.1 lacks table.nkeys; the module must fall back.
        let lua = new_lua_with(
            r#"
            for _, m in ipairs({"table.nkeys", "table.new"}) do
                package.loaded[m] = nil
                package.preload[m] = function() error("gone") end
            end
        "#,
        )?;
        assert!(lua
            .load(r#"return not pcall(require, "table.nkeys")"#)
            .eval::<bool>()?);
        battery(&lua)
    }

    fn battery(lua: &Lua) -> R {
        let lua = lua.clone();
        let cases: Table = lua.load(BATTERY).eval()?;
        for (i, case) in cases.sequence_values::<Function>().enumerate() {
            let vals: MultiValue = case?.call(())?;
            let what = if i % 2 == 0 {
                "argument"
            } else {
                "return value"
            };

            // (a) same bytes
            let rust = rust_encode(&vals, what).map_err(|e| format!("case {}: {e}", i + 1))?;
            let luab =
                lua_encode(&lua, &vals, what)?.map_err(|e| format!("case {}: {e}", i + 1))?;
            assert!(rust == luab, "case {}: bytes differ", i + 1);

            // Rust decodes its own payload (which is also Lua's, by (a)).
            let back = decode_values(&lua, &rust)?;
            assert!(
                same(&lua, &vals, &back)?,
                "case {}: Rust decode differs",
                i + 1
            );

            // (b) Rust payload decodes in Lua
            let from_lua = lua_decode(&lua, &rust)?.map_err(|e| format!("case {}: {e}", i + 1))?;
            let want = packed(&lua, &vals)?;
            let eq: bool = global_fn(&lua, "packed_eq")?.call((want, from_lua))?;
            assert!(eq, "case {}: Lua decode differs", i + 1);
        }
        Ok(())
    }

    #[test]
    fn lua_payload_decodes_in_rust() -> R {
        // (c) with a table Rust never saw: built and encoded inside Lua.
        let lua = new_lua()?;
        let s: LuaString = lua
            .load(
                r#"
                local t = {1, "two", {three = 3}, [{4}] = null, [5.5] = -0.0}
                return lua_encode("argument", nil, t, "x", nil)
            "#,
            )
            .eval()?;
        let vals = decode_values(&lua, &s.as_bytes())?;
        assert_eq!(vals.len(), 4);
        let check: Function = lua
            .load(
                r#"
                return function(a, t, x, d)
                    local want = {1, "two", {three = 3}, [{4}] = null, [5.5] = -0.0}
                    return a == nil and d == nil and x == "x" and deep_eq(t, want)
                end
            "#,
            )
            .eval()?;
        assert!(check.call::<bool>(vals)?);
        Ok(())
    }

    #[test]
    fn decoded_numbers_look_like_mlua_numbers() -> R {
        let lua = new_lua()?;
        // uint8 255, float64 1.0, float32 0.5, int64 -1
        let bytes = [
            0x04, 0x84, 1, 0xcc, 0xff, 2, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 3, 0xca, 0x3f, 0, 0,
            0, 4, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        let vals = decode_values(&lua, &bytes)?.into_vec();
        assert!(matches!(
            vals[..],
            [
                Value::Integer(255),
                Value::Integer(1),
                Value::Number(0.5),
                Value::Integer(-1)
            ]
        ));
        let from_lua = lua_decode(&lua, &bytes)?.map_err(|e| e.to_string())?;
        assert_eq!(from_lua.raw_get::<f64>(3)?, 0.5);
        // str family decodes to strings too, invalid UTF-8 included
        let bytes = [0x02, 0x82, 1, 0xa2, 0xff, 0x00, 2, 0xd9, 1, b'a'];
        let vals = decode_values(&lua, &bytes)?;
        let from_lua = lua_decode(&lua, &bytes)?.map_err(|e| e.to_string())?;
        assert!(global_fn(&lua, "packed_eq")?.call::<bool>((packed(&lua, &vals)?, from_lua))?);
        match vals.front() {
            Some(Value::String(s)) => assert_eq!(s.as_bytes().as_ref(), b"\xff\x00"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    /// Tiny deterministic PRNG, to avoid a dev-dependency.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    fn assert_bad(r: &Result<MultiValue, String>, bytes: &[u8]) {
        if let Err(e) = r {
            assert!(e.starts_with("bad payload: "), "{e} for {bytes:02x?}");
        }
    }

    #[test]
    fn garbage_never_panics() -> R {
        let lua = new_lua()?;
        let sample = eval(
            &lua,
            r#"return 1, nil, "str", {1, 2.5, {a = {true, false, null}}, [{1}] = "k"},
                     -70000, 2^40, ("s"):rep(300)"#,
        )?;
        let valid = rust_encode(&sample, "argument")?;

        // Every strict prefix is truncated, hence refused by both sides.
        for len in 0..valid.len() {
            let r = decode_values(&lua, &valid[..len]);
            assert!(r.is_err(), "prefix {len} accepted");
            assert_bad(&r, &valid[..len]);
            assert!(lua_decode(&lua, &valid[..len])?
                .unwrap_err()
                .starts_with("bad payload: "));
        }
        let mut trailing = valid.clone();
        trailing.push(0);
        assert_eq!(
            decode_values(&lua, &trailing).unwrap_err(),
            "bad payload: trailing bytes"
        );
        assert_eq!(
            lua_decode(&lua, &trailing)?.unwrap_err(),
            "bad payload: trailing bytes"
        );

        // Mutated and random payloads: never a panic or a Lua error, and both
        // decoders accept the same ones, with the same values.
        let fixed: &[&[u8]] = &[
            b"",
            &[0xff],
            &[0xc1],
            &[0x01, 0x81, 0x01, 0xc1],
            &[0x01, 0x81, 0x01, 0xd4, 0x01, 0x02],
            &[0x01, 0x81, 0x00, 0x01],
            &[0x01, 0x81, 0x02, 0x01],
            &[0x01, 0x82, 0x01, 0x01, 0x01, 0x01],
            &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80],
            &[0x01, 0x81, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff],
            &[0x01, 0x81, 0x01, 0xdf, 0xff, 0xff, 0xff, 0xff],
            &[0x01, 0x81, 0x01, 0xc6, 0xff, 0xff, 0xff, 0xff],
            &[0x01, 0x81, 0x01, 0x81, 0xc0, 0x01],
            &[
                0x01, 0x81, 0x01, 0x81, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0, 0x01,
            ],
            &[0x01, 0x81, 0x01, 0x91],
            &[0x01, 0x90],
        ];
        let mut rng = Lcg(0x5eed);
        let mut inputs: Vec<Vec<u8>> = fixed.iter().map(|b| b.to_vec()).collect();
        for _ in 0..3000 {
            let mut b = valid.clone();
            for _ in 0..=rng.next() % 3 {
                let i = (rng.next() as usize) % b.len();
                b[i] = rng.next() as u8;
            }
            inputs.push(b);
        }
        for _ in 0..2000 {
            let len = (rng.next() % 40) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Mostly plausible headers, so the value decoders get exercised.
            if len >= 3 && !rng.next().is_multiple_of(4) {
                b[0] = 0x01;
                b[1] = 0x81;
                b[2] = 0x01;
            }
            inputs.push(b);
        }
        let mut accepted = 0;
        for b in &inputs {
            let r = decode_values(&lua, b);
            assert_bad(&r, b);
            let l = lua_decode(&lua, b)?;
            match (&r, &l) {
                (Ok(vals), Ok(t)) => {
                    accepted += 1;
                    let eq: bool =
                        global_fn(&lua, "packed_eq")?.call((packed(&lua, vals)?, t.clone()))?;
                    assert!(eq, "decoders differ on {b:02x?}");
                }
                (Err(_), Err(e)) => assert!(e.starts_with("bad payload: "), "{e}"),
                _ => panic!("decoders disagree on {b:02x?}: rust {r:?}, lua {l:?}"),
            }
        }
        assert!(
            accepted > 50,
            "only {accepted} accepted: the fuzzing is too weak"
        );
        Ok(())
    }

    #[test]
    fn raw_stack_edge_cases() -> R {
        // What the raw-stack walk and build must get right as mlua did: keys
        // that only look like numbers, metamethods (ignored: access is raw),
        // mixed array and hash parts, and nesting through keys and values to
        // the limit, also under the most values a payload can hold.
        let lua = new_lua()?;
        lua.load(
            r#"
            function keys_and_values(n)
                local t = {}
                for i = 2, n do
                    if i % 2 == 0 then t = {[t] = i} else t = {v = t} end
                end
                return t
            end
        "#,
        )
        .exec()?;
        let cases = [
            r#"{["1"] = "a", ["2"] = "b"}"#,
            r#"{"a", "b", ["3"] = "c"}"#,
            "{1, 2, 3, [5] = 5}",
            "{[1] = 1, [2] = 2, [3.0] = 3}",
            "{[2^53] = 1, [-1] = 2, [0] = 3, [0.5] = 4, [-0.0] = 5}",
            "setmetatable({1, 2}, {__index = function() return 9 end, __len = function() return 9 end})",
            "setmetatable({a = 1}, {__index = {b = 2}, __pairs = error})",
            "keys_and_values(100)",
            "(function() local t = {} t[4096] = keys_and_values(100) return unpack(t, 1, 4096) end)()",
        ];
        for code in cases {
            let vals = eval(&lua, &format!("return {code}"))?;
            let rust = rust_encode(&vals, "argument").map_err(|e| format!("{code}: {e}"))?;
            assert!(rust == lua_encode(&lua, &vals, "argument")??, "{code}");
            rust_roundtrip(&lua, &vals).map_err(|e| format!("{code}: {e}"))?;
        }
        assert_eq!(
            err_of(&lua, "keys_and_values(101)", "argument")?,
            format!(
                "table nested deeper than 100 in argument #1 at {}",
                r#"["v"](key)"#.repeat(50)
            )
        );
        // Keys the decoder refuses, whatever their depth.
        let nil_key = [0x01, 0x81, 0x01, 0x91, 0x81, 0xc0, 0x01];
        let nan_key = [
            0x01, 0x81, 0x01, 0x81, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0, 0x01,
        ];
        assert_eq!(
            decode_values(&lua, &nil_key).unwrap_err(),
            "bad payload: nil table key"
        );
        assert_eq!(
            decode_values(&lua, &nan_key).unwrap_err(),
            "bad payload: NaN table key"
        );
        Ok(())
    }

    /// Speed of both directions on typical payloads; prints µs per call, the
    /// minimum over several runs since the machine is shared.  Run with
    /// `cargo test --release --lib -- --ignored codec_speed --nocapture`.
    #[test]
    #[ignore]
    fn codec_speed() -> R {
        use std::time::Instant;
        let lua = new_lua()?;
        let cases = [
            ("16 B string", "('x'):rep(16)"),
            ("1 KiB string", "('x'):rep(1024)"),
            ("64 KiB string", "('x'):rep(65536)"),
            (
                "100 records x 10 strings",
                r#"(function()
                    local t = {}
                    for i = 1, 100 do
                        local r = {}
                        for j = 1, 10 do r["field" .. j] = ("value %d-%d"):format(i, j) end
                        t[i] = r
                    end
                    return t
                end)()"#,
            ),
            (
                "1000 numbers",
                "(function() local t = {} for i = 1, 1000 do t[i] = i * 0.5 end return t end)()",
            ),
        ];
        for (name, code) in cases {
            let vals = eval(&lua, &format!("return {code}"))?;
            let bytes = rust_encode(&vals, "argument")?;
            // About 20 ms per run at the measured speed.
            let iters = (2_000_000 / bytes.len().max(100)).clamp(20, 20_000);
            let mut out = Vec::new();
            let mut enc = f64::MAX;
            let mut dec = f64::MAX;
            for _ in 0..7 {
                let t = Instant::now();
                for _ in 0..iters {
                    out.clear();
                    encode_values(&vals, &mut out, "argument")?;
                }
                enc = enc.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
                let t = Instant::now();
                for _ in 0..iters {
                    decode_values(&lua, &bytes)?;
                }
                dec = dec.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            println!(
                "codec_speed {name:>26} ({:>6} B): encode {enc:>9.2} µs  decode {dec:>9.2} µs",
                bytes.len()
            );
        }
        Ok(())
    }
}
