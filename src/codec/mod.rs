//! MessagePack codec for the values crossing between the nginx event
//! loop's LuaJIT VM and the pool threads' LuaJIT VMs: one encoder and one
//! decoder, both on raw Lua stacks, used on both sides.
//!
//! ```text
//! payload := uint(n) map(k) { uint(position) value }*k
//! ```
//!
//! `n` is the number of values (`select('#', ...)`); only the non-nil ones
//! are in the map, so nils, trailing ones included, survive the trip.
//! A string of at least the pool's `thread_pool_zero_copy` size may instead
//! be borrowed: the payload holds an ext (type 1, the big-endian u32 index
//! of a `Span`) and travels with the spans, read in place when decoded.
//! `ngx.null` (the NULL light userdata) is msgpack nil; integral numbers use
//! the smallest int encoding, others float64; strings are always bin; a table
//! whose keys are exactly `1..n` is an array, any other table a map.
//!
//! Lua errors unwind as foreign exceptions on x64, which Rust cannot
//! catch, and Rust panics must not unwind into LuaJIT; so each half keeps
//! the two apart. Encoding walks values without allocating in Lua
//! (encode.rs): nothing raises, and a panic guard may wrap it. Decoding
//! checks a whole payload into ops in pure Rust (decode.rs), under a panic
//! guard, and only then pushes them (lua::stack::build): a loop that can
//! raise (out of memory, a finalizer's error) but cannot panic, and owns
//! nothing a raise could leak.

mod decode;
mod encode;
mod format;
mod message;
mod value;

pub use decode::{decode, error_text, reuse, Decoded};
pub use encode::{
    anchor, reserve_walk, stack_overflow, write_values, write_walked, Borrow, Source,
};
pub use format::{
    encode_string, CodecError, Span, MAX_DEPTH, MAX_PAYLOAD, MAX_VALUES, NEST_SLOTS,
    NOT_ENOUGH_MEMORY,
};
pub use message::{lua_type_name, size_message};
pub use value::{values, Value, Values};

#[cfg(test)]
mod tests;

use crate::luajit::stack;
use crate::ngx::guard;
use mlua::ffi::lua_State;

/// Pushes the values of a payload (`bytes`, borrowing `spans`) onto the
/// stack of `l`: how many.
///
/// # Safety
/// `l` must be a live state of this thread; the spans' bytes must be
/// alive. May raise (see the module comment): call it where a Lua error
/// may unwind.
pub unsafe fn push_values(
    l: *mut lua_State,
    bytes: &[u8],
    spans: &[Span],
) -> Result<usize, CodecError> {
    let ops = reuse(SPARE_OPS.take());
    // SAFETY: the spans' bytes are alive (the contract); decoding reads only
    // them and `bytes`, and raises nothing.
    let decoded = guard::catch(|| unsafe { decode(bytes, spans, ops) })
        .map_err(|panic| CodecError::BadPayload(ngx_threadpool_wire::panicked(panic)))??;
    // SAFETY: l is a live state of this thread, where a Lua error may unwind
    // (the contract); the ops come from the decoder, whose deepest value needs
    // NEST_SLOTS.
    let built = unsafe { stack::build(l, decoded.n, NEST_SLOTS, &decoded.ops) };
    // a raise in build drops the buffer: the next call allocates one
    SPARE_OPS.set(reuse(decoded.ops));
    if built {
        Ok(decoded.n)
    } else {
        Err(encode::stack_overflow())
    }
}

/// Payloads of a batch's results, read at once under one panic guard:
/// each sets its values into its own entry table (`set`).
pub struct Entries<'a> {
    ops: Vec<stack::Op<'a>>,
    /// Per payload: its value count or why it could not be read, and
    /// where its ops end.
    read: Vec<(Result<usize, CodecError>, usize)>,
}

/// The ops read for one `Entries` before it stops taking payloads: a
/// batch of small results is read at once, one of big tables a few
/// payloads at a time, so the buffer (kept for reuse) stays small.
const ENTRIES_OPS: usize = 4096;

/// Reads the first of `payloads` (bytes, borrowed spans) for
/// `Entries::set`: at least one, and more while their ops stay under
/// ENTRIES_OPS. A payload whose reading panicked is one that could not be
/// read; the others are read on.
///
/// # Safety
/// The spans' bytes must be alive for `'a`.
pub unsafe fn read_entries<'a>(
    mut payloads: impl Iterator<Item = (&'a [u8], &'a [Span])>,
) -> Entries<'a> {
    let mut ops = reuse(SPARE_OPS.take());
    let mut read = Vec::with_capacity(payloads.size_hint().0);
    loop {
        let stopped = guard::catch(|| {
            for (bytes, spans) in payloads.by_ref() {
                // SAFETY: the spans' bytes are alive for 'a (the contract), as
                // decode_entry reads them.
                let n = unsafe { decode::decode_entry(bytes, spans, &mut ops) };
                read.push((n, ops.len()));
                if ops.len() >= ENTRIES_OPS {
                    break;
                }
            }
        });
        let Err(panic) = stopped else {
            break;
        };
        // the payload being read when it panicked: its steps are dropped
        let end = read.last().map_or(0, |&(_, end)| end);
        ops.truncate(end);
        read.push((
            Err(CodecError::BadPayload(ngx_threadpool_wire::panicked(panic))),
            end,
        ));
    }
    Entries { ops, read }
}

impl Entries<'_> {
    /// How many payloads were read.
    pub fn payloads(&self) -> usize {
        self.read.len()
    }

    /// The value count of payload `i`, or why it could not be read.
    pub fn count(&self, i: usize) -> Result<usize, &CodecError> {
        self.read[i].0.as_ref().copied()
    }

    /// Sets the values of payload `i`, value `j` at index `j + 1`, in the
    /// table on top of the stack of `l` (nothing for a payload that could
    /// not be read).
    ///
    /// # Safety
    /// `l` must be a live state of this thread with a table on top and
    /// NEST_SLOTS reserved above it. Allocates, so it may raise: call it
    /// where a Lua error may unwind.
    pub unsafe fn set(&self, l: *mut lua_State, i: usize) {
        let start = if i == 0 { 0 } else { self.read[i - 1].1 };
        // SAFETY: l is a live state of this thread with a table on top and
        // NEST_SLOTS reserved above it, where a Lua error may unwind (the
        // contract); the ops of one payload, from the decoder, set into the
        // table below each value.
        unsafe { stack::run(l, 0, &self.ops[start..self.read[i].1]) }
    }
}

impl Drop for Entries<'_> {
    fn drop(&mut self) {
        SPARE_OPS.set(reuse(std::mem::take(&mut self.ops)));
    }
}

thread_local! {
    /// The ops buffer of the last push_values on this thread, reused.
    static SPARE_OPS: std::cell::Cell<Vec<stack::Op<'static>>> = const { std::cell::Cell::new(Vec::new()) };
}
