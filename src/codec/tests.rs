//! The codec against the event loop's codec.lua, value by value.

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

#[test]
fn encode_string_decodes_as_one_string() -> R {
    let lua = Lua::new();
    let mut out = Vec::new();
    encode_string(b"boom\0\xff", &mut out);
    let vals = decode_values(&lua, &out).map_err(mlua::Error::runtime)?;
    assert_eq!(vals.len(), 1);
    let s = vals[0].as_string().expect("a string").as_bytes().to_vec();
    assert_eq!(s, b"boom\0\xff");
    Ok(())
}

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

#[test]
fn roundtrip_scalars() -> R {
    let lua = new_lua()?;
    let s = |b: &[u8]| lua.create_string(b).map(Value::String);
    let cases = vec![
        mv(vec![]),
        mv(vec![Value::Nil]),
        mv(vec![Value::Boolean(true), Value::Boolean(false)]),
        mv(vec![
            Value::Integer(0),
            Value::Integer(-1),
            Value::Integer(1 << 53),
            Value::Integer(-(1 << 53)),
            Value::Integer(1 << 31),
            Value::Integer((1 << 32) + 1),
            Value::Number(2f64.powi(63)),
            Value::Number(-(2f64.powi(63))),
        ]),
        mv(vec![
            Value::Number(0.5),
            Value::Number(-0.0),
            Value::Number(f64::INFINITY),
            Value::Number(f64::NEG_INFINITY),
            Value::Number(f64::NAN),
            Value::Number(1e300),
            Value::Number(-1.25e-300),
        ]),
        mv(vec![
            s(b"")?,
            s(b"a\0b")?,
            s(b"\xff\xfe\xc3")?,
            s(&[b'x'; 255])?,
            s(&[b'x'; 256])?,
            s(&[b'y'; 65535])?,
            s(&[b'z'; 65536])?,
            s(&vec![7u8; 70 * 1024])?,
        ]),
        mv(vec![Value::NULL]),
        mv(vec![
            Value::Nil,
            Value::Integer(1),
            Value::Nil,
            Value::NULL,
            Value::Nil,
            Value::Nil,
        ]),
    ];
    for vals in &cases {
        rust_roundtrip(&lua, vals)?;
    }
    Ok(())
}

#[test]
fn negative_zero_stays_float() -> R {
    let lua = new_lua()?;
    let bytes = rust_encode(
        &mv(vec![Value::Number(-0.0), Value::Number(0.0)]),
        "argument",
    )?;
    assert_eq!(
        bytes,
        [0x02, 0x82, 0x01, 0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x00]
    );
    let back = decode_values(&lua, &bytes)?;
    match back.front() {
        Some(Value::Number(f)) => assert!(*f == 0.0 && f.is_sign_negative()),
        other => panic!("expected -0.0, got {other:?}"),
    }
    Ok(())
}

#[test]
fn exact_bytes() -> R {
    let lua = new_lua()?;
    let cases: &[(&str, &[u8])] = &[
        ("", &[0x00, 0x80]),
        ("nil", &[0x01, 0x80]),
        ("'abc'", &[0x01, 0x81, 0x01, 0xc4, 3, b'a', b'b', b'c']),
        ("nil, 1, nil, nil", &[0x04, 0x81, 0x02, 0x01]),
        (
            "null, true, false",
            &[0x03, 0x83, 0x01, 0xc0, 0x02, 0xc3, 0x03, 0xc2],
        ),
        (
            "127, 128, -32, -33",
            &[0x04, 0x84, 1, 0x7f, 2, 0xcc, 0x80, 3, 0xe0, 4, 0xd0, 0xdf],
        ),
        (
            "65535, -32769",
            &[
                0x02, 0x82, 1, 0xcd, 0xff, 0xff, 2, 0xd2, 0xff, 0xff, 0x7f, 0xff,
            ],
        ),
        ("2^53", &[0x01, 0x81, 1, 0xcf, 0, 0x20, 0, 0, 0, 0, 0, 0]),
        (
            "-2^53",
            &[0x01, 0x81, 1, 0xd3, 0xff, 0xe0, 0, 0, 0, 0, 0, 0],
        ),
        ("0.5", &[0x01, 0x81, 1, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0]),
        ("{}", &[0x01, 0x81, 1, 0x80]),
        ("{1, 'a'}", &[0x01, 0x81, 1, 0x92, 0x01, 0xc4, 1, b'a']),
        ("{x = null}", &[0x01, 0x81, 1, 0x81, 0xc4, 1, b'x', 0xc0]),
    ];
    for (code, want) in cases {
        let vals = eval(&lua, &format!("return {code}"))?;
        assert_eq!(rust_encode(&vals, "argument")?, *want, "rust: {code}");
        assert_eq!(lua_encode(&lua, &vals, "argument")??, *want, "lua: {code}");
    }
    Ok(())
}

