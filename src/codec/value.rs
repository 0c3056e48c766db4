//! A payload's values as a Rust tree, for comparing two payloads as Lua
//! values and showing them in a log line (thread/compare.rs). Built from
//! the decoder's ops, so that a payload means here exactly what it means
//! on a Lua stack.
//!
//! Equality is Lua's `==` on numbers (1 and 1.0 are one number: Lua cannot
//! tell them apart; -0 equals 0), except that NaN equals NaN, so that one
//! handler returning NaN twice is no difference; strings by their bytes;
//! tables by content, whatever the order of their keys (an array is the
//! table of keys 1..n); top-level values by position, nils included, and
//! by count (`select('#', ...)`).

use super::decode::{decode, reuse};
use super::format::{CodecError, Span};
use crate::luajit::stack::Op;
use std::cmp::Ordering;
use std::fmt::{self, Write};

/// One value; a table's pairs are sorted by key (`canonical`), with no
/// two keys equal.
#[derive(Debug)]
pub enum Value<'a> {
    /// ngx.null.
    Null,
    Bool(bool),
    Number(f64),
    Bytes(&'a [u8]),
    Table(Vec<(Value<'a>, Value<'a>)>),
}

/// The values of a payload, by position (None: nil).
#[derive(Debug)]
pub struct Values<'a>(pub Vec<Option<Value<'a>>>);

/// The values of `bytes`, a payload whose borrowed strings are `spans`.
///
/// # Safety
/// The spans' bytes must stay alive for `'a` (see Span).
pub unsafe fn values<'a>(bytes: &'a [u8], spans: &'a [Span]) -> Result<Values<'a>, CodecError> {
    // SAFETY: the spans' bytes are alive for 'a (the contract), as long as the
    // values borrow them.
    let decoded = unsafe { decode(bytes, spans, reuse(Vec::new())) }?;
    let mut slots: Vec<Option<Value>> = (0..decoded.n).map(|_| None).collect();
    let mut stack: Vec<Value> = Vec::new();
    let bad = || CodecError::BadPayload("ops out of order".into());
    for op in decoded.ops {
        match op {
            Op::Null => stack.push(Value::Null),
            Op::Bool(b) => stack.push(Value::Bool(b)),
            Op::Number(f) => stack.push(Value::Number(f)),
            Op::Bytes(b) => stack.push(Value::Bytes(b)),
            Op::Table(..) => stack.push(Value::Table(Vec::new())),
            Op::SetIndex(i) => {
                let v = stack.pop().ok_or_else(bad)?;
                set(&mut stack, Value::Number(f64::from(i)), v).ok_or_else(bad)?;
            }
            Op::SetField => {
                let v = stack.pop().ok_or_else(bad)?;
                let k = stack.pop().ok_or_else(bad)?;
                set(&mut stack, k, v).ok_or_else(bad)?;
            }
            Op::Place(i) => {
                let v = stack.pop().ok_or_else(bad)?;
                let slot = usize::try_from(i - 1).ok().and_then(|i| slots.get_mut(i));
                *slot.ok_or_else(bad)? = Some(canonical(v));
            }
        }
    }
    Ok(Values(slots))
}

/// Adds (k, v) to the table on top of `stack`.
fn set<'a>(stack: &mut [Value<'a>], k: Value<'a>, v: Value<'a>) -> Option<()> {
    match stack.last_mut()? {
        Value::Table(pairs) => {
            pairs.push((canonical(k), canonical(v)));
            Some(())
        }
        _ => None,
    }
}

/// A finished value with its table's pairs sorted by key; of equal keys
/// (1 and 1.0 from another encoder) the last set wins, as in Lua.
fn canonical(v: Value) -> Value {
    match v {
        Value::Table(mut pairs) => {
            // stable: equal keys stay in the order they were set
            pairs.sort_by(|a, b| cmp(&a.0, &b.0));
            let mut out: Vec<(Value, Value)> = Vec::with_capacity(pairs.len());
            for pair in pairs {
                match out.last_mut() {
                    Some(last) if cmp(&last.0, &pair.0).is_eq() => *last = pair,
                    _ => out.push(pair),
                }
            }
            Value::Table(out)
        }
        v => v,
    }
}

/// A number as Lua compares it, with NaN equal to NaN: -0 as 0, every NaN
/// as one.
fn number_key(f: f64) -> f64 {
    if f == 0.0 {
        0.0
    } else if f.is_nan() {
        f64::NAN
    } else {
        f
    }
}

fn rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::Bytes(_) => 3,
        Value::Table(_) => 4,
    }
}

