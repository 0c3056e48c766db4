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
mod message;
mod wire;

pub use decode::{decode, error_text, reuse, Decoded};
pub use encode::{encode, Borrow, Source, WALK_SLOTS};
pub use message::lua_type_name;
pub use wire::{
    encode_string, CodecError, Span, MAX_DEPTH, MAX_PAYLOAD, MAX_VALUES, NEST_SLOTS,
    NOT_ENOUGH_MEMORY,
};

#[cfg(test)]
mod tests;

use crate::lua::stack;
use crate::ngx::guard;
use mlua::ffi::lua_State;

/// The error for a stack that cannot hold the values.
fn stack_overflow() -> CodecError {
    CodecError::Value("Lua stack overflow".into())
}

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
    // SAFETY: forwarded from the caller.
    let decoded = guard::catch(|| unsafe { decode(bytes, spans, ops) })
        .map_err(|panic| CodecError::BadPayload(format!("panic: {panic}")))??;
    // SAFETY: forwarded from the caller; the ops come from the decoder,
    // whose deepest value needs NEST_SLOTS.
    let built = unsafe { stack::build(l, decoded.n, NEST_SLOTS, &decoded.ops) };
    // a raise in build drops the buffer: the next call allocates one
    SPARE_OPS.set(reuse(decoded.ops));
    if built {
        Ok(decoded.n)
    } else {
        Err(stack_overflow())
    }
}

thread_local! {
    /// The ops buffer of the last push_values on this thread, reused.
    static SPARE_OPS: std::cell::Cell<Vec<stack::Op<'static>>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Encodes `n` values at `src` on the stack of `l` (see `encode`), after
/// reserving the stack the walk needs.
///
/// # Safety
/// As `encode`, less the reserved slots; may raise while reserving them
/// (out of memory): call it where a Lua error may unwind.
pub unsafe fn write_values(
    l: *mut lua_State,
    src: Source,
    n: usize,
    what: &str,
    borrow: Option<Borrow>,
    out: &mut Vec<u8>,
    spans: &mut Vec<Span>,
) -> Result<usize, CodecError> {
    // SAFETY: forwarded from the caller.
    if !unsafe { stack::reserve(l, WALK_SLOTS) } {
        return Err(stack_overflow());
    }
    // SAFETY: forwarded from the caller, with the slots reserved; the walk
    // does not raise, so the guard only ever meets a panic. A walk that
    // stopped at an error leaves what it pushed: the top is put back.
    unsafe {
        let top = mlua::ffi::lua_gettop(l);
        let res = guard::catch(|| encode(l, src, n, what, borrow, out, spans))
            .map_err(|panic| CodecError::Value(format!("panic: {panic}")));
        mlua::ffi::lua_settop(l, top);
        res?
    }
}

/// Stores the strings that `write_values` borrowed from the values at
/// `src` into the table at `table`, from index `start` (see
/// encode::store_borrowed): the index after the last.
///
/// # Safety
/// As `encode::store_borrowed`; nothing here raises.
pub unsafe fn anchor(
    l: *mut lua_State,
    src: Source,
    n: usize,
    borrow: Borrow,
    table: std::ffi::c_int,
    start: std::ffi::c_int,
) -> std::ffi::c_int {
    // SAFETY: forwarded from the caller; the walk does not raise.
    guard::catch(|| unsafe { encode::store_borrowed(l, src, n, borrow, table, start) })
        .unwrap_or(start)
}
