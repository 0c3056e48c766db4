//! One task: its arguments, read in place from the module's payload, and
//! whether its caller gave up.

use crate::de::{DeError, Spans, ValueDe, NIL};
use crate::ffi::{self, ngx_tp_task_t};
use ngx_threadpool_wire::status;
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
    /// The entries of this thread's last task, reused: no allocation per
    /// task once a thread has seen its largest argument list.
    static SPARE: Cell<Vec<Entry>> = const { Cell::new(Vec::new()) };
}

/// A task being processed: what
/// [`Handler::process`](crate::Handler::process) gets.
///
/// `'t` is the task's life: the arguments it lends (`&'t str`,
/// `&'t [u8]`) are read in place, in the module's memory, and cannot
/// outlive the call.
pub struct Task<'t> {
    raw: &'t ngx_tp_task_t,
    payload: &'t [u8],
    spans: Spans<'t>,
    /// The number of arguments, nils included (`select('#', ...)`).
    n: usize,
    /// The arguments in the payload, by increasing position; the positions
    /// not here are nil.
    entries: Vec<Entry>,
}

impl<'t> Task<'t> {
    /// Reads the payload's layout (not its values).
    ///
    /// # Safety
    /// `raw`'s payload and spans must stay alive and unchanged for `'t`.
    pub(crate) unsafe fn new(raw: &'t ngx_tp_task_t) -> Result<Task<'t>, ArgError> {
        // SAFETY: raw's payload stays alive and unchanged for 't (the
        // contract), as long as the slice borrows it.
        let payload = unsafe { ffi::bytes(raw.args) };
        let spans = if raw.nspans == 0 {
            &[][..]
        } else {
            // SAFETY: the header's contract: spans points to nspans spans,
            // alive for 't (the caller's).
            unsafe { std::slice::from_raw_parts(raw.spans, raw.nspans) }
        };
        let mut task = Task {
            raw,
            payload,
            spans: Spans(spans),
            n: 0,
            entries: SPARE.take(),
        };
        task.entries.clear();
        task.index().map_err(ArgError::from)?;
        Ok(task)
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

    /// The number of arguments the caller passed, trailing nils included
    /// (Lua's `select('#', ...)`).
    pub fn nargs(&self) -> usize {
        self.n
    }

    /// All the arguments: a tuple, a tuple struct or a `Vec` reads them
    /// in order, one element per argument (Lua's `select` order); any
    /// other type, a struct included, reads the first argument as
    /// [`arg(1)`](Task::arg) does and expects no others. A struct is a Lua
    /// table, read by field name, wherever it is: `args::<Opts>()` and
    /// `args::<(Opts,)>()` both read `push_task({limit = 10})`.
    ///
    /// Missing arguments are nil: an `Option` reads them as `None`, another
    /// type fails. Extra arguments that are nil are ignored; others fail
    /// (`bad argument #3: expected at most 2 arguments, got string`).
    ///
    /// Strings can be borrowed: `&'t str` (checked to be UTF-8) and
    /// `&'t [u8]` point into the module's memory, also when the module read
    /// the caller's string in place (`thread_pool_zero_copy`). `String` and
    /// `Vec<u8>` copy.
    ///
    /// ```
    /// # use ngx_threadpool_handler::{ArgError, Task};
    /// fn args<'t>(task: &Task<'t>) -> Result<(&'t str, Option<u32>), ArgError> {
    ///     task.args()
    /// }
    /// ```
    pub fn args<T: Deserialize<'t>>(&self) -> Result<T, ArgError> {
        T::deserialize(Args { task: self }).map_err(ArgError::from)
    }

    /// The argument at `position`, from 1, as [`args`](Task::args) reads
    /// each (an absent one is nil): a struct is a table read by field
    /// name, a tuple or `Vec` a table read as an array. Position 0 is an
    /// error of its own (`bad argument #0: positions start at 1`), not an
    /// absent argument.
    pub fn arg<T: Deserialize<'t>>(&self, position: usize) -> Result<T, ArgError> {
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

    /// Whether the caller gave up on this task (its timeout passed, its
    /// request went away, its batch timed out): the result will be
    /// dropped, so a long handler may return early, with any value.
    ///
    /// Cheap enough for an inner loop: an indirect call into the module
    /// and one atomic load, a few nanoseconds. Once true, stays true.
    pub fn cancelled(&self) -> bool {
        // SAFETY: the header's contract: cancelled takes the task it is a
        // field of, alive for 't.
        unsafe { (self.raw.cancelled)(self.raw) != 0 }
    }

    /// Sends one chunk to the caller of a stream (`push_stream`), who gets
    /// it, as a Lua value, from `s:read()`; any value a result may be.
    /// Waits while the stream's bound of chunks are unread.
    ///
    /// [`StreamError::Cancelled`] at once once the caller let go: return
    /// then, the results are dropped.
    ///
    /// ```no_run
    /// # use ngx_threadpool_handler::{StreamError, Task};
    /// fn lines(task: &Task) -> Result<u32, StreamError> {
    ///     for i in 0..1000u32 {
    ///         task.send(&format!("line {i}\n"))?;
    ///     }
    ///     Ok(1000)
    /// }
    /// ```
    pub fn send<T: serde::Serialize + ?Sized>(&self, chunk: &T) -> Result<(), StreamError> {
        let mut payload = Vec::new();
        crate::results::sealed::Sealed::write_results(chunk, &mut payload)
            .map_err(|e| StreamError::Value(e.to_string()))?;
        // SAFETY: the header's contract: send takes the task it is a field
        // of and len bytes at payload, which it copies.
        let rc = unsafe { (self.raw.send)(self.raw, payload.as_ptr(), payload.len()) };
        stream_result(rc)
    }

    /// The next chunk the caller of a stream wrote (`s:write(v)`), read as
    /// `T`, waiting for it; `None` once the caller ended its input
    /// (`s:close_write()`) and every chunk was received. A chunk that does
    /// not read as `T` is [`StreamError::Value`] with the decoder's
    /// message; it is taken all the same, and the next call reads the next
    /// chunk.
    ///
    /// ```no_run
    /// # use ngx_threadpool_handler::{StreamError, Task};
    /// fn sum(task: &Task) -> Result<u64, StreamError> {
    ///     let mut sum = 0;
    ///     while let Some(n) = task.receive::<u64>()? {
    ///         sum += n;
    ///     }
    ///     Ok(sum)
    /// }
    /// ```
    pub fn receive<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, StreamError> {
        let mut sink = Sink {
            out: ffi::ngx_tp_out_t {
                write: sink_write,
                module: std::ptr::null_mut(),
            },
            buf: Vec::new(),
        };
        // SAFETY: the header's contract: receive takes the task it is a
        // field of and a writer, which it calls before it returns.
        let rc = unsafe { (self.raw.receive)(self.raw, &mut sink.out) };
        if rc == status::END {
            return Ok(None);
        }
        stream_result(rc)?;
        one_value(&sink.buf)
            .map(Some)
            .map_err(|e| StreamError::Value(e.message))
    }
}

/// Why a stream's send or receive did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// The caller let go of the stream (its read or write timed out, it
    /// closed the stream, its request ended): [`Task::cancelled`] is true.
    Cancelled,
    /// The task was not pushed with `push_stream`.
    NoStream,
    /// The value could not be encoded or decoded, or was too large.
    Value(String),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            StreamError::Cancelled => f.write_str("cancelled"),
            StreamError::NoStream => f.write_str(ngx_threadpool_wire::NO_STREAM),
            StreamError::Value(e) => write!(f, "bad chunk: {e}"),
        }
    }
}

