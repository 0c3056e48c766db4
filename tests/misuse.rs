//! The module's C functions (`require "ngx_threadpool"`, src/api/)
//! are reachable from any Lua code on the event loop, not only from
//! lua/resty/threadpool.lua: whatever they are called with, the worker
//! survives, keeps serving and leaks nothing.
//! - misuse raises a Lua error naming the function and the argument (the
//!   calls that used to crash the worker among them), and a push where the
//!   coroutine cannot yield is refused;
//! - random argument lists (every Lua type, huge, negative and fractional
//!   numbers, NaN, infinities, malformed batches, pool ids out of range)
//!   for every function, in random places (light threads killed while
//!   they wait, ngx's coroutines, a table.sort comparator) and random
//!   order (results and releases with nothing pushed, taken twice): the
//!   worker keeps its pid, answers, and its RSS stays within a bound.
//!
//! `MISUSE_CALLS` (default 6000) calls from seed `MISUSE_SEED` (default
//! 1), `CHUNK` per request, each request seeded with the next seed; a
//! failure names its seed, which `MISUSE_SEED=S MISUSE_CALLS=1000`
//! replays. `make fuzz` runs 200,000.

mod common;

use common::{env_u64, rss_kib, Case, Nginx};
use std::panic::AssertUnwindSafe;

const REPLAY: &str = "replay a seed S with: MISUSE_SEED=S MISUSE_CALLS=1000 \
                      cargo test --release --test misuse";

/// Calls per request.
const CHUNK: u64 = 1000;

/// How much a worker's RSS may grow over the run, in KiB: far above what
/// the run's buffers and Lua garbage come to, far below a leak of what
/// thousands of calls hold.
const RSS_BOUND_KIB: u64 = 24 * 1024;

fn start() -> Nginx {
    let http = format!(
        r#"
    lua_package_path "$prefix/conf/?.lua;{repo}/lua/?.lua;;";
    lua_thread_pool echo threads=1;
    lua_thread_pool borrow threads=1;
    lua_thread_pool slow threads=1;
    thread_pool_process_by_lua echo "return ...";
    thread_pool_process_by_lua borrow "return ...";
    thread_pool_zero_copy borrow 32;
    thread_pool_init_by_lua slow "
        local ffi = require 'ffi'
        ffi.cdef 'int misuse_poll(void *, unsigned long, int) asm(\"poll\");'
    ";
    thread_pool_process_by_lua slow "
        local C = require('ffi').C
        return function(...) C.misuse_poll(nil, 0, 2) return ... end
    ";
    server {{
        listen 127.0.0.1:$PORT;
        location /calls {{ content_by_lua_file conf/misuse.lua; }}
        location /bad {{
            content_by_lua_block {{
                local core = require "ngx_threadpool"
                local function show(f, ...)
                    local ok, a, b = pcall(core[f], ...)
                    ngx.say(f, ": ", tostring(ok), " ", tostring(a), " ", tostring(b))
                end
                show("push_batch", 0, 1, false, nil, 1)
                show("push_batch", 0, 1, false, 12345, 3)
                show("push_batch", 0, 1, false, {{ {{}} }}, 1e18)
                show("push_batch", 0, 1, false, {{ {{}} }}, 0)
                show("push_batch", 0, 1, nil, {{ {{}} }}, 1)
                show("push_batch", 0, 1, -1, {{ {{}} }}, 1)
                show("push", 0, 1000, 0 / 0, "a")
                show("push", 0, 1000, math.huge, "a")
                show("push", "x", "y")
                show("push", 7, 1000)
                show("push", 0.5, 1000)
                show("push", 0 / 0, 1000)
                show("push", 0, 0)
                show("push", 0, 2 ^ 31)
                show("push")
                show("post", -1, "a")
                show("stats", "0")
                show("pool_id", 1)
                show("result", 123)
                show("results")
                show("release", 4294967296)
                -- a wait where the coroutine cannot yield
                table.sort({{ 2, 1 }}, function(a, b)
                    show("push", 0, 1000, false, "a")
                    return a < b
                end)
                -- the right calls still work
                ngx.say("push: ", tostring(core.push(0, 1000, true, "a")), " ", core.result())
            }}
        }}
        location /ok {{
            content_by_lua_block {{
                ngx.print(require("resty.threadpool").echo:push_task("still serving"))
            }}
        }}
    }}
"#,
        repo = common::repo().display()
    );
    Case::new("")
        .http(&http)
        .file("misuse.lua", include_str!("fixtures/misuse.lua"))
        .start()
}

