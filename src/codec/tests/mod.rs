//! The codec on raw Lua stacks, as the shim and the pool threads call it:
//! values that cross (values.rs), values and payloads that do not
//! (errors.rs), and how fast it is (speed.rs). Values are handed to it
//! through mlua's `exec_raw` and compared in Lua.

mod errors;
mod speed;
mod values;

use super::message::format_g14;
use super::*;
use mlua::{ffi, Function, LightUserData, Lua, LuaString, MultiValue, Table, Value};
use std::ffi::c_int;

type R = Result<(), Box<dyn std::error::Error>>;

/// Test-side Lua: comparisons and a builder of nested tables.
const HELPERS: &str = r##"
    ffi = require "ffi"

    function pack(...)
        return { n = select("#", ...), ... }
    end

    -- Raw contents, as the codec reads them: `next`, not `pairs`, which
    -- calls a __pairs metamethod in some LuaJIT builds (Debian
    -- testing's OpenResty LuaJIT, 2.1.0+openresty20251030).
    function deep_eq(a, b)
        if type(a) ~= type(b) then
            return false
        end
        if type(a) == "number" then
            if a ~= a then
                return b ~= b
            end
            return a == b and (a ~= 0 or 1 / a == 1 / b)
        end
        if type(a) ~= "table" then
            return a == b
        end
        local na, nb = 0, 0
        for _ in next, a do na = na + 1 end
        for _ in next, b do nb = nb + 1 end
        if na ~= nb then
            return false
        end
        for k, v in next, a do
            if type(k) == "table" then
                local found = false
                for kb, vb in next, b do
                    if type(kb) == "table" and deep_eq(k, kb)
                       and deep_eq(v, vb)
                    then
                        found = true
                        break
                    end
                end
                if not found then
                    return false
                end
            elseif rawget(b, k) == nil or not deep_eq(v, rawget(b, k)) then
                return false
            end
        end
        return true
    end

    function packed_eq(a, b)
        if a.n ~= b.n then
            return false
        end
        for i = 1, a.n do
            if a[i] == nil or b[i] == nil then
                if a[i] ~= b[i] then
                    return false
                end
            elseif not deep_eq(a[i], b[i]) then
                return false
            end
        end
        return true
    end

    function nest(n, leaf)
        local t = { leaf }
        for _ = 2, n do
            t = { t }
        end
        return t
    end
"##;

/// A state with ffi, as a pool thread's, plus the helpers and `null`:
/// the NULL light userdata that ngx.null is.
fn new_lua() -> mlua::Result<Lua> {
    let lua = crate::luajit::scratch_state();
    lua.globals().set("null", Value::NULL)?;
    lua.load(HELPERS).exec()?;
    Ok(lua)
}

fn global_fn(lua: &Lua, name: &str) -> mlua::Result<Function> {
    lua.globals().get(name)
}

fn packed(lua: &Lua, vals: &MultiValue) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("n", vals.len())?;
    for (i, v) in vals.iter().enumerate() {
        if !v.is_nil() {
            t.raw_set(i + 1, v.clone())?;
        }
    }
    Ok(t)
}

fn same(lua: &Lua, a: &MultiValue, b: &MultiValue) -> mlua::Result<bool> {
    global_fn(lua, "packed_eq")?.call((packed(lua, a)?, packed(lua, b)?))
}

fn eval(lua: &Lua, code: &str) -> mlua::Result<MultiValue> {
    lua.load(code).eval()
}

fn mv(vals: Vec<Value>) -> MultiValue {
    MultiValue::from_vec(vals)
}

/// Where `write` puts the values for the encoder.
#[derive(Clone, Copy)]
enum Place {
    /// On the stack, as call arguments and results are.
    Stack,
    /// In a table at keys 1..n (Source::Array).
    Array,
}

