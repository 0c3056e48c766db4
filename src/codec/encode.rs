//! The encoder: Lua values on a raw stack into a payload, for arguments
//! on the event loop and for results in pool threads alike. Tables are
//! walked through `Slot` (lua/stack.rs), which only reads: nothing here
//! allocates in Lua or raises, so it may run under a panic guard.

use super::format::{
    as_int, bin_header_len, CodecError, Span, BORROWED, BORROWED_EXT_LEN, MAX_DEPTH, MAX_PAYLOAD,
    MAX_VALUES, NEST_SLOTS,
};
use super::message::{escape, format_g14, lua_type_name, size_message, EncError, Kind};
use crate::luajit::stack::{self, Slot};
use crate::ngx::guard;
use mlua::ffi::{self, lua_State};
use std::cell::Cell;
use std::ffi::{c_int, c_void};

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
enum Sink<'a> {
    /// Their spans, in the payload's order.
    Spans(&'a mut Vec<Span>),
    /// The strings themselves, into `t[next..end]` of the table at
    /// `table`, whose array part holds those indexes. One more stops the
    /// walk: the values are not those encoded.
    Table {
        table: c_int,
        next: &'a Cell<c_int>,
        end: c_int,
    },
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
    // SAFETY: l is a live state of this thread (the contract), and this is
    // where a Lua error may unwind, as reserving may raise.
    if !unsafe { reserve_walk(l, 0) } {
        return Err(stack_overflow());
    }
    // SAFETY: l is a live state of this thread (the contract) and the walk's
    // slots are reserved just above, where the mark reads the top.
    let mark = unsafe { Mark::of(l, out, spans) };
    // SAFETY: the caller's values at src, with the walk's slots reserved
    // just above; the walk raises nothing, so only a panic meets the guard.
    guard::catch(|| unsafe { write_walked(l, src, n, what, borrow, &mut *out, &mut *spans) })
        .unwrap_or_else(|panic| {
            // SAFETY: the mark was made on this state before the walk; a
            // panic stops it anywhere, and what it left is put back.
            unsafe { mark.restore(l, out, spans) };
            Err(CodecError::Value(ngx_threadpool_wire::panicked(panic)))
        })
}

/// Makes room for a walk (`write_walked`) above `extra` more slots: false
/// when the stack cannot grow that far.
///
/// # Safety
/// `l` must be a live state of this thread. May raise (out of memory):
/// call it where a Lua error may unwind.
pub unsafe fn reserve_walk(l: *mut lua_State, extra: usize) -> bool {
    // SAFETY: l is a live state of this thread, where a Lua error may unwind
    // (the contract), as stack::reserve needs.
    unsafe { stack::reserve(l, WALK_SLOTS + extra) }
}

/// As write_values, without reserving the stack or a guard of its own:
/// for a caller that reserved the walk (`reserve_walk`) and walks many
/// sets of values under one panic guard (a batch's arguments).
///
/// # Safety
/// As write_values, with the walk's slots reserved above the top. Raises
/// nothing.
pub unsafe fn write_walked(
    l: *mut lua_State,
    src: Source,
    n: usize,
    what: &str,
    borrow: Option<Borrow>,
    out: &mut Vec<u8>,
    spans: &mut Vec<Span>,
) -> Result<usize, CodecError> {
    // SAFETY: l is a live state of this thread with the values at src
    // unchanged and the walk's slots reserved above the top (the contract). A
    // walk that stopped at an error leaves what it pushed and wrote: it is put
    // back.
    unsafe {
        let mark = Mark::of(l, out, spans);
        let sink = Sink::Spans(&mut *spans);
        let values = Values::new(l, src, mark.top);
        let res = encode_into(values, n, what, borrow, Some(&mut *out), sink);
        if res.is_err() {
            mark.restore(l, out, spans);
        }
        res.map(|()| spans.len() - mark.spans)
    }
}

/// Where a walk started: what an error puts back.
struct Mark {
    top: c_int,
    out: usize,
    spans: usize,
}

