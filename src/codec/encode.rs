//! The encoder: Lua values on a raw stack into a payload, for arguments
//! on the event loop and for results in pool threads alike. Tables are
//! walked through `Slot` (lua/stack.rs), which only reads: nothing here
//! allocates in Lua or raises, so it may run under a panic guard.

use super::message::{escape, format_g14, lua_type_name, size_message, Ctx, Kind};
use super::wire::{
    as_int, bin_header_len, CodecError, CountingWriter, Span, BORROWED, BORROWED_EXT_LEN, EXT,
    MAX_DEPTH, MAX_PAYLOAD, MAX_VALUES, NEST_SLOTS,
};
use crate::lua::stack::{self, Slot};
use crate::ngx::guard;
use mlua::ffi::{self, lua_State};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use std::cell::{Cell, RefCell};
use std::ffi::c_int;

/// Stack slots an encoding needs above the top.
const WALK_SLOTS: usize = NEST_SLOTS + 2;

/// Where the values to encode are.
#[derive(Clone, Copy)]
pub enum Source {
    /// On the stack, the first at this absolute index.
    Stack(c_int),
    /// In the table at this absolute stack index, at keys 1..n.
    Array(c_int),
}

/// Which strings an encoding borrows (reads in place) instead of copying:
/// those of at least `min` bytes, inside tables too when `nested` (a
/// caller's arguments, anchored until the task ends), else only values
/// themselves (a thread's results: a returned table can still change, a
/// string cannot).
#[derive(Clone, Copy)]
pub struct Borrow {
    pub min: usize,
    pub nested: bool,
}