/// A total order on canonical values, whose Equal is the equality of the
/// module comment.
fn cmp(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => number_key(*x).total_cmp(&number_key(*y)),
        (Value::Bytes(x), Value::Bytes(y)) => x.cmp(y),
        (Value::Table(x), Value::Table(y)) => x
            .iter()
            .zip(y)
            .map(|((xk, xv), (yk, yv))| cmp(xk, yk).then_with(|| cmp(xv, yv)))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        _ => rank(a).cmp(&rank(b)),
    }
}

impl PartialEq for Values<'_> {
    fn eq(&self, other: &Values) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|pair| match pair {
                (None, None) => true,
                (Some(a), Some(b)) => cmp(a, b).is_eq(),
                _ => false,
            })
    }
}

impl Values<'_> {
    /// The values as Lua source would write them (`"a\0", 1.5, nil,
    /// {1, 2, [3.5] = true}`, ngx.null as `ngx.null`), cut to at most
    /// `max` bytes and then ending in `...`. Pure ASCII: other bytes of
    /// strings are escaped.
    pub fn show(&self, max: usize) -> String {
        let mut out = Capped {
            out: String::new(),
            max,
        };
        let full = self.write(&mut out);
        let mut text = out.out;
        if full.is_err() {
            text.truncate(max);
            text.push_str("...");
        }
        text
    }

    /// What identifies the values without showing them: how many, the
    /// length of `show`'s whole text, and the first 32 bits of its FNV-1a
    /// hash (`2 values, 41 bytes, digest 0c9e21a7`).
    pub fn digest(&self) -> String {
        let mut d = Digest {
            len: 0,
            hash: FNV_OFFSET,
        };
        // a Digest never refuses a write
        let _ = self.write(&mut d);
        let n = self.0.len();
        let s = if n == 1 { "" } else { "s" };
        format!("{n} value{s}, {} bytes, digest {:08x}", d.len, d.hash >> 32)
    }

    /// The values as Lua source, to `out`.
    fn write(&self, out: &mut impl Write) -> fmt::Result {
        self.0.iter().enumerate().try_for_each(|(i, v)| {
            if i > 0 {
                out.write_str(", ")?;
            }
            match v {
                None => out.write_str("nil"),
                Some(v) => show(v, out),
            }
        })
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A sink that only counts and hashes what is written (FNV-1a, 64 bits).
struct Digest {
    len: usize,
    hash: u64,
}

impl Write for Digest {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.len += s.len();
        for &b in s.as_bytes() {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
        Ok(())
    }
}

/// A String that refuses to grow past `max` (fmt::Error then, which stops
/// the walk of a large value early).
struct Capped {
    out: String,
    max: usize,
}

impl Write for Capped {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.out.push_str(s);
        if self.out.len() > self.max {
            return Err(fmt::Error);
        }
        Ok(())
    }
}

