//! The codec against the event loop's codec.lua: values that cross
//! (values.rs), values and payloads that do not (errors.rs).

mod errors;
mod values;

use super::message::format_g14;
use super::*;
use mlua::{Function, IntoLua, LightUserData, LuaString};
use mlua::{Lua, MultiValue, Table, Value};

type R = Result<(), Box<dyn std::error::Error>>;

/// Test-side Lua: the event-loop codec plus comparison helpers.
const HELPERS: &str = r##"
    ffi = require "ffi"
    codec = require "resty.threadpool.codec"
    null = codec.null
    local buffer = require "string.buffer"

    function lua_encode(what, ...)
        local b = buffer.new()
        local ok, err = codec.encode(b, what, select("#", ...), ...)
        if not ok then
            return nil, err
        end
        return b:tostring()
    end

    function pack(...)
        return { n = select("#", ...), ... }
    end

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
        for _ in pairs(a) do na = na + 1 end
        for _ in pairs(b) do nb = nb + 1 end
        if na ~= nb then
            return false
        end
        for k, v in pairs(a) do
            if type(k) == "table" then
                local found = false
                for kb, vb in pairs(b) do
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
            elseif b[k] == nil or not deep_eq(v, b[k]) then
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

    -- Decodes s as the shim does; returns a packed table, or nil, err.
    function lua_decode(s)
        local p = ffi.cast("const char *", s)
        local r = pack(codec.decode_results(p, #s))
        if not r[1] then
            return nil, r[2]
        end
        local v = { n = r.n - 1 }
        for i = 1, v.n do
            v[i] = r[i + 1]
        end
        return v
    end

    function nest(n, leaf)
        local t = { leaf }
        for _ = 2, n do
            t = { t }
        end
        return t
    end
"##;

fn new_lua() -> mlua::Result<Lua> {
    new_lua_with("")
}

/// `prelude` runs before the codec is required.
fn new_lua_with(prelude: &str) -> mlua::Result<Lua> {
    // codec.lua needs the ffi library, as a pool thread's state has it
    let lua = crate::lua::scratch_state();
    let dir = env!("CARGO_MANIFEST_DIR");
    lua.load(format!(
        "package.path = [[{dir}/lua/?.lua;]] .. package.path"
    ))
    .exec()?;
    lua.load(prelude).exec()?;
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

fn rust_encode(vals: &MultiValue, what: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    encode_values(vals, &mut out, what)?;
    Ok(out)
}

fn lua_encode(lua: &Lua, vals: &MultiValue, what: &str) -> mlua::Result<Result<Vec<u8>, String>> {
    let mut args = vals.clone();
    args.push_front(what.into_lua(lua)?);
    let (s, err): (Option<LuaString>, Option<String>) = global_fn(lua, "lua_encode")?.call(args)?;
    Ok(match s {
        Some(s) => Ok(s.as_bytes().to_vec()),
        None => Err(err.unwrap_or_default()),
    })
}

/// Decodes in Lua; Ok(packed values) or Err(message).
fn lua_decode(lua: &Lua, bytes: &[u8]) -> mlua::Result<Result<Table, String>> {
    let (t, err): (Option<Table>, Option<String>) =
        global_fn(lua, "lua_decode")?.call(lua.create_string(bytes)?)?;
    Ok(t.ok_or_else(|| err.unwrap_or_default()))
}

fn eval(lua: &Lua, code: &str) -> mlua::Result<MultiValue> {
    lua.load(code).eval()
}

/// Rust encode -> Rust decode in one state must give equal values.
fn rust_roundtrip(lua: &Lua, vals: &MultiValue) -> R {
    let bytes = rust_encode(vals, "argument")?;
    let back = decode_values(lua, &bytes)?;
    assert_eq!(back.len(), vals.len(), "value count");
    assert!(
        same(lua, vals, &back)?,
        "round trip changed values: {bytes:02x?}"
    );
    Ok(())
}

fn mv(vals: Vec<Value>) -> MultiValue {
    MultiValue::from_vec(vals)
}