/// Where the strings an encoding borrows go.
pub(super) enum Sink<'a> {
    /// Their spans, in the payload's order.
    Spans(&'a mut Vec<Span>),
    /// The strings themselves, into `t[next..]` of the table at `table`.
    Table { table: c_int, next: &'a Cell<c_int> },
}

/// Appends the payload of `n` values at `src` to `out`, their borrowed
/// strings' spans to `spans`, and returns how many it borrowed. `what`
/// names the values in error messages ("argument", "return value"). On
/// error `out` and `spans` are left as they were, and so is the stack.
///
/// # Safety
/// `l` must be a live state of this thread, with the values at `src`; no
/// table in them may change during the call. Reserving the stack the walk
/// needs may raise (out of memory): call it where a Lua error may unwind.
/// The walk itself does not raise, so a panic guard wraps it.
pub unsafe fn write_values(
    l: *mut lua_State,
    src: Source,
    n: usize,
    what: &str,
    borrow: Option<Borrow>,
    out: &mut Vec<u8>,
    spans: &mut Vec<Span>,
) -> Result<usize, CodecError> {
    // SAFETY: forwarded from the caller.
    if !unsafe { stack::reserve(l, WALK_SLOTS) } {
        return Err(stack_overflow());
    }
    let (start, borrowed) = (out.len(), spans.len());
    // SAFETY: forwarded from the caller, with the slots reserved. A walk
    // that stopped at an error leaves what it pushed: the top is put back.
    let res = unsafe {
        let top = ffi::lua_gettop(l);
        let sink = Sink::Spans(&mut *spans);
        let res = guard::catch(|| encode_into(l, src, n, what, borrow, Some(&mut *out), sink))
            .map_err(|panic| CodecError::Value(format!("panic: {panic}")));
        ffi::lua_settop(l, top);
        res.and_then(|r| r)
    };
    if res.is_err() {
        out.truncate(start);
        spans.truncate(borrowed);
    }
    res.map(|()| spans.len() - borrowed)
}

/// The error for a stack that cannot hold the values.
pub(super) fn stack_overflow() -> CodecError {
    CodecError::Value("Lua stack overflow".into())
}

/// Stores the strings that `write_values` borrowed from the same values, in the
/// same order, at `t[start..]` of the table at absolute index `table`,
/// created with room for all of them in its array part; returns the index
/// after the last. This is what keeps them alive (the caller anchors the
/// table) while the payload refers to them.
///
/// # Safety
/// As write_values, with the values unchanged since it ran and
/// WALK_SLOTS free above the top (it reserved them).
pub unsafe fn anchor(
    l: *mut lua_State,
    src: Source,
    n: usize,
    borrow: Borrow,
    table: c_int,
    start: c_int,
) -> c_int {
    let next = Cell::new(start);
    let sink = Sink::Table { table, next: &next };
    // SAFETY: forwarded from the caller; the values encoded once already,
    // and the walk does not raise, so the guard only ever meets a panic.
    let _ = guard::catch(|| unsafe { encode_into(l, src, n, "", Some(borrow), None, sink) });
    next.get()
}

/// # Safety
/// As write_values, with the stack reserved.
unsafe fn encode_into(
    l: *mut lua_State,
    src: Source,
    n: usize,
    what: &str,
    borrow: Option<Borrow>,
    out: Option<&mut Vec<u8>>,
    sink: Sink,
) -> Result<(), CodecError> {
    if n > MAX_VALUES {
        return Err(CodecError::Value(format!(
            "too many {what}s (max {MAX_VALUES})"
        )));
    }
    let written = Cell::new(0);
    let oom = Cell::new(false);
    let mut w = CountingWriter {
        out,
        written: &written,
        oom: &oom,
    };
    let ctx = Ctx {
        stack: RefCell::new(Vec::new()),
        written: &written,
        err: RefCell::new(None),
        borrow,
        sink: RefCell::new(sink),
    };
    // SAFETY: forwarded from the caller: src holds n values, and a slot is
    // reserved above the top for one pushed from an array.
    let values = unsafe { Values::new(l, src, &ctx) };
    let k = (1..=n)
        .filter(|&pos| values.with(pos, |v| v.lua_type() != ffi::LUA_TNIL))
        .count();
    // Only running out of memory makes these fail.
    rmp::encode::write_uint(&mut w, n as u64).map_err(|_| CodecError::OutOfMemory)?;
    rmp::encode::write_map_len(&mut w, k as u32).map_err(|_| CodecError::OutOfMemory)?;
    let mut ser = rmp_serde::Serializer::new(&mut w);
    for pos in 1..=n {
        let res = values.with(pos, |v| {
            if v.lua_type() == ffi::LUA_TNIL {
                return Ok(());
            }
            (&mut ser).serialize_u64(pos as u64)?;
            v.serialize(&mut ser)
        });
        if let Err(e) = res {
            if oom.get() {
                return Err(CodecError::OutOfMemory);
            }
            return Err(CodecError::Value(ctx.message(what, pos, e)));
        }
    }
    if written.get() > MAX_PAYLOAD {
        return Err(CodecError::Value(size_message(what)));
    }
    Ok(())
}

/// The values of a Source, one Slot at a time.
struct Values<'a, 'c> {
    l: *mut lua_State,
    src: Source,
    ctx: &'a Ctx<'c>,
}

impl<'a, 'c> Values<'a, 'c> {
    /// # Safety
    /// As encode.
    unsafe fn new(l: *mut lua_State, src: Source, ctx: &'a Ctx<'c>) -> Values<'a, 'c> {
        Values { l, src, ctx }
    }

    /// Runs `f` on value `pos` (1-based).
    fn with<R>(&self, pos: usize, f: impl FnOnce(Slot<'a, Ctx<'c>>) -> R) -> R {
        match self.src {
            Source::Stack(first) => {
                let idx = first + pos as c_int - 1;
                // SAFETY: the caller of new vouched for the values at src.
                let v = unsafe { Slot::new(self.l, idx, self.ctx) };
                f(v)
            }
            Source::Array(table) => {
                // SAFETY: as above; pos <= MAX_VALUES fits a c_int.
                let t = unsafe { Slot::new(self.l, table, self.ctx) };
                let top = t.top();
                t.push_index(pos as c_int);
                let res = f(t.at(top + 1, 0));
                t.pop_to(top);
                res
            }
        }
    }
}

fn serialize_number<S: Serializer>(f: f64, s: S) -> Result<S::Ok, S::Error> {
    // Integral, in int64 range and not -0.0: an int, else a float64.
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
            ffi::LUA_TSTRING => self.serialize_string(s),
            ffi::LUA_TTABLE => self.serialize_table(s),
            ffi::LUA_TLIGHTUSERDATA if self.is_null() => s.serialize_unit(),
            ffi::LUA_TNIL => s.serialize_unit(),
            t => Err(self.ctx.fail(Kind::Type(lua_type_name(t)))),
        }
    }

    fn serialize_string<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes = self.bytes();
        let ctx = self.ctx;
        let borrows = ctx
            .borrow
            .is_some_and(|b| bytes.len() >= b.min && (b.nested || self.depth == 0));
        if !borrows {
            return serialize_string(bytes, ctx, s);
        }
        let index = match &mut *ctx.sink.borrow_mut() {
            Sink::Spans(spans) => {
                let Ok(index) = u32::try_from(spans.len()) else {
                    return serialize_string(bytes, ctx, s);
                };
                spans.push(Span::of(bytes));
                index
            }
            Sink::Table { table, next } => {
                self.store_in(*table, next.get());
                next.set(next.get() + 1);
                0
            }
        };
        serialize_borrowed(index, bytes.len(), ctx, s)
    }

    fn serialize_table<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ctx = self.ctx;
        let ptr = self.pointer();
        // Cycle, depth, contents: the first problem found is reported.
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
        // Raw `next` order: the same walk twice (encode, then anchor)
        // meets the strings in the same order.
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

    /// Path segment for this table key in an error message.
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
