//! The decoder: a payload into the `Op`s that build its values on a Lua
//! stack (lua/stack.rs), for arguments in pool threads and results on the
//! event loop alike. Pure Rust: a whole payload is checked before anything
//! is pushed, so it may run under a panic guard, and a bad payload leaves
//! no half-built value behind.

use super::wire::{CodecError, Span, BORROWED, MAX_DEPTH, MAX_VALUES};
use crate::lua::stack::Op;
use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer as _, MapAccess, SeqAccess, Visitor,
};
use std::cell::RefCell;
use std::ffi::c_int;
use std::fmt;
use std::io;

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
    ops: Vec<Op<'a>>,
) -> Result<Decoded<'a>, CodecError> {
    decode_inner(bytes, spans, ops).map_err(CodecError::BadPayload)
}

/// An empty buffer of ops for another lifetime, keeping `ops`'
/// allocation (collecting from an empty iterator of a type of the same
/// layout reuses it).
pub fn reuse<'a>(mut ops: Vec<Op<'_>>) -> Vec<Op<'a>> {
    ops.clear();
    ops.into_iter().map(|_| Op::Null).collect()
}

fn decode_inner<'a>(
    bytes: &'a [u8],
    spans: &'a [Span],
    ops: Vec<Op<'a>>,
) -> Result<Decoded<'a>, String> {
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
    let ops = RefCell::new(ops);
    let seed = ValueSeed {
        ops: &ops,
        depth: 0,
        cap: bytes.len(),
        spans,
    };
    decode_entries(seed, rd, n, k)?;
    Ok(Decoded {
        n,
        ops: ops.into_inner(),
    })
}

/// Decodes the `k` map entries left in `rd` into the `n` value slots.
fn decode_entries<'a>(
    seed: ValueSeed<'_, 'a>,
    rd: &'a [u8],
    n: usize,
    k: usize,
) -> Result<(), String> {
    let mut de = rmp_serde::Deserializer::from_read_ref(rd);
    for _ in 0..k {
        let pos = u64::deserialize(&mut de).map_err(|e| format!("bad position: {e}"))?;
        let pos = usize::try_from(pos)
            .ok()
            .filter(|p| (1..=n).contains(p))
            .ok_or_else(|| "bad position".to_string())?;
        seed.deserialize(&mut de).map_err(|e| e.to_string())?;
        // n <= MAX_VALUES fits a c_int
        seed.push(Op::Place(pos as c_int));
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

/// Turns one msgpack value into the ops that push it.
#[derive(Clone, Copy)]
struct ValueSeed<'b, 'a> {
    ops: &'b RefCell<Vec<Op<'a>>>,
    /// Number of tables enclosing the value.
    depth: usize,
    /// Upper bound for table preallocation: a count in a corrupt payload must
    /// not make us allocate more than the payload could hold.
    cap: usize,
    /// The payload's borrowed strings; their bytes are alive for 'a (see
    /// decode).
    spans: &'a [Span],
}

impl<'a> ValueSeed<'_, 'a> {
    fn push(&self, op: Op<'a>) {
        self.ops.borrow_mut().push(op);
    }

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

    /// A new table with room for `narr` array and `nrec` hash items.
    fn push_table(&self, narr: usize, nrec: usize) {
        let size = |n: usize| n.min(self.cap).min(c_int::MAX as usize) as c_int;
        self.push(Op::Table(size(narr), size(nrec)));
    }

    fn push_number<E: de::Error>(&self, f: f64) -> Result<Pushed, E> {
        self.push(Op::Number(f));
        Ok(if f.is_nan() {
            Pushed::NaN
        } else {
            Pushed::Other
        })
    }
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for ValueSeed<'_, 'a> {
    type Value = Pushed;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Pushed, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for ValueSeed<'_, 'a> {
    type Value = Pushed;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a msgpack value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Pushed, E> {
        self.push(Op::Null);
        Ok(Pushed::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Pushed, E> {
        self.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Pushed, E> {
        self.push(Op::Bool(b));
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

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Pushed, E> {
        self.visit_borrowed_bytes(s.as_bytes())
    }

    fn visit_borrowed_bytes<E: de::Error>(self, b: &'de [u8]) -> Result<Pushed, E> {
        self.push(Op::Bytes(b));
        Ok(Pushed::Other)
    }

    /// An ext type: only a borrowed string is one.
    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<Pushed, D::Error> {
        let span = d.deserialize_any(SpanOf(self.spans))?;
        // SAFETY: the spans' bytes are alive for 'a (decode's contract).
        self.push(Op::Bytes(unsafe { span.bytes() }));
        Ok(Pushed::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Pushed, A::Error> {
        self.check_depth()?;
        self.push_table(seq.size_hint().unwrap_or(0), 0);
        let mut i: c_int = 0;
        while seq.next_element_seed(self.inner())?.is_some() {
            i = i
                .checked_add(1)
                .ok_or_else(|| de::Error::custom("array too long"))?;
            self.push(Op::SetIndex(i));
        }
        Ok(Pushed::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pushed, A::Error> {
        self.check_depth()?;
        self.push_table(0, map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key_seed(self.inner())? {
            match key {
                Pushed::Null => return Err(de::Error::custom("nil table key")),
                Pushed::NaN => return Err(de::Error::custom("NaN table key")),
                Pushed::Other => {}
            }
            map.next_value_seed(self.inner())?;
            // the key is neither nil nor NaN
            self.push(Op::SetField);
        }
        Ok(Pushed::Other)
    }
}

/// Reads a borrowed string's ext (tag, index) into its span.
struct SpanOf<'s>(&'s [Span]);

impl<'de> Visitor<'de> for SpanOf<'_> {
    type Value = Span;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a borrowed string")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut ext: A) -> Result<Span, A::Error> {
        let bad = || de::Error::custom("bad borrowed string");
        if ext.next_element::<i8>()? != Some(BORROWED) {
            return Err(de::Error::custom("unsupported msgpack ext type"));
        }
        let data: &[u8] = ext.next_element()?.ok_or_else(bad)?;
        let index = <[u8; 4]>::try_from(data).map_err(|_| bad())?;
        self.0
            .get(u32::from_be_bytes(index) as usize)
            .copied()
            .ok_or_else(bad)
    }
}

/// The text of a payload holding one error value (a string), for a log
/// line; what it is when it is not a string.
pub fn error_text(payload: &[u8]) -> String {
    let mut rd = payload;
    let text = (|| {
        rmp::decode::read_int::<u64, _>(&mut rd).ok()?;
        rmp::decode::read_map_len(&mut rd).ok()?;
        rmp::decode::read_int::<u64, _>(&mut rd).ok()?;
        let len = rmp::decode::read_bin_len(&mut rd).ok()? as usize;
        rd.get(..len)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    })();
    text.unwrap_or_else(|| "error object that is not a string".into())
}
