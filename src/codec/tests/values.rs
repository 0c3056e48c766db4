//! Values that cross, both ways, byte for byte with codec.lua.

use super::*;

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

#[test]
fn borrowed_strings_cross_in_place() -> R {
    let lua = new_lua()?;
    // Lua encodes, borrowing from 4 bytes at any depth; Rust decodes.
    let (bytes, list): (LuaString, Table) = lua
        .load(
            r#"
            local b = require("string.buffer").new()
            local list = { "kept before" }
            assert(codec.encode_borrowing(b, "argument", list, 4, 3,
                                          "ab", "abcdef", { x = "abcdefgh" }))
            return b:tostring(), list
        "#,
        )
        .eval()?;
    let strings: Vec<LuaString> = list.sequence_values().collect::<mlua::Result<_>>()?;
    assert_eq!(strings.len(), 3, "two borrowed after the one already there");
    let kept: Vec<_> = strings.iter().map(|s| s.as_bytes().to_vec()).collect();
    let spans: Vec<Span> = kept[1..].iter().map(|b| Span::of(b)).collect();
    // SAFETY: `kept` outlives the call.
    let vals = unsafe { decode_borrowing(&lua, &bytes.as_bytes(), &spans) }?;
    let want: MultiValue = eval(&lua, r#"return "ab", "abcdef", { x = "abcdefgh" }"#)?;
    assert!(same(&lua, &vals, &want)?);
    // Without its spans, the payload is refused, not read.
    assert_eq!(
        decode_values(&lua, &bytes.as_bytes()).unwrap_err(),
        "bad payload: bad borrowed string"
    );

    // Rust borrows top-level strings only; its own decoder reads them back.
    let (mut spans, mut strings, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let borrow = Borrow {
        min: 4,
        spans: &mut spans,
        strings: &mut strings,
    };
    encode_borrowing(&want, &mut out, "return value", Some(borrow))?;
    assert_eq!((spans.len(), strings.len()), (1, 1));
    // SAFETY: `strings` keeps the span's string alive.
    let back = unsafe { decode_borrowing(&lua, &out, &spans) }?;
    assert!(same(&lua, &back, &want)?);

    // Another ext type is refused.
    let other = [0x01, 0x81, 0x01, 0xd6, 0x02, 0, 0, 0, 0];
    assert!(decode_values(&lua, &other)
        .unwrap_err()
        .contains("unsupported msgpack ext type"));
    Ok(())
}
