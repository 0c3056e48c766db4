//! Values that cross: their bytes on the wire, and back unchanged.

use super::*;

#[test]
fn encode_string_decodes_as_one_string() -> R {
    let lua = new_lua()?;
    let mut out = Vec::new();
    encode_string(b"boom\0\xff", &mut out);
    let vals = decode(&lua, &out)?;
    assert_eq!(vals.len(), 1);
    let s = vals[0].as_string().expect("a string").as_bytes().to_vec();
    assert_eq!(s, b"boom\0\xff");
    assert_eq!(error_text(&out), "boom\0\u{fffd}");
    Ok(())
}

#[test]
fn error_text_reads_a_str_as_a_bin() {
    // uint(1) map(1) { 1: str "oops" }, as the handler crate writes it
    assert_eq!(error_text(b"\x01\x81\x01\xa4oops"), "oops");
    assert_eq!(error_text(b"\x01\x81\x01\xd9\x04oops"), "oops");
    assert_eq!(
        error_text(b"\x01\x81\x01\x2a"),
        "error object that is not a string"
    );
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
        roundtrip(&lua, vals, "argument")?;
    }
    Ok(())
}

#[test]
fn negative_zero_stays_float() -> R {
    let lua = new_lua()?;
    let bytes = encode(
        &lua,
        &mv(vec![Value::Number(-0.0), Value::Number(0.0)]),
        "argument",
    )?;
    assert_eq!(
        bytes,
        [0x02, 0x82, 0x01, 0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x00]
    );
    let back = decode(&lua, &bytes)?;
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
        assert_eq!(encode(&lua, &vals, "argument")?, *want, "{code}");
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
        roundtrip(&lua, &vals, "argument").map_err(|e| format!("{code}: {e}"))?;
    }
    Ok(())
}

