//! The decoder: a payload into the `Op`s that build its values on a Lua
//! stack (lua/stack.rs), for arguments in pool threads and results on the
//! event loop alike. Pure Rust: a whole payload is checked before anything
//! is pushed, so it may run under a panic guard, and a bad payload leaves
//! no half-built value behind.

use super::format::{CodecError, Span, BORROWED, MAX_DEPTH, MAX_VALUES};
use crate::luajit::stack::Op;
use rmp::Marker;
use std::ffi::c_int;

/// The values of a payload, ready to build: `n` values (absent positions
/// are nil; msgpack nil is ngx.null) and the ops that fill them in.
pub struct Decoded<'a> {
    pub n: usize,
    pub ops: Vec<Op<'a>>,
}

/// Checks `bytes`, a payload whose borrowed strings are `spans`, and turns
/// it into ops, appended to `ops` (a buffer to reuse; see `reuse`).
///
/// # Safety
/// The bytes of every span must stay alive for `'a` (see Span).
pub unsafe fn decode<'a>(
    bytes: &'a [u8],
    spans: &'a [Span],
    mut ops: Vec<Op<'a>>,
) -> Result<Decoded<'a>, CodecError> {
    let n = read(bytes, spans, &mut ops, Op::Place).map_err(CodecError::BadPayload)?;
    Ok(Decoded { n, ops })
}

/// As decode, with ops that set value `i` at index `i + 1` of the table on
/// top of the stack (a batch's result entry, whose `[1]` is the task's
/// status) rather than in value slots: the value count. On error `ops` is
/// left as it was.
///
/// # Safety
/// As decode.
pub unsafe fn decode_entry<'a>(
    bytes: &'a [u8],
    spans: &'a [Span],
    ops: &mut Vec<Op<'a>>,
) -> Result<usize, CodecError> {
    let start = ops.len();
    read(bytes, spans, ops, |pos| Op::SetIndex(pos + 1)).map_err(|e| {
        ops.truncate(start);
        CodecError::BadPayload(e)
    })
}

/// An empty buffer of ops for another lifetime, keeping `ops`'
/// allocation (collecting from an empty iterator of a type of the same
/// layout reuses it).
pub fn reuse<'a>(mut ops: Vec<Op<'_>>) -> Vec<Op<'a>> {
    ops.clear();
    ops.into_iter().map(|_| Op::Null).collect()
}

/// Reads a payload into `ops`, each value then `place(position)`: the
/// value count.
fn read<'a>(
    bytes: &'a [u8],
    spans: &'a [Span],
    ops: &mut Vec<Op<'a>>,
    place: impl Fn(c_int) -> Op<'a>,
) -> Result<usize, String> {
    let mut rd = Reader {
        rest: bytes,
        ops,
        cap: bytes.len(),
        spans,
    };
    let n = rd
        .uint()
        .filter(|&n| n <= MAX_VALUES as u64)
        .ok_or("bad value count")? as usize;
    let k = match rd.marker()? {
        Marker::FixMap(k) => k as usize,
        Marker::Map16 => rd.be::<2>()? as usize,
        Marker::Map32 => rd.be::<4>()? as usize,
        _ => return Err("expected a map".into()),
    };
    if k > n {
        return Err("more values than the count".into());
    }
    for _ in 0..k {
        let pos = rd
            .uint()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|p| (1..=n).contains(p))
            .ok_or("bad position")?;
        rd.value(0)?;
        // n <= MAX_VALUES fits a c_int
        rd.ops.push(place(pos as c_int));
    }
    if !rd.rest.is_empty() {
        return Err("trailing bytes".into());
    }
    Ok(n)
}

/// A payload being read into ops, a marker at a time.
struct Reader<'a, 'o> {
    rest: &'a [u8],
    ops: &'o mut Vec<Op<'a>>,
    /// Upper bound for table preallocation: a count in a corrupt payload
    /// must not make us allocate more than the payload could hold.
    cap: usize,
    /// The payload's borrowed strings; their bytes are alive for 'a (see
    /// decode).
    spans: &'a [Span],
}

/// What a value was, as far as table keys care.
enum Pushed {
    Null,
    NaN,
    Other,
}

const TRUNCATED: &str = "truncated payload";

