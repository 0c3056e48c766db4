//! The encoder: mlua values of a pool thread's state into a payload. Tables
//! are walked on the raw Lua stack (stack.rs) rather than through an mlua
//! value per element.

use super::message::{escape, format_g14, lua_type_name, size_message, type_name, Ctx, Kind};
use super::wire::{
    as_int, bin_header_len, CountingWriter, Span, BORROWED, BORROWED_EXT_LEN, EXT, MAX_DEPTH,
    MAX_PAYLOAD, MAX_VALUES, NEST_SLOTS, NOT_ENOUGH_MEMORY,
};
use crate::lua::stack::{self, Slot};
use mlua::ffi;
use mlua::{LuaString, MultiValue, Table, Value};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use std::cell::{Cell, RefCell};
use std::ffi::c_int;

/// Appends the payload for `values` to `out`.  `what` names the values in
/// error messages ("argument", "return value").  On error `out` is left as
/// it was.
pub fn encode_values(values: &MultiValue, out: &mut Vec<u8>, what: &str) -> Result<(), String> {
    encode_borrowing(values, out, what, None)
}

/// Where the values' large strings go instead of the payload: the strings
/// of at least `min` bytes that are values themselves (not inside a table:
/// a table can change after it was returned, a string cannot) become spans
/// of the payload, and `strings` holds them so that the caller can keep
/// them alive.
pub struct Borrow<'a> {
    pub min: usize,
    pub spans: &'a mut Vec<Span>,
    pub strings: &'a mut Vec<LuaString>,
}

impl Borrow<'_> {
    /// The span index of `st` when it is borrowed.
    fn take(&mut self, st: &LuaString, len: usize) -> Option<u32> {
        if len < self.min {
            return None;
        }
        let index = u32::try_from(self.spans.len()).ok()?;
        self.spans.push(Span::of(&st.as_bytes()));
        self.strings.push(st.clone());
        Some(index)
    }
}

/// As encode_values, borrowing large strings when `borrow` says so. On
/// error, nothing is left borrowed.
pub fn encode_borrowing(
    values: &MultiValue,
    out: &mut Vec<u8>,
    what: &str,
    mut borrow: Option<Borrow>,
) -> Result<(), String> {
    let start = out.len();
    let borrowed = borrow.as_ref().map_or(0, |b| b.spans.len());
    let res = encode_into(values, out, what, borrow.as_mut());
    if res.is_err() {
        out.truncate(start);
        if let Some(b) = borrow {
            b.spans.truncate(borrowed);
            b.strings.truncate(borrowed);
        }
    }
    res
}

fn encode_into(
    values: &MultiValue,
    out: &mut Vec<u8>,
    what: &str,
    borrow: Option<&mut Borrow>,
) -> Result<(), String> {
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
    let borrow = RefCell::new(borrow);
    let mut ser = rmp_serde::Serializer::new(&mut w);
    for (i, v) in values.iter().enumerate() {
        if v.is_nil() {
            continue;
        }
        let pos = i + 1;
        (&mut ser)
            .serialize_u64(pos as u64)
            .map_err(|_| NOT_ENOUGH_MEMORY.to_string())?;
        let enc = Enc {
            v,
            ctx: &ctx,
            borrow: &borrow,
        };
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

/// A top-level value being encoded.
struct Enc<'a, 'c, 'b, 'd> {
    v: &'a Value,
    ctx: &'a Ctx<'c>,
    borrow: &'a RefCell<Option<&'b mut Borrow<'d>>>,
}

impl Serialize for Enc<'_, '_, '_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.v {
            Value::Boolean(b) => s.serialize_bool(*b),
            Value::Integer(i) => s.serialize_i64(*i),
            Value::Number(f) => serialize_number(*f, s),
            Value::String(st) => {
                let bytes = st.as_bytes();
                let borrowed = match self.borrow.borrow_mut().as_mut() {
                    Some(b) => b.take(st, bytes.len()),
                    None => None,
                };
                match borrowed {
                    Some(index) => serialize_borrowed(index, bytes.len(), self.ctx, s),
                    None => serialize_string(&bytes, self.ctx, s),
                }
            }
            Value::Table(t) => serialize_table(t, self.ctx, s),
            // ngx.null; Nil only reaches here if a caller nests it oddly.
            Value::LightUserData(ud) if ud.0.is_null() => s.serialize_unit(),
            Value::Nil => s.serialize_unit(),
            other => Err(self.ctx.fail(Kind::Type(type_name(other)))),
        }
    }
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

/// A borrowed string: an ext holding its span's index. It counts towards
/// MAX_PAYLOAD as if copied, so that the limit does not depend on what is
/// borrowed.
fn serialize_borrowed<S: Serializer>(
    index: u32,
    len: usize,
    ctx: &Ctx,
    s: S,
) -> Result<S::Ok, S::Error> {
    let copied = bin_header_len(len) + len;
    if ctx.written.get() + copied > MAX_PAYLOAD {
        return Err(ctx.fail(Kind::Size));
    }
    // the writer counts the ext itself
    ctx.written
        .set(ctx.written.get() + copied - BORROWED_EXT_LEN);
    s.serialize_newtype_struct(EXT, &(BORROWED, ExtData(&index.to_be_bytes())))
}

/// An ext type's data, which rmp-serde wants as bytes.
struct ExtData<'a>(&'a [u8]);

impl Serialize for ExtData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// Encodes a top-level table: pushes it and walks it on the raw stack.
fn serialize_table<S: Serializer>(t: &Table, ctx: &Ctx, s: S) -> Result<S::Ok, S::Error> {
    match stack::walk_table(t, NEST_SLOTS, ctx, |table| table.serialize(s)) {
        Ok(res) => res,
        Err(msg) => Err(ctx.fail(Kind::Lua(msg))),
    }
}

impl Serialize for Slot<'_, Ctx<'_>> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.serialize_as(self.lua_type(), s)
    }
}

impl Slot<'_, Ctx<'_>> {
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

/// A table key being encoded.
struct Key<'s, 'a, 'c>(&'s Slot<'a, Ctx<'c>>);

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