#[test]
fn holes_make_a_map() -> R {
    let lua = new_lua()?;
    let vals = eval(&lua, "return {1, nil, 3}")?;
    let bytes = encode(&lua, &vals, "argument")?;
    assert_eq!(bytes[3] & 0xf0, 0x80, "{bytes:02x?}");
    let back = decode(&lua, &bytes)?;
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

/// Every case crosses as arguments and as return values, from the stack
/// and from an array alike.
#[test]
fn battery() -> R {
    let lua = new_lua()?;
    let cases: Table = lua.load(BATTERY).eval()?;
    for (i, case) in cases.sequence_values::<Function>().enumerate() {
        let vals: MultiValue = case?.call(())?;
        for what in ["argument", "return value"] {
            roundtrip(&lua, &vals, what).map_err(|e| format!("case {}: {e}", i + 1))?;
        }
    }
    Ok(())
}

#[test]
fn values_built_in_lua_cross() -> R {
    // Checked by a Lua function on the values pushed, not through mlua.
    let lua = new_lua()?;
    let vals = eval(
        &lua,
        r#"return nil, {1, "two", {three = 3}, [{4}] = null, [5.5] = -0.0}, "x", nil"#,
    )?;
    let back = decode(&lua, &encode(&lua, &vals, "argument")?)?;
    assert_eq!(back.len(), 4);
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
    assert!(check.call::<bool>(back)?);
    Ok(())
}

#[test]
fn numbers_and_strings_of_every_width_decode() -> R {
    let lua = new_lua()?;
    // uint8 255, float64 1.0, float32 0.5, int64 -1
    let bytes = [
        0x04, 0x84, 1, 0xcc, 0xff, 2, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 3, 0xca, 0x3f, 0, 0, 0,
        4, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    let vals = decode(&lua, &bytes)?.into_vec();
    assert!(
        matches!(
            vals[..],
            [
                Value::Integer(255),
                Value::Integer(1),
                Value::Number(0.5),
                Value::Integer(-1)
            ]
        ),
        "{vals:?}"
    );
    // str family decodes to strings too, invalid UTF-8 included
    let bytes = [0x02, 0x82, 1, 0xa2, 0xff, 0x00, 2, 0xd9, 1, b'a'];
    let vals = decode(&lua, &bytes)?;
    let strings: Vec<Vec<u8>> = vals
        .iter()
        .map(|v| v.as_string().expect("a string").as_bytes().to_vec())
        .collect();
    assert_eq!(strings, [&b"\xff\x00"[..], b"a"]);
    Ok(())
}

#[test]
fn borrowed_strings_cross_in_place() -> R {
    let lua = new_lua()?;
    let vals = eval(&lua, r#"return "ab", "abcdef", { x = "abcdefgh" }"#)?;
    let string_at = |v: &Value| -> LuaString { v.as_string().expect("a string").clone() };
    let eight: LuaString = vals[2].as_table().expect("a table").get("x")?;
    let six = string_at(&vals[1]);

    // Arguments borrow from 4 bytes at any depth: the payload holds an ext
    // (type 1, the span's big-endian index) for each, the spans point at
    // the Lua strings' own bytes.
    let nested = Borrow {
        min: 4,
        nested: true,
    };
    let (mut out, mut spans) = (Vec::new(), Vec::new());
    let borrowed = write(
        &lua,
        &vals,
        Place::Stack,
        "argument",
        Some(nested),
        &mut out,
        &mut spans,
    )?;
    assert_eq!(borrowed, 2);
    #[rustfmt::skip]
    let want = [
        0x03, 0x83,
        0x01, 0xc4, 2, b'a', b'b',
        0x02, 0xd6, 0x01, 0, 0, 0, 0,
        0x03, 0x81, 0xc4, 1, b'x', 0xd6, 0x01, 0, 0, 0, 1,
    ];
    assert_eq!(out, want);
    let ptrs: Vec<_> = spans.iter().map(|s| (s.data, s.len)).collect();
    assert_eq!(
        ptrs,
        [(six.as_bytes().as_ptr(), 6), (eight.as_bytes().as_ptr(), 8)]
    );
    // From an array, the same.
    let (mut out2, mut spans2) = (Vec::new(), Vec::new());
    write(
        &lua,
        &vals,
        Place::Array,
        "argument",
        Some(nested),
        &mut out2,
        &mut spans2,
    )?;
    assert_eq!(out2, out);
    assert_eq!(spans2.len(), 2);

    // SAFETY: `vals` keeps the spans' strings alive.
    let back = unsafe { decode_with(&lua, &out, &spans) }?;
    assert!(same(&lua, &back, &vals)?);
    // Without its spans, the payload is refused, not read.
    assert_eq!(
        decode(&lua, &out).unwrap_err(),
        "bad payload: bad borrowed string"
    );

    // anchor stores the same strings, in the same order, after what the
    // table already holds, and says where the next would go.
    let list = anchored(&lua, &vals, nested, 5)?;
    let strings: Vec<LuaString> = list.sequence_values().collect::<mlua::Result<_>>()?;
    assert_eq!(strings.len(), 3, "two anchored after the one already there");
    assert_eq!(strings[0].as_bytes().as_ref(), b"kept before");
    for (s, span) in strings[1..].iter().zip(&spans) {
        assert_eq!(s.as_bytes().as_ptr(), span.data);
    }

    // Results borrow top-level strings only.
    let top_level = Borrow {
        min: 4,
        nested: false,
    };
    let (mut out, mut spans) = (Vec::new(), Vec::new());
    let borrowed = write(
        &lua,
        &vals,
        Place::Stack,
        "return value",
        Some(top_level),
        &mut out,
        &mut spans,
    )?;
    assert_eq!((borrowed, spans.len()), (1, 1));
    assert_eq!(spans[0].data, six.as_bytes().as_ptr());
    // SAFETY: `vals` keeps the span's string alive.
    let back = unsafe { decode_with(&lua, &out, &spans) }?;
    assert!(same(&lua, &back, &vals)?);
    assert_eq!(anchored(&lua, &vals, top_level, 5)?.raw_len(), 2);
    // Values that borrow more than the room given (they changed since they
    // were encoded): anchor stops at its end, and says so.
    assert_eq!(anchored(&lua, &vals, nested, 3)?.raw_len(), 2);

    // Another ext type is refused.
    let other = [0x01, 0x81, 0x01, 0xd6, 0x02, 0, 0, 0, 0];
    assert!(decode(&lua, &other)
        .unwrap_err()
        .contains("unsupported msgpack ext type"));
    Ok(())
}

/// A table holding "kept before", then what anchor stores there, up to
/// index `end` (exclusive), of the strings `vals` borrow; checks the
/// index anchor returns.
fn anchored(lua: &Lua, vals: &MultiValue, borrow: Borrow, end: c_int) -> mlua::Result<Table> {
    let n = vals.len();
    let mut next = 0;
    // SAFETY: exec_raw runs the closure protected, with the values at
    // 1..=n, unchanged since `write` encoded them; the table's array part
    // has room for every string anchor stores (before `end`, at most 5).
    let mut left = unsafe {
        lua.exec_raw::<MultiValue>(vals.clone(), |l| {
            ffi::lua_createtable(l, 4, 0);
            let table = ffi::lua_gettop(l);
            ffi::lua_pushstring(l, c"kept before".as_ptr());
            ffi::lua_rawseti_(l, table, 1);
            next = anchor(l, Source::Stack(1), n, borrow, table, 2, end);
        })
    }?;
    let Some(Value::Table(t)) = left.pop_back() else {
        panic!("no table");
    };
    assert_eq!(next as usize, t.raw_len() + 1, "anchor's next index");
    Ok(t)
}

/// A batch's results are read at once: each payload sets its own values,
/// value j at index j + 1 of its entry, and a bad one among them (here
/// after a value it had read) sets nothing and moves no other's.
#[test]
fn a_batch_reads_each_payload_on_its_own() -> R {
    let lua = new_lua()?;
    let payloads: [&[u8]; 3] = [
        b"\x02\x82\x01\xa1a\x02\x01",
        b"\x01\x81\x01\xa1x\x00",
        b"\x02\x81\x02\xc3",
    ];
    // SAFETY: no spans.
    let entries = unsafe { read_entries(payloads.iter().map(|&b| (b, &[][..]))) };
    let count = |i| entries.count(i).map_err(|e| e.to_string());
    assert_eq!(count(0), Ok(2));
    assert_eq!(count(1), Err("bad payload: trailing bytes".into()));
    assert_eq!(count(2), Ok(2));
    // SAFETY: exec_raw runs the closure in a protected call, where set may
    // raise; each entry is the table on top, with room above it.
    let tables = unsafe {
        lua.exec_raw::<MultiValue>((), |l| {
            for i in 0..payloads.len() {
                ffi::lua_createtable(l, 0, 0);
                entries.set(l, i);
            }
        })
    }?;
    let t: Vec<Table> = tables
        .into_iter()
        .map(|v| v.as_table().cloned().expect("a table"))
        .collect();
    assert_eq!(t[0].raw_get::<String>(2)?, "a");
    assert_eq!(t[0].raw_get::<i64>(3)?, 1);
    assert_eq!(t[1].pairs::<Value, Value>().count(), 0);
    assert_eq!(t[2].raw_get::<Value>(2)?, Value::Nil);
    assert!(t[2].raw_get::<bool>(3)?);
    assert_eq!(t[2].pairs::<Value, Value>().count(), 1);
    Ok(())
}