impl Mark {
    /// # Safety
    /// `l` must be a live state of this thread.
    unsafe fn of(l: *mut lua_State, out: &[u8], spans: &[Span]) -> Mark {
        Mark {
            // SAFETY: l is a live state of this thread (the contract); reading
            // its top neither allocates nor raises.
            top: unsafe { ffi::lua_gettop(l) },
            out: out.len(),
            spans: spans.len(),
        }
    }

    /// Puts the stack's top, `out` and `spans` back where they were.
    ///
    /// # Safety
    /// As `of`, on the state it was made on.
    unsafe fn restore(&self, l: *mut lua_State, out: &mut Vec<u8>, spans: &mut Vec<Span>) {
        // SAFETY: l is the live state of this thread the mark was made on (the
        // contract); the top only goes down to where it was.
        unsafe { ffi::lua_settop(l, self.top) };
        out.truncate(self.out);
        spans.truncate(self.spans);
    }
}

/// The error for a stack that cannot hold the values.
pub fn stack_overflow() -> CodecError {
    CodecError::Value("Lua stack overflow".into())
}

/// Stores the strings that `write_values` borrowed from the same values, in the
/// same order, at `t[start..end]` of the table at absolute index `table`,
/// created with those indexes in its array part; returns the index after
/// the last stored (`start` when the stack cannot hold the walk). This is
/// what keeps them alive (the caller anchors the table) while the payload
/// refers to them.
///
/// # Safety
/// As write_values, with the values unchanged since it ran. The slots it
/// reserved are reserved again: creating the table may have run a
/// collector step, which shrinks stacks to what their frames use.
pub unsafe fn anchor(
    l: *mut lua_State,
    src: Source,
    n: usize,
    borrow: Borrow,
    table: c_int,
    start: c_int,
    end: c_int,
) -> c_int {
    // SAFETY: l is a live state of this thread, where a Lua error may unwind
    // (the contract): reserving may raise here.
    if !unsafe { stack::reserve(l, WALK_SLOTS) } {
        return start;
    }
    let next = Cell::new(start);
    let sink = Sink::Table {
        table,
        next: &next,
        end,
    };
    // SAFETY: l is a live state of this thread holding the values at src,
    // unchanged since they were encoded once (the contract), with the walk's
    // slots just reserved; the walk does not raise, so the guard only ever
    // meets a panic. A walk stopped at the end leaves what it pushed: the top
    // is put back.
    unsafe {
        let top = ffi::lua_gettop(l);
        let values = Values::new(l, src, top);
        let _ = guard::catch(|| encode_into(values, n, "", Some(borrow), None, sink));
        ffi::lua_settop(l, top);
    }
    next.get()
}

/// # Safety
/// As write_values, with the stack reserved; `values` made (Values::new)
/// for the n values to encode.
unsafe fn encode_into(
    values: Values,
    n: usize,
    what: &str,
    borrow: Option<Borrow>,
    out: Option<&mut Vec<u8>>,
    sink: Sink,
) -> Result<(), CodecError> {
    if n > MAX_VALUES {
        return Err(CodecError::Value(ngx_threadpool_wire::too_many(what)));
    }
    let mut walk = Walk {
        out,
        written: 0,
        visiting: Vec::new(),
        borrow,
        sink,
    };
    walk.put(MARKER_MAX, |o| write_uint(o, n as u64))
        .map_err(|_| CodecError::OutOfMemory)?;
    // The map's count, written once the nils are skipped (as for a table).
    let at = walk.out.as_ref().map_or(0, |o| o.len());
    walk.put(1, |o| o.push(FIXMAP_EMPTY))
        .map_err(|_| CodecError::OutOfMemory)?;
    let mut k = 0;
    for pos in 1..=n {
        let res = values.with(pos, |v, ty| {
            if ty == ffi::LUA_TNIL {
                return Ok(());
            }
            k += 1;
            walk.put(MARKER_MAX, |o| write_uint(o, pos as u64))?;
            walk.typed(v, ty)
        });
        match res {
            Ok(()) => {}
            Err(Fail::OutOfMemory) => return Err(CodecError::OutOfMemory),
            Err(Fail::Value(e)) => return Err(CodecError::Value(e.message(what, pos))),
        }
    }
    walk.fix_map_len(at, k)
        .map_err(|_| CodecError::OutOfMemory)?;
    if walk.written > MAX_PAYLOAD {
        return Err(CodecError::Value(size_message(what)));
    }
    Ok(())
}

