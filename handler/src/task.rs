//! One task: its arguments (an argument list of args.rs), its stream, and
//! whether its caller gave up.

use crate::args::{ArgError, ArgList};
use crate::de::{DeError, Spans, ValueDe, NIL};
use crate::ffi::{self, ngx_tp_task_t};
use ngx_threadpool_wire::status;
use serde::Deserialize;
use std::fmt;

/// A task being processed: what
/// [`Handler::process`](crate::Handler::process) gets.
///
/// `'t` is the task's life: the arguments it lends (`&'t str`,
/// `&'t [u8]`) are read in place, in the module's memory, and cannot
/// outlive the call.
pub struct Task<'t> {
    raw: &'t ngx_tp_task_t,
    list: ArgList<'t>,
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
        Ok(Task {
            raw,
            list: ArgList::new(payload, Spans(spans))?,
        })
    }

    /// The number of arguments the caller passed, trailing nils included
    /// (Lua's `select('#', ...)`).
    pub fn nargs(&self) -> usize {
        self.list.nargs()
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
        self.list.args()
    }

    /// The argument at `position`, from 1, as [`args`](Task::args) reads
    /// each (an absent one is nil): a struct is a table read by field
    /// name, a tuple or `Vec` a table read as an array. Position 0 is an
    /// error of its own (`bad argument #0: positions start at 1`), not an
    /// absent argument.
    pub fn arg<T: Deserialize<'t>>(&self, position: usize) -> Result<T, ArgError> {
        self.list.arg(position)
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