fn show(v: &Value, out: &mut impl Write) -> fmt::Result {
    match v {
        Value::Null => out.write_str("ngx.null"),
        Value::Bool(b) => write!(out, "{b}"),
        Value::Number(f) if f.is_nan() => out.write_str("0/0"),
        Value::Number(f) if f.is_infinite() => {
            out.write_str(if *f > 0.0 { "math.huge" } else { "-math.huge" })
        }
        Value::Number(f) => write!(out, "{f}"),
        Value::Bytes(b) => {
            out.write_char('"')?;
            for &c in *b {
                match c {
                    b'"' => out.write_str("\\\"")?,
                    b'\\' => out.write_str("\\\\")?,
                    b'\n' => out.write_str("\\n")?,
                    0x20..=0x7e => out.write_char(c as char)?,
                    _ => write!(out, "\\{c:03}")?,
                }
            }
            out.write_char('"')
        }
        Value::Table(pairs) => {
            out.write_char('{')?;
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                // keys 1..n, sorted first among numbers, read as a list
                if !matches!(k, Value::Number(n) if *n == (i + 1) as f64) {
                    out.write_char('[')?;
                    show(k, out)?;
                    out.write_str("] = ")?;
                }
                show(v, out)?;
            }
            out.write_char('}')
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes one msgpack value.
    type Writer<'a> = &'a dyn Fn(&mut Vec<u8>);

    /// The values of a payload built with rmp: (position, value writer).
    fn payload(n: u64, entries: &[(u64, Writer)]) -> Vec<u8> {
        let mut out = Vec::new();
        rmp::encode::write_uint(&mut out, n).unwrap();
        rmp::encode::write_map_len(&mut out, entries.len() as u32).unwrap();
        for (pos, write) in entries {
            rmp::encode::write_uint(&mut out, *pos).unwrap();
            write(&mut out);
        }
        out
    }

    fn of(bytes: &[u8]) -> Values<'_> {
        // SAFETY: no spans.
        unsafe { values(bytes, &[]) }.unwrap()
    }

    #[test]
    fn maps_compare_whatever_their_order_and_arrays_as_tables() {
        let ab = payload(
            1,
            &[(1, &|o| {
                rmp::encode::write_map_len(o, 2).unwrap();
                rmp::encode::write_bin(o, b"a").unwrap();
                rmp::encode::write_uint(o, 1).unwrap();
                rmp::encode::write_bin(o, b"b").unwrap();
                rmp::encode::write_f64(o, 2.0).unwrap();
            })],
        );
        let ba = payload(
            1,
            &[(1, &|o| {
                rmp::encode::write_map_len(o, 2).unwrap();
                rmp::encode::write_bin(o, b"b").unwrap();
                rmp::encode::write_uint(o, 2).unwrap();
                rmp::encode::write_bin(o, b"a").unwrap();
                rmp::encode::write_f64(o, 1.0).unwrap();
            })],
        );
        assert_eq!(of(&ab), of(&ba));
        let array = payload(
            1,
            &[(1, &|o| {
                rmp::encode::write_array_len(o, 2).unwrap();
                rmp::encode::write_bin(o, b"x").unwrap();
                rmp::encode::write_bin(o, b"y").unwrap();
            })],
        );
        let map = payload(
            1,
            &[(1, &|o| {
                rmp::encode::write_map_len(o, 2).unwrap();
                rmp::encode::write_uint(o, 2).unwrap();
                rmp::encode::write_bin(o, b"y").unwrap();
                rmp::encode::write_f64(o, 1.0).unwrap();
                rmp::encode::write_bin(o, b"x").unwrap();
            })],
        );
        assert_eq!(of(&array), of(&map));
        assert_ne!(of(&ab), of(&array));
        assert_eq!(of(&array).show(100), r#"{"x", "y"}"#);
        assert_eq!(of(&ab).show(100), r#"{["a"] = 1, ["b"] = 2}"#);
    }

    #[test]
    fn numbers_as_lua_compares_them_and_nils_by_position() {
        let num = |f: f64| payload(2, &[(2, &move |o| rmp::encode::write_f64(o, f).unwrap())]);
        assert_eq!(of(&num(0.0)), of(&num(-0.0)));
        assert_eq!(of(&num(f64::NAN)), of(&num(-f64::NAN)));
        assert_ne!(of(&num(1.0)), of(&num(1.5)));
        let int = payload(
            2,
            &[(2, &|o| {
                rmp::encode::write_uint(o, 1).unwrap();
            })],
        );
        assert_eq!(of(&int), of(&num(1.0)));
        let first = payload(
            2,
            &[(1, &|o| {
                rmp::encode::write_uint(o, 1).unwrap();
            })],
        );
        assert_ne!(of(&int), of(&first));
        let one = payload(
            1,
            &[(1, &|o| {
                rmp::encode::write_uint(o, 1).unwrap();
            })],
        );
        assert_ne!(of(&first), of(&one));
        assert_eq!(of(&int).show(100), "nil, 1");
    }

    #[test]
    fn shown_values_are_cut() {
        let long = payload(
            1,
            &[(1, &|o| rmp::encode::write_bin(o, &[0xff; 1000]).unwrap())],
        );
        let shown = of(&long).show(40);
        assert_eq!(shown.len(), 43, "{shown}");
        assert!(shown.starts_with("\"\\255\\255") && shown.ends_with("..."));
    }

    #[test]
    fn a_digest_counts_and_hashes_the_whole_text() {
        let secret =
            |s: &'static [u8]| payload(1, &[(1, &move |o| rmp::encode::write_bin(o, s).unwrap())]);
        let (a, b) = (secret(b"hunter2"), secret(b"hunter3"));
        let d = of(&a).digest();
        assert!(d.starts_with("1 value, 9 bytes, digest "), "{d}");
        assert!(!d.contains("hunter"), "{d}");
        assert_eq!(d, of(&secret(b"hunter2")).digest());
        assert_ne!(d, of(&b).digest());
        let long = payload(
            1,
            &[(1, &|o| rmp::encode::write_bin(o, &[0xff; 1000]).unwrap())],
        );
        assert!(of(&long).digest().starts_with("1 value, 4002 bytes, "));
    }
}
