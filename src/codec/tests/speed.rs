//! The codec's speed, in loops inside one protected call (so without
//! mlua's conversions); the minimum over several runs, since the machine
//! is shared. Ignored: run with
//! `cargo test --release --lib -- --ignored speed --nocapture`.

use super::*;
use std::time::Instant;

/// Both directions on typical payloads: µs per call of write_values and
/// of push_values.
#[test]
#[ignore]
fn codec_speed() -> R {
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
        let bytes = encode(&lua, &vals, "argument")?;
        // About 20 ms per run at the measured speed.
        let iters = (2_000_000 / bytes.len().max(100)).clamp(20, 20_000);
        let (mut enc, mut dec) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            let (e, d) = time_codec(&lua, &vals, &bytes, iters)?;
            enc = enc.min(e);
            dec = dec.min(d);
        }
        println!(
            "codec_speed {name:>26} ({:>6} B): encode {enc:>9.2} µs  decode {dec:>9.2} µs",
            bytes.len()
        );
    }
    Ok(())
}

/// µs per write_values of `vals` and per push_values of `bytes`, over
/// `iters` calls each.
fn time_codec(
    lua: &Lua,
    vals: &MultiValue,
    bytes: &[u8],
    iters: usize,
) -> mlua::Result<(f64, f64)> {
    let n = vals.len();
    let (mut enc, mut dec) = (0.0, 0.0);
    let mut failed = None;
    // SAFETY: exec_raw runs the closure protected, where both calls may
    // raise, with the n values at 1..=n; the decoded values are popped
    // after each push.
    unsafe {
        lua.exec_raw::<()>(vals.clone(), |l| {
            let (mut out, mut spans) = (Vec::new(), Vec::new());
            let t = Instant::now();
            for _ in 0..iters {
                out.clear();
                if let Err(e) = write_values(
                    l,
                    Source::Stack(1),
                    n,
                    "argument",
                    None,
                    &mut out,
                    &mut spans,
                ) {
                    failed = Some(e);
                }
            }
            enc = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            let top = ffi::lua_gettop(l);
            let t = Instant::now();
            for _ in 0..iters {
                if let Err(e) = push_values(l, bytes, &[]) {
                    failed = Some(e);
                }
                ffi::lua_settop(l, top);
            }
            dec = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            ffi::lua_settop(l, 0);
        })
    }?;
    match failed {
        Some(e) => Err(mlua::Error::runtime(e)),
        None => Ok((enc, dec)),
    }
}

/// A batch's arguments walked as push_tasks walks them (api/functions.rs): ns
/// per task of write_walked over 64 argument tables of two strings, the
/// hand-off benchmark's ("upper" and 16 bytes).
#[test]
#[ignore]
fn batch_walk_speed() -> R {
    let lua = new_lua()?;
    let list = eval(
        &lua,
        "local l = {} for i = 1, 64 do l[i] = { 'upper', ('x'):rep(16) } end return l",
    )?;
    let (mut best, mut failed) = (f64::MAX, None);
    // SAFETY: exec_raw runs the closure protected, with the list at 1;
    // each entry is pushed at 2, the walk's slots reserved above it, and
    // popped after its walk.
    unsafe {
        lua.exec_raw::<()>(list, |l| {
            if !reserve_walk(l, 1) {
                failed = Some(stack_overflow());
                return;
            }
            let (mut out, mut spans) = (Vec::new(), Vec::new());
            let iters = 20_000;
            for _ in 0..9 {
                let t = Instant::now();
                for _ in 0..iters {
                    out.clear();
                    for i in 1..=64 {
                        ffi::lua_rawgeti_(l, 1, i);
                        let n = ffi::lua_objlen(l, 2);
                        let entry = Source::Array(2);
                        if let Err(e) =
                            write_walked(l, entry, n, "argument", None, &mut out, &mut spans)
                        {
                            failed = Some(e);
                        }
                        ffi::lua_settop(l, 1);
                    }
                }
                best = best.min(t.elapsed().as_secs_f64() * 1e9 / (iters * 64) as f64);
            }
        })
    }?;
    if let Some(e) = failed {
        return Err(e.to_string().into());
    }
    println!("batch_walk_speed: {best:.0} ns per task");
    Ok(())
}