/// The header of an empty map, written where the count is not known yet
/// (fix_map_len).
const FIXMAP_EMPTY: u8 = 0x80;

/// Most bytes a marker with its scalar data takes (a float64, a uint64).
const MARKER_MAX: usize = 9;

// The markers of the smallest values, written here: most of a payload's
// markers are these, and rmp's writers, not inlined, cost more than the
// bytes. Larger values go through rmp, which picks the same markers.

/// An unsigned integer, in the smallest encoding.
#[inline(always)]
fn write_uint(o: &mut Vec<u8>, u: u64) {
    match u {
        0..=0x7f => o.push(u as u8),
        _ => {
            let _ = rmp::encode::write_uint(o, u);
        }
    }
}

/// A signed integer, in the smallest encoding: rmp writes a non-negative
/// one as it writes an unsigned one.
#[inline(always)]
fn write_sint(o: &mut Vec<u8>, i: i64) {
    if let Ok(u) = u64::try_from(i) {
        return write_uint(o, u);
    }
    let _ = rmp::encode::write_sint(o, i);
}

/// Bytes as bin, with the smallest length marker.
#[inline(always)]
fn write_bin(o: &mut Vec<u8>, bytes: &[u8]) {
    match u8::try_from(bytes.len()) {
        Ok(len) => o.extend_from_slice(&[BIN8, len]),
        Err(_) => {
            let _ = rmp::encode::write_bin_len(o, bytes.len() as u32);
        }
    }
    o.extend_from_slice(bytes);
}

/// The marker of a bin of fewer than 256 bytes.
const BIN8: u8 = 0xc4;

/// Why a walk stopped.
enum Fail {
    /// The payload could not grow.
    OutOfMemory,
    Value(EncError),
}

impl From<Kind> for Fail {
    fn from(kind: Kind) -> Fail {
        Fail::Value(kind.into())
    }
}

impl Fail {
    /// Adds a path segment while unwinding out of a table.
    fn in_seg(mut self, seg: impl FnOnce() -> String) -> Fail {
        if let Fail::Value(e) = &mut self {
            e.segs.push(seg());
        }
        self
    }
}

/// One encoding: writes the payload straight into `out`, without serde,
/// a marker at a time (what one value costs is what the event loop pays
/// per table entry).
struct Walk<'a> {
    /// None: only find the borrowed strings again (anchor).
    out: Option<&'a mut Vec<u8>>,
    /// Bytes of the payload so far, borrowed strings counted as copied,
    /// so that MAX_PAYLOAD does not depend on what is borrowed.
    written: usize,
    /// Tables being visited, to tell a cycle from a shared subtable.
    visiting: Vec<*const c_void>,
    borrow: Option<Borrow>,
    sink: Sink<'a>,
}

type Step = Result<(), Fail>;

