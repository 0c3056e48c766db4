//! Deserializes one value of an arguments payload (the format is in the
//! crate's docs) into any `Deserialize` type, borrowing strings from the
//! payload or, for a borrowed string, from its span: nothing is copied
//! unless the target type owns its data (`String`, `Vec<u8>`).

use crate::ffi::{self, ngx_tp_bytes_t};
use ngx_threadpool_wire::EXT_BORROWED;
use rmp::Marker;
use serde::de::{self, DeserializeSeed, IntoDeserializer, Unexpected, Visitor};
use std::fmt;

/// The borrowed strings of one task.
///
/// Invariant: every span points to bytes that stay alive and unchanged for
/// `'t` (the module keeps them so until `ngx_threadpool_process` returns,
/// and `'t` ends before that: see `Task`).
#[derive(Clone, Copy)]
pub(crate) struct Spans<'t>(pub(crate) &'t [ngx_tp_bytes_t]);

impl<'t> Spans<'t> {
    fn get(self, index: u32) -> Option<&'t [u8]> {
        let span = *self.0.get(index as usize)?;
        // SAFETY: the type's invariant: the span's bytes live for 't.
        Some(unsafe { ffi::bytes(span) })
    }
}

/// Why a value could not be read: a message and, innermost first, where in
/// the argument it is (`["opts"]`, `[2]`), added while unwinding so that
/// the success path formats nothing.
#[derive(Debug)]
pub(crate) struct DeError {
    pub(crate) message: String,
    pub(crate) path: Vec<String>,
    /// The payload itself is broken (never a caller's value).
    pub(crate) payload: bool,
    /// The 1-based argument it is in, once known.
    pub(crate) position: Option<usize>,
}

impl DeError {
    pub(crate) fn new(message: String) -> DeError {
        DeError {
            message,
            path: Vec::new(),
            payload: false,
            position: None,
        }
    }

    pub(crate) fn payload(message: &str) -> DeError {
        DeError {
            payload: true,
            ..DeError::new(message.to_string())
        }
    }

    fn within(mut self, seg: impl FnOnce() -> String) -> DeError {
        if !self.payload {
            self.path.push(seg());
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> DeError {
        DeError::new(msg.to_string())
    }

    fn invalid_type(unexp: Unexpected, exp: &dyn de::Expected) -> DeError {
        DeError::new(format!("expected {exp}, got {}", lua_name(unexp)))
    }

    fn invalid_value(unexp: Unexpected, exp: &dyn de::Expected) -> DeError {
        DeError::invalid_type(unexp, exp)
    }
}

/// What the caller passed, in Lua's words: a number as itself, another
/// value by its type.
fn lua_name(unexp: Unexpected) -> String {
    match unexp {
        Unexpected::Unsigned(u) => u.to_string(),
        Unexpected::Signed(i) => i.to_string(),
        Unexpected::Float(f) => f.to_string(),
        Unexpected::Bool(_) => "boolean".into(),
        Unexpected::Str(_) | Unexpected::Bytes(_) | Unexpected::Char(_) => "string".into(),
        Unexpected::Unit | Unexpected::Option => "nil".into(),
        Unexpected::Seq | Unexpected::Map => "table".into(),
        _ => "a value of another type".into(),
    }
}

/// msgpack nil: the value of an absent position.
pub(crate) const NIL: &[u8] = &[0xc0];

/// The head of one msgpack value.
enum Head<'t> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    /// str, bin or a borrowed string: Lua strings are bytes.
    Bytes(&'t [u8]),
    Array(usize),
    Map(usize),
}

/// Reads values from a payload.
pub(crate) struct ValueDe<'t> {
    rd: &'t [u8],
    spans: Spans<'t>,
}

impl<'t> ValueDe<'t> {
    pub(crate) fn new(rd: &'t [u8], spans: Spans<'t>) -> ValueDe<'t> {
        ValueDe { rd, spans }
    }

