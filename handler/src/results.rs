//! A handler's results as a payload (`uint(n) map(k) { uint(position)
//! value }*k`, nils left out of the map), or its error as one value.

use serde::Serialize;
use std::fmt::Display;

/// What [`Handler::Output`](crate::Handler::Output) may be: any
/// [`Serialize`] value is one result (`Ok(())` and `Ok(None)` are one
/// nil); [`Values`] holds several.
///
/// The caller gets them as Lua values: strings (`String`, `&str`) as Lua
/// strings, byte strings too when wrapped for serde as bytes
/// ([`serde_bytes`]; a bare `Vec<u8>` is an array of numbers), numbers,
/// booleans, `None` as nil (`ngx.null` inside a table, which cannot hold
/// nil), sequences as arrays, maps and structs as
/// tables (map keys of any type but nil and NaN), a unit enum variant as
/// its name and another as a table of one entry.
pub trait IntoResults: sealed::Sealed {}

impl<T: Serialize + ?Sized> IntoResults for T {}

impl<L: ValueList> IntoResults for Values<L> {}

/// Several results, as Lua's `return a, b, c`: a tuple (`Values((a, b))`,
/// `Values(())` for none) or a sequence (`Values(vec)`, like
/// `unpack(t)`). `None` elements are nil values; the caller's
/// `select('#', ...)` counts them.
///
/// ```
/// # use ngx_threadpool_handler::Values;
/// fn process() -> Result<Values<(u32, Option<&'static str>, bool)>, String> {
///     Ok(Values((200, None, true))) // 200, nil, true
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values<L>(pub L);

/// A list of values for [`Values`]: tuples of up to 12 [`Serialize`]
/// elements, `Vec`s, slices and arrays.
pub trait ValueList: sealed::List {}

impl<L: sealed::List> ValueList for L {}

pub(crate) mod sealed {
    use super::Values;
    use crate::ser::Ser;
    use ngx_threadpool_wire::{too_many, MAX_VALUES};
    use serde::Serialize;
    use std::fmt;

    /// Why results could not be written; its text is the caller's error.
    #[derive(Debug)]
    pub enum ResultsError {
        /// More values than a payload holds (the module's limit).
        TooMany,
        /// The value at this position could not be serialized, and why.
        Value(u32, String),
    }

    impl fmt::Display for ResultsError {
        fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
            match self {
                ResultsError::TooMany => f.write_str(&too_many("return value")),
                ResultsError::Value(pos, e) => write!(f, "cannot encode return value #{pos}: {e}"),
            }
        }
    }

    /// Appends results to a payload: the position of each value to come
    /// first, then the non-nil ones.
    pub struct Writer<'a> {
        out: &'a mut Vec<u8>,
        n: u32,
        k: u32,
    }

    impl Writer<'_> {
        /// Writes one value at the next position, unless it is nil.
        fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ResultsError> {
            // u32 holds MAX_VALUES
            if self.n as usize == MAX_VALUES {
                return Err(ResultsError::TooMany);
            }
            self.n += 1;
            let start = self.out.len();
            let _ = rmp::encode::write_uint(self.out, self.n.into());
            let at = self.out.len();
            value
                .serialize(&mut Ser::new(self.out))
                .map_err(|e| ResultsError::Value(self.n, e.0))?;
            if self.out[at..] == [0xc0] {
                self.out.truncate(start);
            } else {
                self.k += 1;
            }
            Ok(())
        }
    }

    /// Writes itself into a payload; only this crate's types do.
    pub trait Sealed {
        /// Appends the payload of the results to `out` (empty).
        fn write_results(&self, out: &mut Vec<u8>) -> Result<(), ResultsError>;
    }

    impl<T: Serialize + ?Sized> Sealed for T {
        fn write_results(&self, out: &mut Vec<u8>) -> Result<(), ResultsError> {
            let _ = rmp::encode::write_uint(out, 1);
            let _ = rmp::encode::write_map_len(out, 1);
            let start = out.len();
            Writer { out, n: 0, k: 0 }.value(self)?;
            if out.len() == start {
                // nil: no entry
                out.truncate(start - 1);
                let _ = rmp::encode::write_map_len(out, 0);
            }
            Ok(())
        }
    }

    impl<L: List> Sealed for Values<L> {
        /// The counts are known at the end: written in fixed widths
        /// (uint32, map32) and patched.
        fn write_results(&self, out: &mut Vec<u8>) -> Result<(), ResultsError> {
            out.extend_from_slice(&[0xce, 0, 0, 0, 0, 0xdf, 0, 0, 0, 0]);
            let mut w = Writer { out, n: 0, k: 0 };
            self.0.write(&mut w)?;
            let (n, k) = (w.n.to_be_bytes(), w.k.to_be_bytes());
            out[1..5].copy_from_slice(&n);
            out[6..10].copy_from_slice(&k);
            Ok(())
        }
    }

    /// A list of values; only this crate's impls.
    pub trait List {
        /// Writes each element as one value.
        fn write(&self, w: &mut Writer) -> Result<(), ResultsError>;
    }

    macro_rules! tuples {
        ($(($($name:ident $idx:tt)*))*) => {$(
            impl<$($name: Serialize),*> List for ($($name,)*) {
                #[allow(unused_variables)]
                fn write(&self, w: &mut Writer) -> Result<(), ResultsError> {
                    $(w.value(&self.$idx)?;)*
                    Ok(())
                }
            }
        )*};
    }

    tuples! {
        ()
        (A 0)
        (A 0 B 1)
        (A 0 B 1 C 2)
        (A 0 B 1 C 2 D 3)
        (A 0 B 1 C 2 D 3 E 4)
        (A 0 B 1 C 2 D 3 E 4 F 5)
        (A 0 B 1 C 2 D 3 E 4 F 5 G 6)
        (A 0 B 1 C 2 D 3 E 4 F 5 G 6 H 7)
        (A 0 B 1 C 2 D 3 E 4 F 5 G 6 H 7 I 8)
        (A 0 B 1 C 2 D 3 E 4 F 5 G 6 H 7 I 8 J 9)
        (A 0 B 1 C 2 D 3 E 4 F 5 G 6 H 7 I 8 J 9 K 10)
        (A 0 B 1 C 2 D 3 E 4 F 5 G 6 H 7 I 8 J 9 K 10 L 11)
    }

    impl<T: Serialize> List for [T] {
        fn write(&self, w: &mut Writer) -> Result<(), ResultsError> {
            self.iter().try_for_each(|v| w.value(v))
        }
    }

    impl<T: Serialize, const N: usize> List for [T; N] {
        fn write(&self, w: &mut Writer) -> Result<(), ResultsError> {
            self.as_slice().write(w)
        }
    }

    impl<T: Serialize> List for Vec<T> {
        fn write(&self, w: &mut Writer) -> Result<(), ResultsError> {
            self.as_slice().write(w)
        }
    }
}

/// The payload of one string value: an error the caller gets as `nil, e`.
pub(crate) fn error_payload(e: impl Display, out: &mut Vec<u8>) {
    out.clear();
    let _ = rmp::encode::write_uint(out, 1);
    let _ = rmp::encode::write_map_len(out, 1);
    let _ = rmp::encode::write_uint(out, 1);
    let _ = rmp::encode::write_str(out, &e.to_string());
}
