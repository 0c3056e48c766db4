//! Serializes one result value as MessagePack into a buffer, the way the
//! module's decoder builds Lua values from it: strings as str, bytes
//! (`serde_bytes`) as bin, numbers as int or float64, `None` and `()` as
//! nil, sequences and tuples as arrays, maps and structs as maps (any key
//! type: a Lua table takes any key but nil and NaN), enums as serde's
//! externally tagged form (a unit variant is its name).

use ngx_threadpool_wire::{self as wire, MAX_DEPTH};
use serde::ser::{self, Serialize};
use std::fmt;

/// Why a value could not be serialized.
#[derive(Debug)]
pub(crate) struct SerError(pub(crate) String);

impl fmt::Display for SerError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SerError {}

impl ser::Error for SerError {
    fn custom<T: fmt::Display>(msg: T) -> SerError {
        SerError(msg.to_string())
    }
}

/// Writes msgpack into `out`. Writing into a `Vec` cannot fail, so the
/// results of rmp's writers are ignored.
pub(crate) struct Ser<'a> {
    out: &'a mut Vec<u8>,
    /// Tables around the value written next: past MAX_DEPTH the
    /// module would refuse the whole payload (`bad payload`), so the value
    /// is refused here, in the Lua encoder's words.
    depth: usize,
}

/// The msgpack markers of a 32-bit length, written when the length is only
/// known at the end (a serde sequence or map of unknown size) and patched
/// then. The module's decoder, like any msgpack reader, takes a length in
/// a wider encoding than needed.
const ARRAY32: u8 = 0xdd;
const MAP32: u8 = 0xdf;

impl<'a> Ser<'a> {
    /// Writes one value, at the top level, into `out`.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Ser<'a> {
        Ser { out, depth: 0 }
    }

    /// Goes one table deeper.
    fn enter(&mut self) -> Result<(), SerError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(SerError(wire::too_deep()));
        }
        Ok(())
    }

    /// An enum variant's table of one entry, its value to follow.
    fn variant_key(&mut self, variant: &str) -> Result<(), SerError> {
        self.enter()?;
        let _ = rmp::encode::write_map_len(self.out, 1);
        let _ = rmp::encode::write_str(self.out, variant);
        Ok(())
    }

    /// A compound of `len` items, or of a length patched in at its end.
    fn compound(&mut self, len: Option<usize>, map: bool) -> Result<Compound<'_>, SerError> {
        self.enter()?;
        let patch = match len {
            Some(len) => {
                let len = u32::try_from(len).map_err(|_| SerError("too many items".into()))?;
                let _ = if map {
                    rmp::encode::write_map_len(self.out, len)
                } else {
                    rmp::encode::write_array_len(self.out, len)
                };
                None
            }
            None => {
                self.out.push(if map { MAP32 } else { ARRAY32 });
                self.out.extend_from_slice(&[0; 4]);
                Some(self.out.len() - 4)
            }
        };
        Ok(Compound {
            out: self.out,
            patch,
            count: 0,
            depth: self.depth,
        })
    }
}

/// An array or a map being written.
pub(crate) struct Compound<'a> {
    out: &'a mut Vec<u8>,
    /// Where to patch the length in, when it was not known.
    patch: Option<usize>,
    /// Items (map entries) written.
    count: u32,
    /// Its own level: the depth of its items.
    depth: usize,
}