impl Walk<'_> {
    /// Makes room for `room` bytes, then lets `f` write at most that many
    /// (a write into reserved capacity cannot fail or allocate). The
    /// payload's size comes from user data: a buffer that cannot grow is
    /// an error, not an abort.
    #[inline(always)]
    fn put(&mut self, room: usize, f: impl FnOnce(&mut Vec<u8>)) -> Step {
        let Some(out) = self.out.as_deref_mut() else {
            return Ok(());
        };
        out.try_reserve(room).map_err(|_| Fail::OutOfMemory)?;
        let before = out.len();
        f(out);
        self.written += out.len() - before;
        Ok(())
    }

    fn value(&mut self, v: Slot<'_, ()>) -> Step {
        self.typed(v, v.lua_type())
    }

    /// The value `v`, whose `lua_type` is `ty`.
    fn typed(&mut self, v: Slot<'_, ()>, ty: c_int) -> Step {
        match ty {
            ffi::LUA_TBOOLEAN => self.put(1, |o| {
                let _ = rmp::encode::write_bool(o, v.boolean());
            }),
            ffi::LUA_TNUMBER => self.number(v.number()),
            ffi::LUA_TSTRING => self.string(v),
            ffi::LUA_TTABLE => self.table(v),
            ffi::LUA_TNIL => self.nil(),
            ffi::LUA_TLIGHTUSERDATA if v.is_null() => self.nil(),
            t => Err(Kind::Type(lua_type_name(t)).into()),
        }
    }

    fn nil(&mut self) -> Step {
        self.put(1, |o| {
            let _ = rmp::encode::write_nil(o);
        })
    }

    fn number(&mut self, f: f64) -> Step {
        self.put(MARKER_MAX, |o| {
            // Integral, in int64 range and not -0.0: the smallest int,
            // else a float64.
            match as_int(f) {
                Some(i) if !(f == 0.0 && f.is_sign_negative()) => write_sint(o, i),
                _ => {
                    let _ = rmp::encode::write_f64(o, f);
                }
            }
        })
    }

    fn string(&mut self, s: Slot<'_, ()>) -> Step {
        let bytes = s.bytes();
        let copied = bin_header_len(bytes.len()) + bytes.len();
        // Checked before copying, so a huge string is never copied just to
        // be refused (and never truncated to a u32 length).
        if self.written + copied > MAX_PAYLOAD {
            return Err(Kind::Size.into());
        }
        let borrows = self
            .borrow
            .is_some_and(|b| bytes.len() >= b.min && (b.nested || s.depth == 0));
        let index = match &mut self.sink {
            _ if !borrows => None,
            Sink::Spans(spans) => u32::try_from(spans.len()).ok().inspect(|_| {
                spans.push(Span::of(bytes));
            }),
            Sink::Table { table, next, end } => {
                if next.get() >= *end {
                    return Err(Kind::Size.into());
                }
                s.store_in(*table, next.get());
                next.set(next.get() + 1);
                Some(0)
            }
        };
        let Some(index) = index else {
            return self.put(copied, |o| write_bin(o, bytes));
        };
        self.put(BORROWED_EXT_LEN, |o| {
            let _ = rmp::encode::write_ext_meta(o, 4, BORROWED);
            o.extend_from_slice(&index.to_be_bytes());
        })?;
        // counted as if copied (the ext itself is counted already)
        self.written += copied - BORROWED_EXT_LEN;
        Ok(())
    }

    fn table(&mut self, t: Slot<'_, ()>) -> Step {
        let ptr = t.pointer();
        // Cycle, depth, contents: the first problem found is reported.
        if self.visiting.contains(&ptr) {
            return Err(Kind::Cyclic.into());
        }
        let level = t.depth + 1;
        if level > MAX_DEPTH {
            return Err(Kind::Deep.into());
        }
        self.visiting.push(ptr);
        // A table without t[1] is no array: its pairs are walked once,
        // their count written when known. Others are counted first.
        let res = if t.border() == 0 {
            self.pairs(t, None, level)
        } else {
            match shape(t) {
                (n, true) => self.array(t, n, level),
                (n, false) => self.pairs(t, Some(n), level),
            }
        };
        self.visiting.pop();
        res
    }

    fn array(&mut self, t: Slot<'_, ()>, n: usize, level: usize) -> Step {
        self.put(5, |o| {
            let _ = rmp::encode::write_array_len(o, n as u32);
        })?;
        let v = t.at(t.top() + 1, level);
        // LuaJIT tables hold fewer than 2^28 keys, so `n` fits a c_int.
        for i in 1..=n as c_int {
            t.push_index(i);
            let res = self.value(v);
            t.pop_to(v.idx - 1);
            res.map_err(|e| e.in_seg(|| format!("[{i}]")))?;
        }
        Ok(())
    }

    /// The table's pairs as a map of `count` pairs, or, when that is not
    /// known yet, of as many as the walk finds (the header is then
    /// written for a small map and widened if it was not).
    fn pairs(&mut self, t: Slot<'_, ()>, count: Option<usize>, level: usize) -> Step {
        let at = self.out.as_ref().map_or(0, |o| o.len());
        self.put(5, |o| match count {
            Some(n) => {
                let _ = rmp::encode::write_map_len(o, n as u32);
            }
            None => o.push(FIXMAP_EMPTY),
        })?;
        // Raw `next` order: the same walk twice (encode, then anchor)
        // meets the strings in the same order.
        let k = t.at(t.top() + 1, level);
        let v = t.at(k.idx + 1, level);
        let mut found = 0usize;
        t.start_pairs();
        while t.next() {
            found += 1;
            self.key(k)?;
            self.value(v).map_err(|e| e.in_seg(|| key_segment(k)))?;
            // Pops the value (and whatever nested walks left); the key stays
            // for `next`.
            t.pop_to(k.idx);
        }
        if count.is_none() {
            self.fix_map_len(at, found)?;
        }
        Ok(())
    }

    /// Rewrites the map header at `at`, FIXMAP_EMPTY, for `n` pairs.
    fn fix_map_len(&mut self, at: usize, n: usize) -> Step {
        let Some(out) = self.out.as_deref_mut() else {
            return Ok(());
        };
        if n < 16 {
            out[at] = FIXMAP_EMPTY | n as u8;
            return Ok(());
        }
        let mut header = [0u8; 5];
        let mut w = &mut header[..];
        let _ = rmp::encode::write_map_len(&mut w, n as u32);
        let len = 5 - w.len();
        out.try_reserve(len - 1).map_err(|_| Fail::OutOfMemory)?;
        out.splice(at..at + 1, header[..len].iter().copied());
        self.written += len - 1;
        Ok(())
    }

    fn key(&mut self, k: Slot<'_, ()>) -> Step {
        match k.lua_type() {
            ty @ (ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN) => self.typed(k, ty),
            ffi::LUA_TTABLE => self.table(k).map_err(|e| e.in_seg(|| "(key)".into())),
            // ngx.null included: it would come back as a key nobody can
            // look up.
            t => Err(Kind::Key(lua_type_name(t)).into()),
        }
    }
}

