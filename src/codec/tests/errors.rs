//! Values that cannot cross and payloads that are wrong: the messages
//! the caller gets (docs/lua-api.md, "Values that cross"), never a panic.

use super::*;

fn err_of(lua: &Lua, code: &str, what: &str) -> Result<String, Box<dyn std::error::Error>> {
    let vals = eval(lua, &format!("return {code}"))?;
    err_of_values(lua, &vals, what)
}

/// The error encoding `vals` gives, the same from the stack and from an
/// array, borrowing or not; the output and spans are left as they were.
fn err_of_values(
    lua: &Lua,
    vals: &MultiValue,
    what: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let kept = Span::of(b"kept");
    let borrow = Borrow {
        min: 1,
        nested: true,
    };
    let mut errs = Vec::new();
    for (place, borrow) in [
        (Place::Stack, None),
        (Place::Array, None),
        (Place::Stack, Some(borrow)),
    ] {
        let (mut out, mut spans) = (vec![0xaa], vec![kept]);
        let err =
            write(lua, vals, place, what, borrow, &mut out, &mut spans).expect_err("an error");
        assert_eq!(out, [0xaa], "output not restored after error");
        assert_eq!(spans.len(), 1, "spans not restored after error");
        errs.push(err);
    }
    assert!(errs.iter().all(|e| *e == errs[0]), "{errs:?}");
    Ok(errs.swap_remove(0))
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

/// Values made in Rust that Lua code could not make this way.
#[test]
fn rust_made_error_values() -> R {
    let lua = new_lua()?;
    let ud = lua.create_any_userdata(5u32)?;
    // a light userdata that is not NULL, hence not ngx.null
    let light = Value::LightUserData(LightUserData(std::ptr::dangling_mut()));
    let nested = lua.create_table()?;
    nested.raw_set("u", ud.clone())?;
    let cases = [
        (Value::UserData(ud), "cannot pass userdata in argument #1"),
        (light, "cannot pass userdata in argument #1"),
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
        assert_eq!(err_of_values(&lua, &mv(vec![v]), "argument")?, want);
    }
    Ok(())
}

#[test]
fn too_big() -> R {
    let lua = new_lua()?;
    // One string exactly filling the limit: 3 header bytes + bin32 header.
    let fits = "string.rep('x', 16 * 1024 * 1024 - 8)";
    let vals = eval(&lua, &format!("return {fits}"))?;
    assert_eq!(encode(&lua, &vals, "argument")?.len(), MAX_PAYLOAD);
    // Borrowed, it counts as if copied: it still fits, one more byte
    // would not (err_of borrows too).
    let (mut out, mut spans) = (Vec::new(), Vec::new());
    let borrow = Borrow {
        min: 1,
        nested: false,
    };
    let borrowed = write(
        &lua,
        &vals,
        Place::Stack,
        "argument",
        Some(borrow),
        &mut out,
        &mut spans,
    )?;
    assert_eq!((borrowed, out.len()), (1, 9));

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
    // Crossed by floats, so only the final check sees it; the function
    // that comes before that check is reported first.
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
    roundtrip(&lua, &vals, "argument")?;
    let err = err_of(&lua, "unpack({}, 1, 4097)", "argument")?;
    assert_eq!(err, "too many arguments (max 4096)");
    Ok(())
}

#[test]
fn depth_limit() -> R {
    let lua = new_lua()?;
    let ok = eval(&lua, "return nest(100, 1)")?;
    roundtrip(&lua, &ok, "argument")?;
    assert_eq!(
        err_of(&lua, "nest(101, 1)", "argument")?,
        format!(
            "table nested deeper than 100 in argument #1 at {}",
            "[1]".repeat(100)
        )
    );
    // A hand-made payload one level deeper is refused by the decoder.
    let mut deep = vec![0x01, 0x81, 0x01];
    deep.extend(std::iter::repeat_n(0x91, 100));
    let mut deeper = deep.clone();
    deep.push(0x01);
    assert!(decode(&lua, &deep).is_ok());
    deeper.extend([0x91, 0x01]);
    let err = decode(&lua, &deeper).unwrap_err();
    assert_eq!(err, "bad payload: tables nested deeper than 100");
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

/// Decodes `bytes` twice: checked alone (`codec::decode`, outside any
/// panic guard, so that a panic fails the test) and pushed; both must
/// agree, and a refusal must be a bad payload.
fn decode_checked(lua: &Lua, bytes: &[u8]) -> Result<MultiValue, String> {
    // SAFETY: no spans.
    let checked = unsafe { crate::codec::decode(bytes, &[], Vec::new()) }.map(|d| d.n);
    let pushed = decode(lua, bytes);
    match (&checked, &pushed) {
        (Ok(n), Ok(vals)) => assert_eq!(*n, vals.len(), "{bytes:02x?}"),
        (Err(e), Err(text)) => {
            assert!(matches!(e, CodecError::BadPayload(_)), "{e:?}");
            assert_eq!(e.to_string(), *text, "{bytes:02x?}");
            assert!(text.starts_with("bad payload: "), "{text} for {bytes:02x?}");
        }
        _ => panic!("decode and push_values disagree on {bytes:02x?}: {checked:?}, {pushed:?}"),
    }
    pushed
}

#[test]
fn garbage_never_panics() -> R {
    let lua = new_lua()?;
    let sample = eval(
        &lua,
        r#"return 1, nil, "str", {1, 2.5, {a = {true, false, null}}, [{1}] = "k"},
                 -70000, 2^40, ("s"):rep(300)"#,
    )?;
    let valid = encode(&lua, &sample, "argument")?;

    // Every strict prefix is truncated, hence refused.
    for len in 0..valid.len() {
        assert!(
            decode_checked(&lua, &valid[..len]).is_err(),
            "prefix {len} accepted"
        );
    }
    let mut trailing = valid.clone();
    trailing.push(0);
    assert_eq!(
        decode_checked(&lua, &trailing).unwrap_err(),
        "bad payload: trailing bytes"
    );

    // Mutated and random payloads: never a panic or a Lua error; what is
    // accepted is values that cross again unchanged.
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
        &[0x01, 0x81, 0x01, 0xd6, 0x01, 0, 0, 0, 0],
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
        if let Ok(vals) = decode_checked(&lua, b) {
            accepted += 1;
            roundtrip(&lua, &vals, "argument").map_err(|e| format!("{b:02x?}: {e}"))?;
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
    // What the raw-stack walk and build must get right: keys that only
    // look like numbers, metamethods (ignored: access is raw), mixed array
    // and hash parts, and nesting through keys and values to the limit,
    // also under the most values a payload can hold.
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
        roundtrip(&lua, &vals, "argument").map_err(|e| format!("{code}: {e}"))?;
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
        decode(&lua, &nil_key).unwrap_err(),
        "bad payload: nil table key"
    );
    assert_eq!(
        decode(&lua, &nan_key).unwrap_err(),
        "bad payload: NaN table key"
    );
    Ok(())
}
