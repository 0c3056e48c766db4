//! An argument list, read in place from the module's payload: what
//! [`Task`](crate::Task) and [`Update`](crate::Update) read their arguments
//! with, and the error that names the argument.

use crate::de::{DeError, Spans, ValueDe, NIL};
use serde::de::{self, Deserialize, DeserializeSeed, Visitor};
use std::cell::Cell;
use std::fmt;
use std::ops::Range;

/// Why the arguments could not be read as the type asked for. Its text is
/// what the caller gets when a handler returns it as an error:
///
/// ```text
/// bad argument #2: expected u32, got string
/// bad argument #1 at ["opts"]["limit"]: expected u32, got -1
/// bad argument #3: expected at most 2 arguments, got string
/// bad argument #1: expected a UTF-8 string, got invalid UTF-8 at byte 4
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgError {
    /// An argument that does not fit the type asked for, or one more than
    /// the handler takes.
    Bad {
        /// The argument's position, from 1 (Lua's `select` order).
        position: usize,
        /// Where in the argument, as Lua would index it (`["opts"][2]`),
        /// or empty for the argument itself.
        path: String,
        /// What is wrong (`expected u32, got string`).
        message: String,
    },
    /// The argument list as a whole does not fit (a `Deserialize` impl
    /// that refused it before looking at any argument).
    List(String),
    /// The payload is not one the module writes (a bug, never a value of
    /// the caller's).
    Payload(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            ArgError::Bad {
                position,
                path,
                message,
            } if path.is_empty() => write!(f, "bad argument #{position}: {message}"),
            ArgError::Bad {
                position,
                path,
                message,
            } => write!(f, "bad argument #{position} at {path}: {message}"),
            ArgError::List(message) => write!(f, "bad arguments: {message}"),
            ArgError::Payload(message) => f.write_str(&ngx_threadpool_wire::bad_payload(message)),
        }
    }
}

impl std::error::Error for ArgError {}

impl From<DeError> for ArgError {
    fn from(e: DeError) -> ArgError {
        if e.payload {
            return ArgError::Payload(e.message);
        }
        match e.position {
            Some(position) => ArgError::Bad {
                position,
                path: e.path.iter().rev().map(String::as_str).collect(),
                message: e.message,
            },
            None => ArgError::List(e.message),
        }
    }
}

/// One present argument: its position and where its value is in the
/// payload.
type Entry = (usize, Range<usize>);

thread_local! {
    /// The entries of this thread's last argument list, reused: no
    /// allocation per task once a thread has seen its largest.
    static SPARE: Cell<Vec<Entry>> = const { Cell::new(Vec::new()) };
}

/// An arguments payload and where each argument is in it.
pub(crate) struct ArgList<'t> {
    payload: &'t [u8],
    spans: Spans<'t>,
    /// The number of arguments, nils included (`select('#', ...)`).
    n: usize,
    /// The arguments in the payload, by increasing position; the positions
    /// not here are nil.
    entries: Vec<Entry>,
}

impl<'t> ArgList<'t> {
    /// Reads the payload's layout (not its values).
    pub(crate) fn new(payload: &'t [u8], spans: Spans<'t>) -> Result<ArgList<'t>, ArgError> {
        let mut list = ArgList {
            payload,
            spans,
            n: 0,
            entries: SPARE.take(),
        };
        list.entries.clear();
        list.index().map_err(ArgError::from)?;
        Ok(list)
    }

    /// `payload := uint(n) map(k) { uint(position) value }*k`
    fn index(&mut self) -> Result<(), DeError> {
        let mut de = ValueDe::new(self.payload, self.spans);
        let n = de.uint("bad value count")?;
        self.n = usize::try_from(n).map_err(|_| DeError::payload("bad value count"))?;
        for _ in 0..de.map_len()? {
            let pos = de.uint("bad position")?;
            let start = self.payload.len() - de.rest().len();
            de.skip()?;
            let end = self.payload.len() - de.rest().len();
            match usize::try_from(pos) {
                Ok(pos) if (1..=self.n).contains(&pos) => self.entries.push((pos, start..end)),
                _ => return Err(DeError::payload("bad position")),
            }
        }
        if !de.rest().is_empty() {
            return Err(DeError::payload("trailing bytes"));
        }
        // The module writes positions in order; sort in case it did not.
        self.entries.sort_unstable_by_key(|e| e.0);
        if self.entries.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(DeError::payload("repeated position"));
        }
        Ok(())
    }

    /// The encoded value at `position` (nil if absent).
    fn slot(&self, position: usize) -> &'t [u8] {
        match self.entries.binary_search_by_key(&position, |e| e.0) {
            Ok(i) => &self.payload[self.entries[i].1.clone()],
            Err(_) => NIL,
        }
    }

    fn read<T: DeserializeSeed<'t>>(&self, position: usize, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(&mut ValueDe::new(self.slot(position), self.spans))
            .map_err(|mut e| {
                e.position.get_or_insert(position);
                e
            })
    }

    /// `select('#', ...)`.
    pub(crate) fn nargs(&self) -> usize {
        self.n
    }

    /// The arguments as one value, as [`Task::args`](crate::Task::args)
    /// describes.
    pub(crate) fn args<T: Deserialize<'t>>(&self) -> Result<T, ArgError> {
        T::deserialize(ListDe { list: self }).map_err(ArgError::from)
    }

    /// The argument at `position`, as [`Task::arg`](crate::Task::arg)
    /// describes.
    pub(crate) fn arg<T: Deserialize<'t>>(&self, position: usize) -> Result<T, ArgError> {
        if position == 0 {
            return Err(ArgError::Bad {
                position,
                path: String::new(),
                message: "positions start at 1".into(),
            });
        }
        self.read(position, std::marker::PhantomData)
            .map_err(ArgError::from)
    }
}