    /// What is left to read.
    pub(crate) fn rest(&self) -> &'t [u8] {
        self.rd
    }

    fn take(&mut self, n: usize) -> Result<&'t [u8], DeError> {
        if self.rd.len() < n {
            return Err(DeError::payload("truncated"));
        }
        let (head, rest) = self.rd.split_at(n);
        self.rd = rest;
        Ok(head)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DeError> {
        let b = self.take(N)?;
        // take returned exactly N bytes
        Ok(b.try_into().unwrap_or([0; N]))
    }

    fn len<const N: usize>(&mut self) -> Result<usize, DeError> {
        let b = self.be::<N>()?;
        Ok(b.iter().fold(0usize, |n, &d| n << 8 | d as usize))
    }

    fn peek_nil(&self) -> bool {
        self.rd.first() == Some(&NIL[0])
    }

    fn head(&mut self) -> Result<Head<'t>, DeError> {
        let m = Marker::from_u8(self.take(1)?[0]);
        Ok(match m {
            Marker::Null => Head::Nil,
            Marker::True => Head::Bool(true),
            Marker::False => Head::Bool(false),
            Marker::FixPos(u) => Head::Uint(u.into()),
            Marker::U8 => Head::Uint(self.len::<1>()? as u64),
            Marker::U16 => Head::Uint(self.len::<2>()? as u64),
            Marker::U32 => Head::Uint(self.len::<4>()? as u64),
            Marker::U64 => Head::Uint(u64::from_be_bytes(self.be()?)),
            Marker::FixNeg(i) => Head::Int(i.into()),
            Marker::I8 => Head::Int(i8::from_be_bytes(self.be()?).into()),
            Marker::I16 => Head::Int(i16::from_be_bytes(self.be()?).into()),
            Marker::I32 => Head::Int(i32::from_be_bytes(self.be()?).into()),
            Marker::I64 => Head::Int(i64::from_be_bytes(self.be()?)),
            Marker::F32 => Head::Float(f32::from_be_bytes(self.be()?).into()),
            Marker::F64 => Head::Float(f64::from_be_bytes(self.be()?)),
            Marker::FixStr(n) => Head::Bytes(self.take(n.into())?),
            Marker::Str8 | Marker::Bin8 => {
                let n = self.len::<1>()?;
                Head::Bytes(self.take(n)?)
            }
            Marker::Str16 | Marker::Bin16 => {
                let n = self.len::<2>()?;
                Head::Bytes(self.take(n)?)
            }
            Marker::Str32 | Marker::Bin32 => {
                let n = self.len::<4>()?;
                Head::Bytes(self.take(n)?)
            }
            Marker::FixArray(n) => Head::Array(n.into()),
            Marker::Array16 => Head::Array(self.len::<2>()?),
            Marker::Array32 => Head::Array(self.len::<4>()?),
            Marker::FixMap(n) => Head::Map(n.into()),
            Marker::Map16 => Head::Map(self.len::<2>()?),
            Marker::Map32 => Head::Map(self.len::<4>()?),
            Marker::FixExt4 => {
                if self.be::<1>()?[0] as i8 != EXT_BORROWED {
                    return Err(DeError::payload("unsupported msgpack ext type"));
                }
                let index = u32::from_be_bytes(self.be()?);
                Head::Bytes(
                    self.spans
                        .get(index)
                        .ok_or_else(|| DeError::payload("bad borrowed string"))?,
                )
            }
            _ => return Err(DeError::payload("unsupported msgpack marker")),
        })
    }

    /// Reads an unsigned int (the payload's count and positions).
    pub(crate) fn uint(&mut self, what: &str) -> Result<u64, DeError> {
        match self.head() {
            Ok(Head::Uint(u)) => Ok(u),
            _ => Err(DeError::payload(what)),
        }
    }

    /// Reads a map's head: its number of entries.
    pub(crate) fn map_len(&mut self) -> Result<usize, DeError> {
        match self.head() {
            Ok(Head::Map(n)) => Ok(n),
            _ => Err(DeError::payload("expected a map")),
        }
    }

    /// The Lua type of the next value, without reading it.
    pub(crate) fn lua_type(&self) -> &'static str {
        let mut de = ValueDe::new(self.rd, self.spans);
        match de.head() {
            Ok(Head::Nil) => "nil",
            Ok(Head::Bool(_)) => "boolean",
            Ok(Head::Uint(_) | Head::Int(_) | Head::Float(_)) => "number",
            Ok(Head::Bytes(_)) => "string",
            Ok(Head::Array(_) | Head::Map(_)) => "table",
            Err(_) => "a broken value",
        }
    }

    /// Skips one value.
    pub(crate) fn skip(&mut self) -> Result<(), DeError> {
        let items = match self.head()? {
            Head::Array(n) => n,
            Head::Map(n) => n
                .checked_mul(2)
                .ok_or_else(|| DeError::payload("bad map"))?,
            _ => 0,
        };
        (0..items).try_for_each(|_| self.skip())
    }

    fn visit<V: Visitor<'t>>(&mut self, head: Head<'t>, v: V) -> Result<V::Value, DeError> {
        match head {
            Head::Nil => v.visit_unit(),
            Head::Bool(b) => v.visit_bool(b),
            Head::Uint(u) => v.visit_u64(u),
            Head::Int(i) => v.visit_i64(i),
            Head::Float(f) => v.visit_f64(f),
            Head::Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => v.visit_borrowed_str(s),
                Err(_) => v.visit_borrowed_bytes(b),
            },
            Head::Array(n) => {
                let mut seq = Items {
                    de: self,
                    left: n,
                    index: 0,
                };
                let value = v.visit_seq(&mut seq)?;
                seq.end(n)?;
                Ok(value)
            }
            Head::Map(n) => {
                let mut map = Entries {
                    de: self,
                    left: n,
                    key: &[],
                };
                let value = v.visit_map(&mut map)?;
                map.end(n)?;
                Ok(value)
            }
        }
    }

    fn visit_str<V: Visitor<'t>>(&mut self, v: V) -> Result<V::Value, DeError> {
        match self.head()? {
            Head::Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => v.visit_borrowed_str(s),
                Err(e) => Err(DeError::new(format!(
                    "expected a UTF-8 string, got invalid UTF-8 at byte {}",
                    e.valid_up_to() + 1
                ))),
            },
            other => self.visit(other, v),
        }
    }
}