impl std::error::Error for StreamError {}

fn stream_result(rc: std::ffi::c_int) -> Result<(), StreamError> {
    match rc {
        status::OK => Ok(()),
        status::CANCELLED => Err(StreamError::Cancelled),
        status::NO_STREAM => Err(StreamError::NoStream),
        rc => Err(StreamError::Value(format!("the module refused it ({rc})"))),
    }
}

/// The value of a one-value payload (`uint(1) map(k) { uint(1) value }`).
fn one_value<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, DeError> {
    let mut de = ValueDe::new(payload, Spans(&[]));
    if de.uint("bad value count")? != 1 {
        return Err(DeError::payload("bad value count"));
    }
    if de.map_len()? == 0 {
        return T::deserialize(&mut ValueDe::new(NIL, Spans(&[])));
    }
    if de.uint("bad position")? != 1 {
        return Err(DeError::payload("bad position"));
    }
    T::deserialize(&mut de)
}

/// A writer that appends to a buffer (what receive writes to).
#[repr(C)]
struct Sink {
    out: ffi::ngx_tp_out_t,
    buf: Vec<u8>,
}

unsafe extern "C" fn sink_write(
    out: *mut ffi::ngx_tp_out_t,
    data: *const u8,
    len: usize,
) -> std::ffi::c_int {
    // SAFETY: out is the first field of a Sink (repr(C)), and data points
    // to len bytes (the header's contract).
    let (sink, bytes) = unsafe {
        (
            &mut *out.cast::<Sink>(),
            ffi::bytes(ffi::ngx_tp_bytes_t { data, len }),
        )
    };
    if sink.buf.try_reserve(bytes.len()).is_err() {
        return -1;
    }
    sink.buf.extend_from_slice(bytes);
    0
}

impl Drop for Task<'_> {
    fn drop(&mut self) {
        SPARE.set(std::mem::take(&mut self.entries));
    }
}

/// The argument list, as a deserializer.
struct Args<'a, 't> {
    task: &'a Task<'t>,
}

impl<'t> Args<'_, 't> {
    /// Visits positions `1..=len` as a sequence, then checks the rest.
    fn positional<V: Visitor<'t>>(self, len: usize, v: V) -> Result<V::Value, DeError> {
        let mut seq = Positional {
            task: self.task,
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
        let mut de = ValueDe::new(self.task.slot(1), self.task.spans);
        let value = f(&mut de).map_err(|mut e| {
            e.position.get_or_insert(1);
            e
        })?;
        self.extras(1)?;
        Ok(value)
    }

    /// Fails on a non-nil argument after the first `taken`.
    fn extras(&self, taken: usize) -> Result<(), DeError> {
        let task = self.task;
        for (pos, range) in task.entries.iter().filter(|e| e.0 > taken) {
            let de = ValueDe::new(&task.payload[range.clone()], task.spans);
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

impl<'t> de::Deserializer<'t> for Args<'_, 't> {
    type Error = DeError;

    fn deserialize_seq<V: Visitor<'t>>(self, v: V) -> Result<V::Value, DeError> {
        let n = self.task.n;
        self.positional(n, v)
    }

    fn deserialize_tuple<V: Visitor<'t>>(self, len: usize, v: V) -> Result<V::Value, DeError> {
        let n = self.task.n.max(len);
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
    task: &'a Task<'t>,
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
        self.task.read(self.next, seed).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len - self.next)
    }
}