#[test]
fn misuse_raises_an_error_naming_the_function_and_the_argument() {
    let n = start();
    let r = n.get("/bad");
    let text = r.text();
    assert_eq!(r.status, 200, "{text}\n{}", n.error_log());
    let want = [
        "push_batch: false bad argument #4 to 'push_batch' (table expected, got nil) nil",
        "push_batch: false bad argument #4 to 'push_batch' (table expected, got number) nil",
        "push_batch: false bad argument #5 to 'push_batch' (count out of range: 1 to #list) nil",
        "push_batch: false bad argument #5 to 'push_batch' (count out of range: 1 to #list) nil",
        "push_batch: false bad argument #3 to 'push_batch' (boolean expected, got nil) nil",
        "push_batch: false bad argument #3 to 'push_batch' (deadline: seconds since the epoch expected) nil",
        "push: false bad argument #3 to 'push' (deadline: seconds since the epoch expected) nil",
        "push: false bad argument #3 to 'push' (deadline: seconds since the epoch expected) nil",
        "push: false bad argument #1 to 'push' (number expected, got string) nil",
        "push: false bad argument #1 to 'push' (no such thread pool) nil",
        "push: false bad argument #1 to 'push' (no such thread pool) nil",
        "push: false bad argument #1 to 'push' (no such thread pool) nil",
        "push: false bad argument #2 to 'push' (timeout out of range: 1 to 2147483647 ms) nil",
        "push: false bad argument #2 to 'push' (timeout out of range: 1 to 2147483647 ms) nil",
        "push: false bad argument #1 to 'push' (number expected, got no value) nil",
        "post: false bad argument #1 to 'post' (no such thread pool) nil",
        "stats: false bad argument #1 to 'stats' (number expected, got string) nil",
        "pool_id: false bad argument #1 to 'pool_id' (string expected, got number) nil",
        "result: true nil no result",
        "results: true nil no result",
        "release: true nil nil",
        "push: true -1 cannot wait here: called from a function that a C function called \
         (a table.sort comparator, a string.gsub callback, a finalizer)",
        "push: true a",
    ];
    assert_eq!(text.lines().collect::<Vec<_>>(), want, "{text}");
    n.assert_clean_log();
}

#[test]
fn random_calls_leave_the_worker_alive_serving_and_flat() {
    let first = env_u64("MISUSE_SEED", 1);
    let calls = env_u64("MISUSE_CALLS", 6000);
    let mut n = start();
    let pids = n.workers();
    assert_eq!(pids.len(), 1);
    let run = |seed: u64, count: u64| {
        let page = format!("/calls?seed={seed}&count={count}");
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| n.get(&page))).unwrap_or_else(|_| {
            panic!(
                "no answer for seed {seed} (did the worker crash?); {REPLAY}\nerror.log:\n{}",
                n.error_log()
            )
        });
        let text = r.text();
        assert_eq!(
            r.status,
            200,
            "seed {seed}: {text}\n{REPLAY}\n{}",
            n.error_log()
        );
        assert!(text.starts_with("ok "), "seed {seed}: {text}\n{REPLAY}");
        assert_eq!(
            n.workers(),
            pids,
            "seed {seed}: the worker was replaced; {REPLAY}"
        );
        text
    };
    // a first round brings the worker's buffers, spares and Lua state to
    // their working size
    let text = run(first, CHUNK.min(calls));
    let before = rss_kib(pids[0]);
    let mut seed = first + 1;
    let mut done = 0;
    while done < calls {
        let count = CHUNK.min(calls - done);
        run(seed, count);
        seed += 1;
        done += count;
    }
    let after = rss_kib(pids[0]);
    let r = n.get("/ok");
    assert_eq!(r.text(), "still serving", "{}", n.error_log());
    assert!(
        after < before + RSS_BOUND_KIB,
        "RSS grew from {before} to {after} KiB over {calls} calls"
    );
    // misuse was refused by errors, not only by luck
    assert!(text.contains("bad argument #"), "{text}");
    let first_chunk = text.lines().next().unwrap_or_default();
    eprintln!("misuse: {calls} calls from seed {first}; RSS {before} -> {after} KiB; seed {first}: {first_chunk}");
    // random strings given as a pool's new code fail to build
    n.expect_errors(&[r#"thread pool "*": update * from worker * failed in *"#]);
    n.assert_clean_log();
}