impl<'t> de::Deserializer<'t> for &mut ValueDe<'t> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        let head = self.head()?;
        self.visit(head, v)
    }

    fn deserialize_option<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        if self.peek_nil() {
            self.take(1)?;
            v.visit_none()
        } else {
            v.visit_some(self)
        }
    }

    fn deserialize_str<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        self.visit_str(v)
    }

    fn deserialize_string<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        self.visit_str(v)
    }

    fn deserialize_identifier<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        self.visit_str(v)
    }

    fn deserialize_bytes<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        match self.head()? {
            Head::Bytes(b) => v.visit_borrowed_bytes(b),
            other => self.visit(other, v),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        self.deserialize_bytes(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'t>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(self)
    }

    /// A unit variant is its name; another variant a table of one entry,
    /// its name to its value (serde's externally tagged form).
    fn deserialize_enum<V: Visitor<'t>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        match self.head()? {
            Head::Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => v.visit_enum(s.into_deserializer()),
                Err(_) => Err(de::Error::invalid_type(Unexpected::Bytes(b), &v)),
            },
            Head::Map(1) => v.visit_enum(Variant { de: self }),
            other => self.visit(other, v),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        self.skip()?;
        v.visit_unit()
    }

    /// Lua strings and numbers are what a person wrote (an address as
    /// "127.0.0.1", not as four bytes).
    fn is_human_readable(&self) -> bool {
        true
    }

    serde::forward_to_deserialize_any! {
        <W: Visitor<'t>>
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char unit
        unit_struct seq tuple tuple_struct map struct
    }
}

/// The items of an array.
struct Items<'a, 't> {
    de: &'a mut ValueDe<'t>,
    left: usize,
    index: usize,
}

impl Items<'_, '_> {
    /// Fails if the visitor left items unread: a tuple of 2 given 3.
    fn end(&self, n: usize) -> Result<(), DeError> {
        if self.left == 0 {
            return Ok(());
        }
        Err(DeError::new(format!(
            "expected a table of length {}, got length {n}",
            self.index
        )))
    }
}

impl<'t> de::SeqAccess<'t> for &mut Items<'_, 't> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'t>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.index += 1;
        let index = self.index;
        seed.deserialize(&mut *self.de)
            .map(Some)
            .map_err(|e| e.within(|| format!("[{index}]")))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// The entries of a map.
struct Entries<'a, 't> {
    de: &'a mut ValueDe<'t>,
    left: usize,
    /// The encoded key of the entry being read, for an error's path.
    key: &'t [u8],
}

impl Entries<'_, '_> {
    fn end(&self, n: usize) -> Result<(), DeError> {
        if self.left == 0 {
            return Ok(());
        }
        Err(DeError::new(format!(
            "expected a table of {} entries, got {n}",
            n - self.left
        )))
    }

    /// The path segment of the current key, as Lua code would index it.
    fn segment(&self) -> String {
        let mut de = ValueDe::new(self.key, self.de.spans);
        match de.head() {
            Ok(Head::Bytes(b)) => format!("[{:?}]", String::from_utf8_lossy(b)),
            Ok(Head::Uint(u)) => format!("[{u}]"),
            Ok(Head::Int(i)) => format!("[{i}]"),
            Ok(Head::Float(f)) => format!("[{f}]"),
            Ok(Head::Bool(b)) => format!("[{b}]"),
            _ => "[table]".to_string(),
        }
    }
}

impl<'t> de::MapAccess<'t> for &mut Entries<'_, 't> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'t>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let start = self.de.rest();
        let key = seed.deserialize(&mut *self.de);
        self.key = &start[..start.len() - self.de.rest().len()];
        key.map(Some).map_err(|e| e.within(|| "(key)".to_string()))
    }

    fn next_value_seed<T: DeserializeSeed<'t>>(&mut self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(&mut *self.de)
            .map_err(|e| e.within(|| self.segment()))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// A variant given as a table of one entry.
struct Variant<'a, 't> {
    de: &'a mut ValueDe<'t>,
}

impl<'t> de::EnumAccess<'t> for Variant<'_, 't> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'t>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let name = seed.deserialize(&mut *self.de)?;
        Ok((name, self))
    }
}

impl<'t> de::VariantAccess<'t> for Variant<'_, 't> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        de::Deserialize::deserialize(&mut *self.de)
    }

    fn newtype_variant_seed<T: DeserializeSeed<'t>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(&mut *self.de)
    }

    fn tuple_variant<V: Visitor<'t>>(self, _: usize, v: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_any(&mut *self.de, v)
    }

    fn struct_variant<V: Visitor<'t>>(
        self,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_any(&mut *self.de, v)
    }
}
