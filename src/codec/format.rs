//! The payload format's limits and the writer that builds a payload (the
//! layout is in the codec's module comment).

use std::fmt;

/// The limits, declared with the handler crate's (ngx_threadpool_wire):
/// MAX_DEPTH, MAX_VALUES, MAX_PAYLOAD, and the ext type of a borrowed
/// string, whose data is the big-endian u32 index of the payload's `Span`
/// holding it.
pub use ngx_threadpool_wire::{EXT_BORROWED as BORROWED, MAX_DEPTH, MAX_PAYLOAD, MAX_VALUES};

pub use crate::luajit::NOT_ENOUGH_MEMORY;

/// Bytes of a borrowed string's ext in the payload (fixext 4).
pub(super) const BORROWED_EXT_LEN: usize = 6;

/// The bytes of a borrowed string. Whoever hands a payload with spans over
/// keeps their bytes alive and unchanged until the payload is done with:
/// the shim anchors a caller's strings until the task's completion reaches
/// the event loop; a pool thread pins its result strings until the event
/// loop drops the result (thread/run.rs).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub data: *const u8,
    pub len: usize,
}

// SAFETY: a Span is a pointer to immutable bytes kept alive by their owner
// (above) for as long as the Span is read, from whichever thread reads it.
unsafe impl Send for Span {}

// SAFETY: as for Send: the bytes are immutable, so threads may read them
// at once (the tasks of one push share its spans, handoff/job.rs).
unsafe impl Sync for Span {}

impl Span {
    pub fn of(bytes: &[u8]) -> Span {
        Span {
            data: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// # Safety
    /// The bytes must still be kept alive by their owner (see Span).
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: the owner still keeps the bytes alive (the contract), so
        // `len` bytes from `data` are readable for as long as the caller uses
        // them.
        unsafe { crate::ngx::shim::bytes(self.data, self.len) }
    }
}

/// Why values could not cross.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// A buffer could not grow (its size comes from user data), or Lua
    /// ran out of memory building the values.
    OutOfMemory,
    /// A value that cannot cross, or a payload that is not one: the text
    /// the caller gets (`cannot pass function in argument #2`).
    Value(String),
    /// A payload the decoder refuses (a bug or corruption, never a value
    /// of the caller's): `bad payload: ...`.
    BadPayload(String),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            CodecError::OutOfMemory => f.write_str(NOT_ENOUGH_MEMORY),
            CodecError::Value(msg) => f.write_str(msg),
            CodecError::BadPayload(msg) => f.write_str(&ngx_threadpool_wire::bad_payload(msg)),
        }
    }
}

const TWO63: f64 = 9_223_372_036_854_775_808.0;

/// Lua stack slots that walking or building MAX_DEPTH nested tables needs
/// above the outermost one: at most two per level (key and value while
/// walking a map; table and key while building one) and a leaf.  Reserved
/// once up front, so that pushes need no check each.
pub const NEST_SLOTS: usize = 2 * MAX_DEPTH + 2;

/// Bytes of a msgpack bin header for `len` bytes.
pub(super) fn bin_header_len(len: usize) -> usize {
    if len < 256 {
        2
    } else if len < 65536 {
        3
    } else {
        5
    }
}

/// `f` as an i64 when it is integral and in int64 range.  (Not through
/// `f.trunc()`: without SSE4.1 that is a slow library call.)
pub(super) fn as_int(f: f64) -> Option<i64> {
    let i = f as i64;
    ((-TWO63..TWO63).contains(&f) && i as f64 == f).then_some(i)
}

/// The payload of one string value (an error message), for when no Lua
/// state is at hand.
pub fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_uint(out, 1);
    let _ = rmp::encode::write_map_len(out, 1);
    let _ = rmp::encode::write_uint(out, 1);
    let _ = rmp::encode::write_bin(out, s);
}
