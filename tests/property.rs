//! Random values cross intact, through a real nginx: for each seed,
//! tests/fixtures/propgen.lua makes an argument list (nested tables up to
//! the depth limit, holes, mixed keys, NaN, ±0, ±inf, integers near ±2^53,
//! binary strings, ngx.null, nils in the middle and at the end, strings
//! around the zero-copy sizes), and tests/fixtures/property.lua sends it
//! event loop -> thread -> event loop (`push_task` and `push_tasks`, on
//! pools that copy strings and pools that borrow them), event loop ->
//! thread (the thread compares with its own values of the seed) and
//! thread -> event loop (the thread makes the values of the seed), and
//! compares them deeply (NaN equals NaN, -0 differs from 0) with their
//! `select('#')` counts.
//!
//! `PROPERTY_SEEDS` (default 1000, ~3 s) seeds from `PROPERTY_SEED` (default 1);
//! a failure names its seed, which `PROPERTY_SEED=S PROPERTY_SEEDS=1`
//! replays.

mod common;

use common::{env_u64, Case, Nginx};
use std::panic::AssertUnwindSafe;
use std::time::Instant;

const MAIN: &str = "thread_pool copy threads=2;\n\
                    thread_pool borrow threads=2;\n\
                    thread_pool echo threads=1;\n\
                    thread_pool check threads=1;\n\
                    thread_pool gen threads=1;";

const REPLAY: &str = "replay a seed S with: PROPERTY_SEED=S PROPERTY_SEEDS=1 \
                      cargo test --release --test property";

/// Seeds per request.
const CHUNK: u64 = 200;

fn start() -> Nginx {
    let http = format!(
        r#"
    lua_package_path "$prefix/conf/?.lua;{repo}/lua/?.lua;;";
    thread_pool_process_by_lua copy "return ...";
    thread_pool_zero_copy copy off;
    thread_pool_process_by_lua borrow "return ...";
    thread_pool_zero_copy borrow 32;
    thread_pool_process_by_lua echo "return ...";
    thread_pool_process_by_lua check "return require('propgen').check(...)";
    thread_pool_process_by_lua gen "return require('propgen').values(...)";
    server {{
        listen 127.0.0.1:$PORT;
        location /prop {{ content_by_lua_file conf/property.lua; }}
    }}
"#,
        repo = common::repo().display()
    );
    Case::new(MAIN)
        .http(&http)
        .file("propgen.lua", include_str!("fixtures/propgen.lua"))
        .file("property.lua", include_str!("fixtures/property.lua"))
        .start()
}

#[test]
fn random_values_cross_intact_both_ways() {
    let first = env_u64("PROPERTY_SEED", 1);
    let count = env_u64("PROPERTY_SEEDS", 1000);
    let n = start();
    let pid = n.workers();
    let started = Instant::now();
    let mut seed = first;
    while seed < first + count {
        let chunk = CHUNK.min(first + count - seed);
        let seeds = format!("seeds {seed}..{}", seed + chunk - 1);
        let page = format!("/prop?from={seed}&count={chunk}");
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| n.get(&page))).unwrap_or_else(|_| {
            panic!(
                "no answer for {seeds} (did the worker crash?); {REPLAY}\n\
                     error.log:\n{}",
                n.error_log()
            )
        });
        let text = r.text();
        assert_eq!(r.status, 200, "{seeds}: {text}\n{}", n.error_log());
        assert!(
            text.starts_with("ok: "),
            "values changed crossing ({seeds}):\n{text}\n{REPLAY}"
        );
        seed += chunk;
    }
    eprintln!(
        "property: seeds {first}..{} crossed intact in {:.1} s",
        first + count - 1,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(n.workers(), pid, "the worker was replaced");
    n.assert_clean_log();
}