impl<'a> Reader<'a, '_> {
    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(TRUNCATED.into());
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    #[inline(always)]
    fn marker(&mut self) -> Result<Marker, String> {
        Ok(Marker::from_u8(self.take(1)?[0]))
    }

    /// A big-endian unsigned integer of N bytes.
    #[inline(always)]
    fn be<const N: usize>(&mut self) -> Result<u64, String> {
        Ok(self.take(N)?.iter().fold(0, |v, &b| v << 8 | u64::from(b)))
    }

    /// A non-negative integer of any int encoding.
    #[inline(always)]
    fn uint(&mut self) -> Option<u64> {
        match self.number().ok()? {
            Number::Int(i) => u64::try_from(i).ok(),
            Number::Uint(u) => Some(u),
            Number::Float(_) | Number::Not(_) => None,
        }
    }

    /// Reads a number, or the marker of something else.
    #[inline(always)]
    fn number(&mut self) -> Result<Number, String> {
        Ok(match self.marker()? {
            Marker::FixPos(u) => Number::Uint(u.into()),
            Marker::FixNeg(i) => Number::Int(i.into()),
            Marker::U8 => Number::Uint(self.be::<1>()?),
            Marker::U16 => Number::Uint(self.be::<2>()?),
            Marker::U32 => Number::Uint(self.be::<4>()?),
            Marker::U64 => Number::Uint(self.be::<8>()?),
            Marker::I8 => Number::Int(self.be::<1>()? as i8 as i64),
            Marker::I16 => Number::Int(self.be::<2>()? as i16 as i64),
            Marker::I32 => Number::Int(self.be::<4>()? as i32 as i64),
            Marker::I64 => Number::Int(self.be::<8>()? as i64),
            Marker::F32 => Number::Float(f32::from_bits(self.be::<4>()? as u32).into()),
            Marker::F64 => Number::Float(f64::from_bits(self.be::<8>()?)),
            m => Number::Not(m),
        })
    }

    /// One value, `depth` tables deep, into ops.
    fn value(&mut self, depth: usize) -> Result<Pushed, String> {
        // The markers small tables of short strings are made of, first.
        match self.rest.first() {
            Some(&b @ 0x00..=0x7f) => {
                self.rest = &self.rest[1..];
                return Ok(self.push_number(b.into()));
            }
            Some(&b @ 0xa0..=0xbf) => {
                self.rest = &self.rest[1..];
                let op = Op::Bytes(self.take((b & 0x1f).into())?);
                self.ops.push(op);
                return Ok(Pushed::Other);
            }
            Some(0xc4 | 0xd9) => {
                self.rest = &self.rest[1..];
                let op = self.bytes::<1>()?;
                self.ops.push(op);
                return Ok(Pushed::Other);
            }
            _ => {}
        }
        let marker = match self.number()? {
            // Through f64: that is all a Lua number can hold.
            Number::Int(i) => return Ok(self.push_number(i as f64)),
            Number::Uint(u) => return Ok(self.push_number(u as f64)),
            Number::Float(f) => return Ok(self.push_number(f)),
            Number::Not(m) => m,
        };
        let op = match marker {
            Marker::Null => {
                self.ops.push(Op::Null);
                return Ok(Pushed::Null);
            }
            Marker::True => Op::Bool(true),
            Marker::False => Op::Bool(false),
            Marker::FixStr(n) => Op::Bytes(self.take(n.into())?),
            Marker::Str8 | Marker::Bin8 => self.bytes::<1>()?,
            Marker::Str16 | Marker::Bin16 => self.bytes::<2>()?,
            Marker::Str32 | Marker::Bin32 => self.bytes::<4>()?,
            Marker::FixArray(n) => return self.array(n.into(), depth),
            Marker::Array16 => return self.be::<2>().and_then(|n| self.array(n, depth)),
            Marker::Array32 => return self.be::<4>().and_then(|n| self.array(n, depth)),
            Marker::FixMap(n) => return self.map(n.into(), depth),
            Marker::Map16 => return self.be::<2>().and_then(|n| self.map(n, depth)),
            Marker::Map32 => return self.be::<4>().and_then(|n| self.map(n, depth)),
            Marker::FixExt1 => self.ext(1)?,
            Marker::FixExt2 => self.ext(2)?,
            Marker::FixExt4 => self.ext(4)?,
            Marker::FixExt8 => self.ext(8)?,
            Marker::FixExt16 => self.ext(16)?,
            Marker::Ext8 => self.be::<1>().and_then(|n| self.ext(n))?,
            Marker::Ext16 => self.be::<2>().and_then(|n| self.ext(n))?,
            Marker::Ext32 => self.be::<4>().and_then(|n| self.ext(n))?,
            _ => return Err("reserved msgpack marker".into()),
        };
        self.ops.push(op);
        Ok(Pushed::Other)
    }

    /// A string whose length takes N bytes.
    #[inline(always)]
    fn bytes<const N: usize>(&mut self) -> Result<Op<'a>, String> {
        let len = self.be::<N>()? as usize;
        Ok(Op::Bytes(self.take(len)?))
    }

    /// An ext of `len` data bytes, its marker and length read: only a
    /// borrowed string is one.
    fn ext(&mut self, len: u64) -> Result<Op<'a>, String> {
        let ty = self.take(1)?[0] as i8;
        let data = self.take(len as usize)?;
        if ty != BORROWED {
            return Err("unsupported msgpack ext type".into());
        }
        let span = <[u8; 4]>::try_from(data)
            .ok()
            .and_then(|index| self.spans.get(u32::from_be_bytes(index) as usize))
            .ok_or("bad borrowed string")?;
        // SAFETY: the spans' bytes are alive for 'a (decode's contract).
        Ok(Op::Bytes(unsafe { span.bytes() }))
    }

    #[inline(always)]
    fn push_number(&mut self, f: f64) -> Pushed {
        self.ops.push(Op::Number(f));
        if f.is_nan() {
            Pushed::NaN
        } else {
            Pushed::Other
        }
    }

    /// A new table with room for `narr` array and `nrec` hash items.
    fn table(&mut self, depth: usize, narr: u64, nrec: u64) -> Result<(), String> {
        if depth + 1 > MAX_DEPTH {
            return Err(format!("tables nested deeper than {MAX_DEPTH}"));
        }
        let size = |n: u64| n.min(self.cap as u64).min(c_int::MAX as u64) as c_int;
        self.ops.push(Op::Table(size(narr), size(nrec)));
        Ok(())
    }

    fn array(&mut self, n: u64, depth: usize) -> Result<Pushed, String> {
        self.table(depth, n, 0)?;
        // a payload's length bounds n: a corrupt one runs out of bytes
        for i in 1..=n {
            self.value(depth + 1)?;
            let i = c_int::try_from(i).map_err(|_| "array too long")?;
            self.ops.push(Op::SetIndex(i));
        }
        Ok(Pushed::Other)
    }

    fn map(&mut self, n: u64, depth: usize) -> Result<Pushed, String> {
        self.table(depth, 0, n)?;
        for _ in 0..n {
            match self.value(depth + 1)? {
                Pushed::Null => return Err(ngx_threadpool_wire::NIL_KEY.into()),
                Pushed::NaN => return Err(ngx_threadpool_wire::NAN_KEY.into()),
                Pushed::Other => {}
            }
            self.value(depth + 1)?;
            // the key is neither nil nor NaN
            self.ops.push(Op::SetField);
        }
        Ok(Pushed::Other)
    }
}

/// A number read, or the marker of another value.
enum Number {
    Int(i64),
    Uint(u64),
    Float(f64),
    Not(Marker),
}

/// The text of a payload holding one error value (a string), for a log
/// line; what it is when it is not a string. A string is bin, as the
/// encoder writes it, or str, as a native handler may (the handler
/// crate does).
pub fn error_text(payload: &[u8]) -> String {
    let mut rd = payload;
    let text = (|| {
        rmp::decode::read_int::<u64, _>(&mut rd).ok()?;
        rmp::decode::read_map_len(&mut rd).ok()?;
        rmp::decode::read_int::<u64, _>(&mut rd).ok()?;
        let mut bin = rd;
        let len = match rmp::decode::read_bin_len(&mut bin) {
            Ok(len) => {
                rd = bin;
                len
            }
            Err(_) => rmp::decode::read_str_len(&mut rd).ok()?,
        } as usize;
        rd.get(..len)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    })();
    text.unwrap_or_else(|| "error object that is not a string".into())
}