#[test]
fn roundtrip_tables() -> R {
    let lua = new_lua()?;
    let cases = [
        "{1, 2, 3}",
        "{a = 1, b = 'x'}",
        "{1, 2, x = 3}",
        "{1, nil, 3}",
        "{[0] = 1, [-1] = 2, [1.5] = 3}",
        "{[true] = 1, [false] = 2}",
        "{[{1, 2}] = 'tk', [{a = {}}] = {}}",
        "{{}, {{}}, {a = {b = {c = {}}}}}",
        "{null, null, x = null}",
        "nest(100, 'leaf')",
        "(function() local s = {1} return {s, s, k = s} end)()",
        "(function() local t = {} for i = 1, 70000 do t[i] = i end return t end)()",
        "(function() local t = {} for i = 1, 20 do t['k' .. i] = i end return t end)()",
        "1, {2}, nil, {x = {}}, nil",
    ];
    for code in cases {
        let vals = eval(&lua, &format!("return {code}"))?;
        rust_roundtrip(&lua, &vals).map_err(|e| format!("{code}: {e}"))?;
    }
    Ok(())
}

#[test]
fn holes_make_a_map() -> R {
    let lua = new_lua()?;
    let vals = eval(&lua, "return {1, nil, 3}")?;
    let bytes = rust_encode(&vals, "argument")?;
    assert_eq!(bytes[3] & 0xf0, 0x80, "{bytes:02x?}");
    let back = decode_values(&lua, &bytes)?;
    let Some(Value::Table(t)) = back.front() else {
        panic!("expected a table");
    };
    assert_eq!(t.raw_get::<i64>(1)?, 1);
    assert_eq!(t.raw_get::<Value>(2)?, Value::Nil);
    assert_eq!(t.raw_get::<i64>(3)?, 3);
    Ok(())
}

fn err_of(lua: &Lua, code: &str, what: &str) -> Result<String, Box<dyn std::error::Error>> {
    let vals = eval(lua, &format!("return {code}"))?;
    let mut out = vec![0xaa];
    let err = encode_values(&vals, &mut out, what).expect_err(code);
    assert_eq!(out, [0xaa], "output not restored after error");
    let lua_err = lua_encode(lua, &vals, what)?.expect_err(code);
    assert_eq!(err, lua_err, "Rust and Lua disagree on {code}");
    Ok(err)
}