/// Encodes `vals` with write_values, from where `place` says, appending
/// to `out` and `spans`: how many strings it borrowed, or the error's
/// text. Checks that the stack's top is left where it was.
fn write(
    lua: &Lua,
    vals: &MultiValue,
    place: Place,
    what: &str,
    borrow: Option<Borrow>,
    out: &mut Vec<u8>,
    spans: &mut Vec<Span>,
) -> Result<usize, String> {
    let n = vals.len();
    let mut res = Err("not run".to_string());
    let mut tops = (0, 0);
    // SAFETY: exec_raw runs the closure in a protected call, where
    // write_values may raise, with the n values at 1..=n of the stack and
    // 3 slots checked above them (the array takes 2). The values are not
    // changed while encoded; `vals` keeps every borrowed string alive
    // after the call.
    unsafe {
        lua.exec_raw::<()>(vals.clone(), |l| {
            let src = match place {
                Place::Stack => Source::Stack(1),
                Place::Array => {
                    ffi::lua_createtable(l, n as c_int, 0);
                    for i in 1..=n as c_int {
                        ffi::lua_pushvalue(l, i);
                        ffi::lua_rawseti_(l, -2, i);
                    }
                    Source::Array(ffi::lua_gettop(l))
                }
            };
            let top = ffi::lua_gettop(l);
            res = write_values(l, src, n, what, borrow, out, spans).map_err(|e| e.to_string());
            tops = (top, ffi::lua_gettop(l));
            ffi::lua_settop(l, 0);
        })
    }
    .map_err(|e| e.to_string())?;
    assert_eq!(tops.0, tops.1, "write_values moved the top");
    res
}

/// The payload of `vals` on the stack, or the error's text.
fn encode(lua: &Lua, vals: &MultiValue, what: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    write(
        lua,
        vals,
        Place::Stack,
        what,
        None,
        &mut out,
        &mut Vec::new(),
    )?;
    Ok(out)
}

/// Pushes a payload's values with push_values: them, or the error's text.
/// Checks that exactly its values are pushed, and none on error.
///
/// # Safety
/// The spans' bytes must be alive.
unsafe fn decode_with(lua: &Lua, bytes: &[u8], spans: &[Span]) -> Result<MultiValue, String> {
    let mut res = Err("not run".to_string());
    let mut top = 0;
    // SAFETY: exec_raw runs the closure in a protected call, where
    // push_values may raise, on an empty stack; the spans' bytes are alive
    // (the caller's word). What is left on the stack is the result.
    let vals = unsafe {
        lua.exec_raw::<MultiValue>((), |l| {
            res = push_values(l, bytes, spans).map_err(|e| e.to_string());
            top = ffi::lua_gettop(l) as usize;
            ffi::lua_settop(l, res.as_ref().map_or(0, |&n| n as c_int));
        })
    }
    .map_err(|e| e.to_string())?;
    match res {
        Ok(n) => {
            assert_eq!(top, n, "push_values left {top} values for {n}");
            assert_eq!(vals.len(), n);
            Ok(vals)
        }
        Err(e) => {
            assert_eq!(top, 0, "a refused payload pushed values: {e}");
            Err(e)
        }
    }
}

/// As decode_with, for a payload that borrows nothing.
fn decode(lua: &Lua, bytes: &[u8]) -> Result<MultiValue, String> {
    // SAFETY: no spans.
    unsafe { decode_with(lua, bytes, &[]) }
}

/// Encode then decode must give equal values; an array of them must
/// encode to the same bytes as the stack.
fn roundtrip(lua: &Lua, vals: &MultiValue, what: &str) -> R {
    let bytes = encode(lua, vals, what)?;
    let mut from_array = Vec::new();
    write(
        lua,
        vals,
        Place::Array,
        what,
        None,
        &mut from_array,
        &mut Vec::new(),
    )?;
    assert!(from_array == bytes, "an array encodes differently");
    let back = decode(lua, &bytes)?;
    assert_eq!(back.len(), vals.len(), "value count");
    assert!(
        same(lua, vals, &back)?,
        "round trip changed values: {bytes:02x?}"
    );
    Ok(())
}
