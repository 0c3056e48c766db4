//! The codec under test. The only file that names its API: point these two
//! functions at another codec and the fuzzer tests that one.

use mlua::{Lua, LuaString, MultiValue};
use ngx_threadpool::codec::{decode_borrowing, encode_borrowing, Borrow, Span};

/// An encoded argument list, with the strings it borrows (kept alive as
/// long as it is).
pub struct Payload {
    pub bytes: Vec<u8>,
    spans: Vec<Span>,
    _strings: Vec<LuaString>,
}

/// Encodes `values` as arguments; strings of at least `borrow` bytes are
/// borrowed (zero-copy) where the codec borrows them.
pub fn encode(values: &MultiValue, borrow: Option<usize>) -> Result<Payload, String> {
    let (mut bytes, mut spans, mut strings) = (Vec::new(), Vec::new(), Vec::new());
    let borrow = borrow.map(|min| Borrow {
        min,
        spans: &mut spans,
        strings: &mut strings,
    });
    encode_borrowing(values, &mut bytes, "argument", borrow)?;
    Ok(Payload {
        bytes,
        spans,
        _strings: strings,
    })
}

/// Decodes `bytes` into values of `lua`; a borrowed string in them refers
/// to one of `strings`' (any bytes may: the decoder must check).
pub fn decode(lua: &Lua, bytes: &[u8], strings: &Payload) -> Result<MultiValue, String> {
    // SAFETY: the spans' strings are alive: `strings` holds them.
    unsafe { decode_borrowing(lua, bytes, &strings.spans) }
}