#[test]
fn error_messages() -> R {
    let lua = new_lua()?;
    let cases: &[(&str, &str)] = &[
        ("print", "cannot pass function in argument #1"),
        (
            "1, {a = {1, 2, print}}",
            r#"cannot pass function in argument #2 at ["a"][3]"#,
        ),
        (
            "nil, nil, coroutine.create(print)",
            "cannot pass thread in argument #3",
        ),
        ("newproxy()", "cannot pass userdata in argument #1"),
        (
            "{x = ffi.new('int')}",
            r#"cannot pass cdata in argument #1 at ["x"]"#,
        ),
        ("ffi.cast('void *', 0)", "cannot pass cdata in argument #1"),
        (
            "nil, ffi.cast('void *', 0)",
            "cannot pass cdata in argument #2",
        ),
        (
            "{1, ffi.cast('void *', 0)}",
            "cannot pass cdata in argument #1 at [2]",
        ),
        (
            "{[ffi.cast('void *', 0)] = 1}",
            "cannot pass table key cdata in argument #1",
        ),
        (
            "(function() local t = {} t.self = t return t end)()",
            r#"cyclic table in argument #1 at ["self"]"#,
        ),
        (
            "(function() local t = {a = {}} t.a[1] = t return 1, t end)()",
            r#"cyclic table in argument #2 at ["a"][1]"#,
        ),
        (
            "nest(100, {})",
            &format!(
                "table nested deeper than 100 in argument #1 at {}",
                "[1]".repeat(100)
            ),
        ),
        (
            "{[print] = 1}",
            "cannot pass table key function in argument #1",
        ),
        (
            "{x = {[null] = 1}}",
            r#"cannot pass table key userdata in argument #1 at ["x"]"#,
        ),
        (
            r#"{['a\"b\\\n\0\200\r\t9'] = print}"#,
            r#"cannot pass function in argument #1 at ["a\"b\\\n\000\200\r\t9"]"#,
        ),
        (
            "{[1.5] = print}",
            "cannot pass function in argument #1 at [1.5]",
        ),
        (
            "{[2^53] = print}",
            "cannot pass function in argument #1 at [9.007199254741e+15]",
        ),
        (
            "{[123456789012345] = print}",
            "cannot pass function in argument #1 at [1.2345678901235e+14]",
        ),
        (
            "{[1e-7] = print}",
            "cannot pass function in argument #1 at [1e-07]",
        ),
        (
            "{[0.0001] = print}",
            "cannot pass function in argument #1 at [0.0001]",
        ),
        (
            "{[true] = {print}}",
            "cannot pass function in argument #1 at [true][1]",
        ),
        (
            "{[{}] = print}",
            "cannot pass function in argument #1 at [table]",
        ),
        (
            "{[{print}] = 1}",
            "cannot pass function in argument #1 at (key)[1]",
        ),
        (
            "{[{[print] = 1}] = 1}",
            "cannot pass table key function in argument #1 at (key)",
        ),
        (
            "(function() local t = {} t[t] = 1 return t end)()",
            "cyclic table in argument #1 at (key)",
        ),
    ];
    for (code, want) in cases {
        assert_eq!(err_of(&lua, code, "argument")?, *want, "{code}");
    }
    assert_eq!(
        err_of(&lua, "1, print", "return value")?,
        "cannot pass function in return value #2"
    );
    Ok(())
}

#[test]
fn numbers_print_like_luajit() -> R {
    let lua = new_lua()?;
    let nums = [
        0.0,
        -0.0,
        1.0,
        -7.0,
        0.1,
        1.5,
        1e-5,
        1e-4,
        0.000123456789012345,
        123.456e20,
        1e100,
        5e-324,
        f64::MAX,
        f64::INFINITY,
        f64::NEG_INFINITY,
        2f64.powi(53),
        2f64.powi(63),
        99999999999999.0,
        99999999999999.5,
        999999999999995.0,
        123456789012345.0,
        1234567890123.25,
        -1234567890123.25,
        1234567890123.75,
        1e14,
        1e15,
        std::f64::consts::PI,
    ];
    let tostring: Function = lua.globals().get("tostring")?;
    for x in nums {
        assert_eq!(format_g14(x), tostring.call::<String>(x)?, "{x:e}");
    }
    Ok(())
}

#[test]
fn rust_only_error_values() -> R {
    let lua = new_lua()?;
    let ud = lua.create_any_userdata(5u32)?;
    let light = Value::LightUserData(LightUserData(std::ptr::dangling_mut()));
    let nested = lua.create_table()?;
    nested.raw_set("u", ud.clone())?;
    let cases = [
        (Value::UserData(ud), "cannot pass userdata in argument #1"),
        (light.clone(), "cannot pass userdata in argument #1"),
        (
            Value::Table(nested),
            r#"cannot pass userdata in argument #1 at ["u"]"#,
        ),
        (
            Value::Error(Box::new(mlua::Error::runtime("x"))),
            "cannot pass userdata in argument #1",
        ),
    ];
    for (v, want) in cases {
        assert_eq!(rust_encode(&mv(vec![v]), "argument").unwrap_err(), want);
    }
    // A non-NULL light userdata made in Rust fails in Lua the same way.
    assert_eq!(
        lua_encode(&lua, &mv(vec![light]), "argument")?.unwrap_err(),
        "cannot pass userdata in argument #1"
    );
    Ok(())
}