impl Drop for ArgList<'_> {
    fn drop(&mut self) {
        SPARE.set(std::mem::take(&mut self.entries));
    }
}

/// The argument list, as a deserializer.
struct ListDe<'a, 't> {
    list: &'a ArgList<'t>,
}

impl<'t> ListDe<'_, 't> {
    /// Visits positions `1..=len` as a sequence, then checks the rest.
    fn positional<V: Visitor<'t>>(self, len: usize, v: V) -> Result<V::Value, DeError> {
        let mut seq = Positional {
            list: self.list,
            next: 0,
            len,
        };
        let value = v.visit_seq(&mut seq)?;
        self.extras(seq.next)?;
        Ok(value)
    }

    /// Reads the first argument with `f`, then checks the rest.
    fn single<V>(
        self,
        f: impl FnOnce(&mut ValueDe<'t>) -> Result<V, DeError>,
    ) -> Result<V, DeError> {
        let mut de = ValueDe::new(self.list.slot(1), self.list.spans);
        let value = f(&mut de).map_err(|mut e| {
            e.position.get_or_insert(1);
            e
        })?;
        self.extras(1)?;
        Ok(value)
    }

    /// Fails on a non-nil argument after the first `taken`.
    fn extras(&self, taken: usize) -> Result<(), DeError> {
        let list = self.list;
        for (pos, range) in list.entries.iter().filter(|e| e.0 > taken) {
            let de = ValueDe::new(&list.payload[range.clone()], list.spans);
            let got = de.lua_type();
            if got != "nil" {
                return Err(DeError {
                    position: Some(*pos),
                    ..DeError::new(format!(
                        "expected at most {taken} argument{}, got {got}",
                        if taken == 1 { "" } else { "s" }
                    ))
                });
            }
        }
        Ok(())
    }
}

/// Forwards `deserialize_*` methods to the first argument.
macro_rules! first_argument {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
            self.single(|de| de.$method(v))
        }
    )*};
}

impl<'t> de::Deserializer<'t> for ListDe<'_, 't> {
    type Error = DeError;

    fn deserialize_seq<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        let n = self.list.n;
        self.positional(n, v)
    }

    fn deserialize_tuple<V: Visitor<'t>>(self, len: usize, v: V) -> Result<V::Value, DeError> {
        let n = self.list.n.max(len);
        self.positional(n, v)
    }

    fn deserialize_tuple_struct<V: Visitor<'t>>(
        self,
        _: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_tuple(len, v)
    }

    /// A struct is a table wherever it is: the first argument.
    fn deserialize_struct<V: Visitor<'t>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        self.single(|de| de.deserialize_struct(name, fields, v))
    }

    fn deserialize_unit<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        let value = v.visit_unit()?;
        self.extras(0)?;
        Ok(value)
    }

    fn deserialize_unit_struct<V: Visitor<'t>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'t>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'t>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        self.single(|de| de.deserialize_enum(name, variants, v))
    }

    fn is_human_readable(&self) -> bool {
        true
    }

    first_argument! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_map deserialize_identifier deserialize_ignored_any
    }
}

/// Positions `1..=len` of the argument list.
struct Positional<'a, 't> {
    list: &'a ArgList<'t>,
    /// Positions read so far.
    next: usize,
    len: usize,
}

impl<'t> de::SeqAccess<'t> for &mut Positional<'_, 't> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'t>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        if self.next == self.len {
            return Ok(None);
        }
        self.next += 1;
        self.list.read(self.next, seed).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len - self.next)
    }
}
