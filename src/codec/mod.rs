//! MessagePack codec for values crossing between the nginx event loop's
//! LuaJIT VM and the worker threads' LuaJIT VMs.
//!
//! `lua/resty/threadpool/codec.lua` (and `decode.lua`) implements the same format on the event
//! loop side; the two must agree byte for byte:
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
//! Tables are walked and built on the raw Lua stack, inside
//! `Lua::exec_raw`, rather than through an mlua `Value` per element: mlua's
//! reference bookkeeping for each value cost more than the codec itself.
//! exec_raw runs its closure in a protected call (lua_pcall), so a Lua error
//! raised inside unwinds to it across our frames (LuaJIT throws with the
//! system unwinder on x64; elsewhere it would longjmp).  That is sound
//! because of what can raise where:
//! - encoding: only the one lua_checkstack at the start (out of memory),
//!   before the closure has made anything; the walk itself only reads and
//!   pushes into the reserved slots, which never allocates;
//! - decoding: lua_createtable, lua_pushlstring, lua_rawset(i) (out of
//!   memory, an error from a `__gc` finalizer that an allocation's GC step
//!   runs, or a size overflow from a huge corrupt payload), and the frames
//!   then between exec_raw and LuaJIT (the closure, rmp_serde's deserializer
//!   over a slice, our seeds) own nothing with a destructor: error strings
//!   only exist after the last Lua call.
//!
//! Nothing leaks, and exec_raw restores the stack; the half-built tables are
//! garbage.
//!
//! Speed in µs per call, mlua values -> raw stack (release build, minimum
//! of 3 x 7 runs on a shared 2-core VM; `codec_speed` in the tests):
//!
//! ```text
//!                           encode            decode
//! 16 B string               0.05 -> 0.05      0.14 -> 0.31
//! 1 KiB string              0.06 -> 0.05      0.15 -> 0.32
//! 64 KiB string             2.17 -> 2.16      1.56 -> 1.70
//! 100 records x 10 strings   439 -> 91         247 -> 90
//! 1000 numbers               124 -> 55          65 -> 18
//! ```
//!
//! A decode now pays ~0.15 µs for exec_raw's protected call.  Most of what
//! tables still cost is LuaJIT's own work behind its C API: interning
//! strings, allocating and filling tables (and collecting them), and when
//! encoding four API calls per element in each of the two passes (count,
//! then write).

mod decode;
mod encode;
mod message;
mod wire;

pub use decode::{decode_borrowing, decode_values, error_text};
pub use encode::{encode_borrowing, encode_values, Borrow};
pub use message::type_name;
pub use wire::{encode_string, Span, MAX_DEPTH, MAX_PAYLOAD, MAX_VALUES, NOT_ENOUGH_MEMORY};

#[cfg(test)]
mod tests;