#[test]
fn too_big() -> R {
    let lua = new_lua()?;
    // One string exactly filling the limit: 3 header bytes + bin32 header.
    let fits = "string.rep('x', 16 * 1024 * 1024 - 8)";
    let vals = eval(&lua, &format!("return {fits}"))?;
    assert_eq!(rust_encode(&vals, "argument")?.len(), MAX_PAYLOAD);
    assert_eq!(lua_encode(&lua, &vals, "argument")??.len(), MAX_PAYLOAD);

    let over = "string.rep('x', 16 * 1024 * 1024 - 7)";
    assert_eq!(
        err_of(&lua, over, "argument")?,
        "arguments exceed 16777216 bytes"
    );
    assert_eq!(
        err_of(&lua, over, "return value")?,
        "return values exceed 16777216 bytes"
    );
    // Caught at the second string, before the function after it.
    let two = "{string.rep('x', 9000000), string.rep('y', 9000000), print}";
    assert_eq!(
        err_of(&lua, two, "argument")?,
        "arguments exceed 16777216 bytes"
    );
    // Crossed by floats, so only the final check sees it; both sides
    // first report the function that comes before that check.
    let floats = "string.rep('x', 16 * 1024 * 1024 - 20), {0.5, 0.5, 0.5, print}";
    assert_eq!(
        err_of(&lua, floats, "argument")?,
        "cannot pass function in argument #2 at [4]"
    );
    let floats = "string.rep('x', 16 * 1024 * 1024 - 20), {0.5, 0.5, 0.5}";
    assert_eq!(
        err_of(&lua, floats, "argument")?,
        "arguments exceed 16777216 bytes"
    );
    Ok(())
}

#[test]
fn too_many_values() -> R {
    let lua = new_lua()?;
    let vals = eval(&lua, "return unpack({}, 1, 4096)")?;
    assert_eq!(vals.len(), MAX_VALUES);
    rust_roundtrip(&lua, &vals)?;
    let err = err_of(&lua, "unpack({}, 1, 4097)", "argument")?;
    assert_eq!(err, "too many arguments (max 4096)");
    Ok(())
}

#[test]
fn depth_limit() -> R {
    let lua = new_lua()?;
    let ok = eval(&lua, "return nest(100, 1)")?;
    rust_roundtrip(&lua, &ok)?;
    let bytes = rust_encode(&ok, "argument")?;
    assert!(lua_decode(&lua, &bytes)?.is_ok());
    assert_eq!(
        err_of(&lua, "nest(101, 1)", "argument")?,
        format!(
            "table nested deeper than 100 in argument #1 at {}",
            "[1]".repeat(100)
        )
    );
    // A hand-made payload one level deeper is refused by both decoders.
    let mut deep = vec![0x01, 0x81, 0x01];
    deep.extend(std::iter::repeat_n(0x91, 101));
    deep.push(0x01);
    let err = decode_values(&lua, &deep).unwrap_err();
    assert!(err.starts_with("bad payload: "), "{err}");
    assert!(lua_decode(&lua, &deep)?
        .unwrap_err()
        .starts_with("bad payload: "));
    Ok(())
}

/// Values built in Lua; each must encode to the same bytes on both sides
/// and decode on both sides to equal values.
const BATTERY: &str = r#"
    local big = {}
    for i = 1, 70000 do big[i] = i % 7 == 0 and ('s' .. i) or i end
    local m16 = {}
    for i = 1, 16 do m16['k' .. i] = i end
    local shared = {1, 2}
    return {
        function() return end,
        function() return nil end,
        function() return nil, nil, nil end,
        function() return 1, nil, 3, nil end,
        function() return true, false, null end,
        function() return 0, 1, -1, 127, 128, 255, 256, 65535, 65536 end,
        function() return 2^32 - 1, 2^32, 2^32 + 1, 2^53, 2^53 + 2, 2^63 - 1024 end,
        function() return -32, -33, -128, -129, -32768, -32769 end,
        function() return -2^31, -2^31 - 1, -2^53, -2^63, 2^63, -2^63 - 4096 end,
        function() return 0.5, -0.0, 1/0, -1/0, 0/0, 1e300, 5e-324, 0.1 end,
        function() return "", "a\0b", "\255\254\192", ("x"):rep(255) end,
        function() return ("x"):rep(256), ("y"):rep(65535), ("z"):rep(65536) end,
        function() return ("\0"):rep(70 * 1024) end,
        function() return {} end,
        function() return {1, 2, 3}, {"a", {"b"}} end,
        function() return {a = 1, b = "x", [true] = false, [1.5] = -2} end,
        function() return {1, 2, x = 3}, {1, nil, 3}, {[2] = 2}, {[0] = 0} end,
        function() return {null, null, n = null} end,
        function() return {[{1}] = "k", [{a = {}}] = {}} end,
        function() return {{}, {{}}, {a = {b = {c = {}}}}} end,
        function() return nest(100, "deep") end,
        function() return {shared, shared, s = shared} end,
        function() return big, m16 end,
        function()
            local t = {}
            for i = 1, 15 do t[i] = i end
            local u = {}
            for i = 1, 16 do u[i] = -i end
            return t, u
        end,
        function() return unpack({}, 1, 20) end,
        function() return 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                          16, 17, "x", nil, {}, nil end,
    }