/// The values of a Source, one Slot at a time.
struct Values {
    l: *mut lua_State,
    src: Source,
    /// The top of the stack when the walk started, where a value of an
    /// Array is pushed above.
    top: c_int,
}

impl Values {
    /// The values at `src` on the stack of `l`, whose top is `top` (read
    /// once by the caller, which keeps it to put the stack back).
    ///
    /// # Safety
    /// `l` must be a live state of this thread with the values at `src`
    /// and a slot reserved above `top`, its top, for a value pushed from an
    /// array.
    unsafe fn new(l: *mut lua_State, src: Source, top: c_int) -> Values {
        Values { l, src, top }
    }

    /// Runs `f` on value `pos` (1-based) and its `lua_type`.
    fn with<R>(&self, pos: usize, f: impl FnOnce(Slot<'_, ()>, c_int) -> R) -> R {
        match self.src {
            Source::Stack(first) => {
                let idx = first + pos as c_int - 1;
                // SAFETY: the caller of new vouched for the values at src.
                let v = unsafe { Slot::new(self.l, idx, &()) };
                f(v, v.lua_type())
            }
            Source::Array(table) => {
                // SAFETY: the table at `table` is among the values new's
                // caller vouched for; pos <= MAX_VALUES fits a c_int. Each
                // value is popped before the next, so the top is as it was
                // when the walk started.
                let t = unsafe { Slot::new(self.l, table, &()) };
                t.push_index(pos as c_int);
                let v = t.at(self.top + 1, 0);
                let res = f(v, v.lua_type());
                t.pop_to(self.top);
                res
            }
        }
    }
}

/// Returns the table's key count and whether its keys are exactly
/// 1..=count.
fn shape(t: Slot<'_, ()>) -> (usize, bool) {
    let mut count = 0usize;
    let mut max = 0usize;
    let mut ints = true;
    let key = t.at(t.top() + 1, 0);
    t.start_pairs();
    while t.next() {
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
        t.pop_to(key.idx);
    }
    // Distinct positive integer keys whose maximum is their count are 1..=n.
    (count, count > 0 && ints && max == count)
}

/// Path segment for table key `k` in an error message.
fn key_segment(k: Slot<'_, ()>) -> String {
    match k.lua_type() {
        ffi::LUA_TSTRING => format!("[\"{}\"]", escape(k.bytes())),
        ffi::LUA_TNUMBER => format!("[{}]", format_g14(k.number())),
        ffi::LUA_TBOOLEAN => format!("[{}]", k.boolean()),
        t => format!("[{}]", lua_type_name(t)),
    }
}
