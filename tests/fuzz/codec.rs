//! The codec under test. The only file that names its API: point these two
//! functions at another codec and the fuzzer tests that one.

use mlua::{Lua, MultiValue};
use ngx_threadpool::codec::{push_values, write_values, Borrow, Source, Span};

/// An encoded argument list, with the strings it borrows (kept alive as
/// long as it is).
pub struct Payload {
    pub bytes: Vec<u8>,
    spans: Vec<Span>,
    /// The values: they hold the strings borrowed, nested ones included.
    _values: MultiValue,
}

/// Encodes `values` as arguments, as the event loop encodes a caller's;
/// strings of at least `borrow` bytes are borrowed (zero-copy).
pub fn encode(lua: &Lua, values: &MultiValue, borrow: Option<usize>) -> Result<Payload, String> {
    let (mut bytes, mut spans) = (Vec::new(), Vec::new());
    let borrow = borrow.map(|min| Borrow { min, nested: true });
    let mut res = Ok(0);
    let n = values.len();
    // SAFETY: exec_raw pushes the values at 1..=n of a protected call's
    // stack, where write_values may reserve (and raise).
    unsafe {
        lua.exec_raw::<()>(values.clone(), |l| {
            res = write_values(
                l,
                Source::Stack(1),
                n,
                "argument",
                borrow,
                &mut bytes,
                &mut spans,
            );
        })
    }
    .map_err(|e| e.to_string())?;
    res.map_err(|e| e.to_string())?;
    Ok(Payload {
        bytes,
        spans,
        _values: values.clone(),
    })
}

/// Decodes `bytes` into values of `lua`; a borrowed string in them refers
/// to one of `strings`' (any bytes may: the decoder must check).
pub fn decode(lua: &Lua, bytes: &[u8], strings: &Payload) -> Result<MultiValue, String> {
    let mut res = Ok(0);
    // SAFETY: the spans' strings are alive (`strings` holds the values,
    // and with them every string they borrow); push_values runs inside
    // exec_raw's protected call, which returns what it pushed.
    let values = unsafe {
        lua.exec_raw::<MultiValue>((), |l| {
            mlua::ffi::lua_settop(l, 0);
            res = push_values(l, bytes, &strings.spans);
        })
    }
    .map_err(|e| e.to_string())?;
    res.map_err(|e| e.to_string())?;
    Ok(values)
}