"#;

#[test]
fn cross_language_battery() -> R {
    battery(&new_lua()?)
}

#[test]
fn cross_language_battery_without_table_extensions() -> R {
    // Plain LuaJIT 2.1 lacks table.nkeys; the module must fall back.
    let lua = new_lua_with(
        r#"
        for _, m in ipairs({"table.nkeys", "table.new"}) do
            package.loaded[m] = nil
            package.preload[m] = function() error("gone") end
        end
    "#,
    )?;
    assert!(lua
        .load(r#"return not pcall(require, "table.nkeys")"#)
        .eval::<bool>()?);
    battery(&lua)
}

fn battery(lua: &Lua) -> R {
    let lua = lua.clone();
    let cases: Table = lua.load(BATTERY).eval()?;
    for (i, case) in cases.sequence_values::<Function>().enumerate() {
        let vals: MultiValue = case?.call(())?;
        let what = if i % 2 == 0 {
            "argument"
        } else {
            "return value"
        };

        // (a) same bytes
        let rust = rust_encode(&vals, what).map_err(|e| format!("case {}: {e}", i + 1))?;
        let luab = lua_encode(&lua, &vals, what)?.map_err(|e| format!("case {}: {e}", i + 1))?;
        assert!(rust == luab, "case {}: bytes differ", i + 1);

        // Rust decodes its own payload (which is also Lua's, by (a)).
        let back = decode_values(&lua, &rust)?;
        assert!(
            same(&lua, &vals, &back)?,
            "case {}: Rust decode differs",
            i + 1
        );

        // (b) Rust payload decodes in Lua
        let from_lua = lua_decode(&lua, &rust)?.map_err(|e| format!("case {}: {e}", i + 1))?;
        let want = packed(&lua, &vals)?;
        let eq: bool = global_fn(&lua, "packed_eq")?.call((want, from_lua))?;
        assert!(eq, "case {}: Lua decode differs", i + 1);
    }
    Ok(())
}

#[test]
fn lua_payload_decodes_in_rust() -> R {
    // (c) with a table Rust never saw: built and encoded inside Lua.
    let lua = new_lua()?;
    let s: LuaString = lua
        .load(
            r#"
            local t = {1, "two", {three = 3}, [{4}] = null, [5.5] = -0.0}
            return lua_encode("argument", nil, t, "x", nil)
        "#,
        )
        .eval()?;
    let vals = decode_values(&lua, &s.as_bytes())?;
    assert_eq!(vals.len(), 4);
    let check: Function = lua
        .load(
            r#"
            return function(a, t, x, d)
                local want = {1, "two", {three = 3}, [{4}] = null, [5.5] = -0.0}
                return a == nil and d == nil and x == "x" and deep_eq(t, want)
            end
        "#,
        )
        .eval()?;
    assert!(check.call::<bool>(vals)?);
    Ok(())
}

#[test]
fn decoded_numbers_look_like_mlua_numbers() -> R {
    let lua = new_lua()?;
    // uint8 255, float64 1.0, float32 0.5, int64 -1
    let bytes = [
        0x04, 0x84, 1, 0xcc, 0xff, 2, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 3, 0xca, 0x3f, 0, 0, 0,
        4, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    let vals = decode_values(&lua, &bytes)?.into_vec();
    assert!(matches!(
        vals[..],
        [
            Value::Integer(255),
            Value::Integer(1),
            Value::Number(0.5),
            Value::Integer(-1)
        ]
    ));
    let from_lua = lua_decode(&lua, &bytes)?.map_err(|e| e.to_string())?;
    assert_eq!(from_lua.raw_get::<f64>(3)?, 0.5);
    // str family decodes to strings too, invalid UTF-8 included
    let bytes = [0x02, 0x82, 1, 0xa2, 0xff, 0x00, 2, 0xd9, 1, b'a'];
    let vals = decode_values(&lua, &bytes)?;
    let from_lua = lua_decode(&lua, &bytes)?.map_err(|e| e.to_string())?;
    assert!(global_fn(&lua, "packed_eq")?.call::<bool>((packed(&lua, &vals)?, from_lua))?);
    match vals.front() {
        Some(Value::String(s)) => assert_eq!(s.as_bytes().as_ref(), b"\xff\x00"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// Tiny deterministic PRNG, to avoid a dev-dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn assert_bad(r: &Result<MultiValue, String>, bytes: &[u8]) {
    if let Err(e) = r {
        assert!(e.starts_with("bad payload: "), "{e} for {bytes:02x?}");
    }
}

#[test]
fn garbage_never_panics() -> R {
    let lua = new_lua()?;
    let sample = eval(
        &lua,
        r#"return 1, nil, "str", {1, 2.5, {a = {true, false, null}}, [{1}] = "k"},
                 -70000, 2^40, ("s"):rep(300)"#,
    )?;
    let valid = rust_encode(&sample, "argument")?;

    // Every strict prefix is truncated, hence refused by both sides.
    for len in 0..valid.len() {
        let r = decode_values(&lua, &valid[..len]);
        assert!(r.is_err(), "prefix {len} accepted");
        assert_bad(&r, &valid[..len]);
        assert!(lua_decode(&lua, &valid[..len])?
            .unwrap_err()
            .starts_with("bad payload: "));
    }
    let mut trailing = valid.clone();
    trailing.push(0);
    assert_eq!(
        decode_values(&lua, &trailing).unwrap_err(),
        "bad payload: trailing bytes"
    );
    assert_eq!(
        lua_decode(&lua, &trailing)?.unwrap_err(),
        "bad payload: trailing bytes"
    );

    // Mutated and random payloads: never a panic or a Lua error, and both
    // decoders accept the same ones, with the same values.
    let fixed: &[&[u8]] = &[
        b"",
        &[0xff],
        &[0xc1],
        &[0x01, 0x81, 0x01, 0xc1],
        &[0x01, 0x81, 0x01, 0xd4, 0x01, 0x02],
        &[0x01, 0x81, 0x00, 0x01],
        &[0x01, 0x81, 0x02, 0x01],
        &[0x01, 0x82, 0x01, 0x01, 0x01, 0x01],
        &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80],
        &[0x01, 0x81, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff],
        &[0x01, 0x81, 0x01, 0xdf, 0xff, 0xff, 0xff, 0xff],
        &[0x01, 0x81, 0x01, 0xc6, 0xff, 0xff, 0xff, 0xff],
        &[0x01, 0x81, 0x01, 0x81, 0xc0, 0x01],
        &[
            0x01, 0x81, 0x01, 0x81, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0, 0x01,
        ],
        &[0x01, 0x81, 0x01, 0x91],
        &[0x01, 0x90],
    ];
    let mut rng = Lcg(0x5eed);
    let mut inputs: Vec<Vec<u8>> = fixed.iter().map(|b| b.to_vec()).collect();
    for _ in 0..3000 {
        let mut b = valid.clone();
        for _ in 0..=rng.next() % 3 {
            let i = (rng.next() as usize) % b.len();
            b[i] = rng.next() as u8;
        }
        inputs.push(b);
    }
    for _ in 0..2000 {
        let len = (rng.next() % 40) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Mostly plausible headers, so the value decoders get exercised.
        if len >= 3 && !rng.next().is_multiple_of(4) {
            b[0] = 0x01;
            b[1] = 0x81;
            b[2] = 0x01;
        }
        inputs.push(b);
    }
    let mut accepted = 0;
    for b in &inputs {
        let r = decode_values(&lua, b);
        assert_bad(&r, b);
        let l = lua_decode(&lua, b)?;
        match (&r, &l) {
            (Ok(vals), Ok(t)) => {
                accepted += 1;
                let eq: bool =
                    global_fn(&lua, "packed_eq")?.call((packed(&lua, vals)?, t.clone()))?;
                assert!(eq, "decoders differ on {b:02x?}");
            }
            (Err(_), Err(e)) => assert!(e.starts_with("bad payload: "), "{e}"),
            _ => panic!("decoders disagree on {b:02x?}: rust {r:?}, lua {l:?}"),
        }
    }
    assert!(
        accepted > 50,
        "only {accepted} accepted: the fuzzing is too weak"
    );
    Ok(())
}

#[test]
fn raw_stack_edge_cases() -> R {
    // What the raw-stack walk and build must get right as mlua did: keys
    // that only look like numbers, metamethods (ignored: access is raw),
    // mixed array and hash parts, and nesting through keys and values to
    // the limit, also under the most values a payload can hold.
    let lua = new_lua()?;
    lua.load(
        r#"
        function keys_and_values(n)
            local t = {}
            for i = 2, n do
                if i % 2 == 0 then t = {[t] = i} else t = {v = t} end
            end
            return t
        end
    "#,
    )
    .exec()?;
    let cases = [
        r#"{["1"] = "a", ["2"] = "b"}"#,
        r#"{"a", "b", ["3"] = "c"}"#,
        "{1, 2, 3, [5] = 5}",
        "{[1] = 1, [2] = 2, [3.0] = 3}",
        "{[2^53] = 1, [-1] = 2, [0] = 3, [0.5] = 4, [-0.0] = 5}",
        "setmetatable({1, 2}, {__index = function() return 9 end, __len = function() return 9 end})",
        "setmetatable({a = 1}, {__index = {b = 2}, __pairs = error})",
        "keys_and_values(100)",
        "(function() local t = {} t[4096] = keys_and_values(100) return unpack(t, 1, 4096) end)()",
    ];
    for code in cases {
        let vals = eval(&lua, &format!("return {code}"))?;
        let rust = rust_encode(&vals, "argument").map_err(|e| format!("{code}: {e}"))?;
        assert!(rust == lua_encode(&lua, &vals, "argument")??, "{code}");
        rust_roundtrip(&lua, &vals).map_err(|e| format!("{code}: {e}"))?;
    }
    assert_eq!(
        err_of(&lua, "keys_and_values(101)", "argument")?,
        format!(
            "table nested deeper than 100 in argument #1 at {}",
            r#"["v"](key)"#.repeat(50)
        )
    );
    // Keys the decoder refuses, whatever their depth.
    let nil_key = [0x01, 0x81, 0x01, 0x91, 0x81, 0xc0, 0x01];
    let nan_key = [
        0x01, 0x81, 0x01, 0x81, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0, 0x01,
    ];
    assert_eq!(
        decode_values(&lua, &nil_key).unwrap_err(),
        "bad payload: nil table key"
    );
    assert_eq!(
        decode_values(&lua, &nan_key).unwrap_err(),
        "bad payload: NaN table key"
    );
    Ok(())
}

/// Speed of both directions on typical payloads; prints µs per call, the
/// minimum over several runs since the machine is shared.  Run with
/// `cargo test --release --lib -- --ignored codec_speed --nocapture`.
#[test]
#[ignore]
fn codec_speed() -> R {
    use std::time::Instant;
    let lua = new_lua()?;
    let cases = [
        ("16 B string", "('x'):rep(16)"),
        ("1 KiB string", "('x'):rep(1024)"),
        ("64 KiB string", "('x'):rep(65536)"),
        (
            "100 records x 10 strings",
            r#"(function()
                local t = {}
                for i = 1, 100 do
                    local r = {}
                    for j = 1, 10 do r["field" .. j] = ("value %d-%d"):format(i, j) end
                    t[i] = r
                end
                return t
            end)()"#,
        ),
        (
            "1000 numbers",
            "(function() local t = {} for i = 1, 1000 do t[i] = i * 0.5 end return t end)()",
        ),
    ];
    for (name, code) in cases {
        let vals = eval(&lua, &format!("return {code}"))?;
        let bytes = rust_encode(&vals, "argument")?;
        // About 20 ms per run at the measured speed.
        let iters = (2_000_000 / bytes.len().max(100)).clamp(20, 20_000);
        let mut out = Vec::new();
        let mut enc = f64::MAX;
        let mut dec = f64::MAX;
        for _ in 0..7 {
            let t = Instant::now();
            for _ in 0..iters {
                out.clear();
                encode_values(&vals, &mut out, "argument")?;
            }
            enc = enc.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            let t = Instant::now();
            for _ in 0..iters {
                decode_values(&lua, &bytes)?;
            }
            dec = dec.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        }
        println!(
            "codec_speed {name:>26} ({:>6} B): encode {enc:>9.2} µs  decode {dec:>9.2} µs",
            bytes.len()
        );
    }
    Ok(())
}