impl Compound<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        value.serialize(&mut Ser {
            out: self.out,
            depth: self.depth,
        })
    }

    /// A map key: refused if nil or NaN, which a Lua table cannot hold.
    fn key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), SerError> {
        let start = self.out.len();
        self.item(key)?;
        match &self.out[start..] {
            [0xc0] => Err(SerError(wire::NIL_KEY.into())),
            [0xcb, f @ ..] if f64::from_be_bytes(f.try_into().unwrap_or_default()).is_nan() => {
                Err(SerError(wire::NAN_KEY.into()))
            }
            _ => Ok(()),
        }
    }

    fn end(self) -> Result<(), SerError> {
        if let Some(at) = self.patch {
            self.out[at..at + 4].copy_from_slice(&self.count.to_be_bytes());
        }
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut Ser<'_> {
    type Ok = ();
    type Error = SerError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), SerError> {
        let _ = rmp::encode::write_bool(self.out, v);
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), SerError> {
        self.serialize_i64(v.into())
    }

    fn serialize_i16(self, v: i16) -> Result<(), SerError> {
        self.serialize_i64(v.into())
    }

    fn serialize_i32(self, v: i32) -> Result<(), SerError> {
        self.serialize_i64(v.into())
    }

    fn serialize_i64(self, v: i64) -> Result<(), SerError> {
        let _ = rmp::encode::write_sint(self.out, v);
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Result<(), SerError> {
        self.serialize_u64(v.into())
    }

    fn serialize_u16(self, v: u16) -> Result<(), SerError> {
        self.serialize_u64(v.into())
    }

    fn serialize_u32(self, v: u32) -> Result<(), SerError> {
        self.serialize_u64(v.into())
    }

    fn serialize_u64(self, v: u64) -> Result<(), SerError> {
        let _ = rmp::encode::write_uint(self.out, v);
        Ok(())
    }

    /// float64 always: a Lua number is one.
    fn serialize_f32(self, v: f32) -> Result<(), SerError> {
        self.serialize_f64(v.into())
    }

    fn serialize_f64(self, v: f64) -> Result<(), SerError> {
        let _ = rmp::encode::write_f64(self.out, v);
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), SerError> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<(), SerError> {
        let _ = rmp::encode::write_str(self.out, v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), SerError> {
        let _ = rmp::encode::write_bin(self.out, v);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), SerError> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), SerError> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), SerError> {
        let _ = rmp::encode::write_nil(self.out);
        Ok(())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), SerError> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), SerError> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), SerError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), SerError> {
        self.variant_key(variant)?;
        value.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a>, SerError> {
        self.compound(len, false)
    }

    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, SerError> {
        self.compound(Some(len), false)
    }

    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>, SerError> {
        self.compound(Some(len), false)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, SerError> {
        self.variant_key(variant)?;
        self.compound(Some(len), false)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a>, SerError> {
        self.compound(len, true)
    }

    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>, SerError> {
        self.compound(Some(len), true)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, SerError> {
        self.variant_key(variant)?;
        self.compound(Some(len), true)
    }

    /// Addresses, times and the like as the text a person would write.
    fn is_human_readable(&self) -> bool {
        true
    }
}

impl ser::SerializeSeq for Compound<'_> {
    type Ok = ();
    type Error = SerError;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        self.count += 1;
        self.item(value)
    }

    fn end(self) -> Result<(), SerError> {
        Compound::end(self)
    }
}

/// Tuples and tuple structs are arrays, as sequences are.
macro_rules! as_seq {
    ($($trait:ident)*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = SerError;

            fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
                ser::SerializeSeq::serialize_element(self, value)
            }

            fn end(self) -> Result<(), SerError> {
                Compound::end(self)
            }
        }
    )*};
}

as_seq!(SerializeTupleStruct SerializeTupleVariant);

impl ser::SerializeTuple for Compound<'_> {
    type Ok = ();
    type Error = SerError;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), SerError> {
        Compound::end(self)
    }
}

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = SerError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), SerError> {
        self.count += 1;
        self.key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        self.item(value)
    }

    fn end(self) -> Result<(), SerError> {
        Compound::end(self)
    }
}

/// Structs are maps from their field names.
macro_rules! as_map {
    ($($trait:ident)*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = SerError;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), SerError> {
                ser::SerializeMap::serialize_entry(self, key, value)
            }

            fn end(self) -> Result<(), SerError> {
                Compound::end(self)
            }
        }
    )*};
}

as_map!(SerializeStruct SerializeStructVariant);
