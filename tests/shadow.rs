//! Shadow comparison (`thread_pool_shadow POOL SHADOW [sample=RATIO]
//! [log_values=on]`): a
//! sampled share of POOL's tasks run again on SHADOW with the same
//! arguments after POOL's result is back; SHADOW's thread compares the
//! results as Lua values and counts, in `stats()` and `thread_pool_status`.
//! - counts are exact under a known mix of equal and different results
//!   (push_task, push_tasks and post_task);
//! - tables compare whatever the order of their keys;
//! - an error differs from a result, and error values are compared;
//! - `sample=0.25` compares exactly a quarter;
//! - a full shadow queue skips the comparison and counts it, the caller
//!   unaffected;
//! - the first mismatch is logged, and further ones within a second only
//!   counted: by default with the lengths and digests of the arguments and
//!   both results, never their content; with `log_values=on` with the
//!   values, each cut to a bounded length;
//! - zero-copy strings both ways survive their caller and POOL's thread
//!   letting go of them before SHADOW compares;
//! - the caller does not wait for a slow shadow;
//! - configuration errors.

mod common;

use common::{eventually, prometheus, request, Case, Nginx};
use std::time::Duration;

/// The handlers of both sides of each pair (conf/sh.lua): `handler("main")`
/// for POOL, `handler("alt")` for SHADOW.
const SH: &str = r#"
local ffi = require "ffi"
ffi.cdef [[ int sh_poll(void *fds, unsigned long nfds, int timeout) asm("poll"); ]]
local C = ffi.C
local new_tab = require "table.new"

local _M = {}

local junk = {}

-- Fills freed memory with other strings of the same size.
function _M.churn(size)
    collectgarbage()
    collectgarbage()
    for i = 1, 64 do
        junk[i] = string.rep(string.char(65 + i % 26), size - 8) .. string.format("%8d", i)
    end
end

-- The same 41 keys, inserted in one order or the other, into tables of
-- different sizes (the reversed one's: `size`).
function _M.keys(reverse, size)
    local t = reverse and new_tab(0, size) or {}
    local from, to, step = 1, 40, 1
    if reverse then
        from, to, step = 40, 1, -1
    end
    for i = from, to, step do
        t["k" .. i] = i
    end
    t[1.5] = "x"
    return t
end

function _M.order(t)
    local o = {}
    for k in pairs(t) do
        o[#o + 1] = tostring(k)
    end
    return table.concat(o, ",")
end

-- Waits until the caller sets `key` in the shared dict (10 s at most,
-- should it never).
function _M.wait_for(key)
    local orders = ngx.shared.orders
    for _ = 1, 2000 do
        if orders:get(key) then
            return
        end
        C.sh_poll(nil, 0, 5)
    end
end

function _M.handler(side)
    local alt = side ~= "main"
    return function(op, x)
        if op == "parity" then
            if alt and x % 2 == 1 then
                return x .. "1"
            end
            return x
        elseif op == "map" then
            -- Each state seeds its string hashes at random, so the two
            -- sides' orders differ only mostly: each task tries another
            -- size, and says what order it sent.
            local t = _M.keys(alt, 64 * 2 ^ x)
            ngx.shared.orders:set(side .. x, _M.order(t))
            return t, alt and 1.0 or 1
        elseif op == "err" then
            if not alt or x == "same" then
                error(x, 0)
            end
            if x == "text" then
                error(x .. "!", 0)
            end
            return x
        elseif op == "md5" then
            if alt then
                -- after the caller and POOL's thread let go of theirs
                _M.wait_for("churned" .. tonumber(x:sub(-8)))
            end
            return ngx.md5(x), x
        elseif op == "churn" then
            _M.churn(x)
        elseif op == "hold" then
            if alt then
                _M.wait_for("release")
                ngx.shared.orders:set("shadow_done", true)
            end
            return x
        elseif op == "differ" then
            return alt and "b" or "a"
        end
    end
end

return _M
"#;

const HTTP: &str = r#"
    lua_package_path "$prefix/conf/?.lua;REPO/lua/?.lua;;";
    lua_shared_dict orders 1m;
    lua_thread_pool main threads=1;
    lua_thread_pool alt threads=1;
    lua_thread_pool sampled threads=1;
    lua_thread_pool alt2 threads=1;
    lua_thread_pool quick threads=1;
    lua_thread_pool slow threads=1 max_queue=1;
    lua_thread_pool loud threads=1;
    lua_thread_pool loud_alt threads=1;
    thread_pool_process_by_lua_block main { return require("sh").handler("main") }
    thread_pool_process_by_lua_block alt { return require("sh").handler("alt") }
    thread_pool_process_by_lua_block sampled { return require("sh").handler("main") }
    thread_pool_process_by_lua_block alt2 { return require("sh").handler("alt") }
    thread_pool_process_by_lua_block quick { return require("sh").handler("main") }
    thread_pool_process_by_lua_block slow { return require("sh").handler("alt") }
    thread_pool_process_by_lua_block loud { return require("sh").handler("main") }
    thread_pool_process_by_lua_block loud_alt { return require("sh").handler("alt") }
    thread_pool_shadow main alt;
    thread_pool_shadow sampled alt2 sample=0.25;
    thread_pool_shadow quick slow;
    thread_pool_shadow loud loud_alt log_values=on sample=1;
    thread_pool_zero_copy main 1k;
    thread_pool_zero_copy alt 1k;
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;
        location /metrics { thread_pool_status; }
        location /stats {
            content_by_lua_block {
                local s = require("resty.threadpool")[ngx.var.arg_pool]:stats()
                ngx.print(s.shadow_compared, " ", s.shadow_mismatched, " ", s.shadow_skipped)
            }
        }
        location /parity {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local n = tonumber(ngx.var.arg_n)
                for i = 1, n do
                    assert(assert(tp.main:push_task("parity", i)) == i)
                end
                local list = {}
                for i = 1, n do list[i] = { "parity", n + i } end
                for i, r in ipairs(assert(tp.main:push_tasks(list))) do
                    assert(r[1] and r[2] == n + i)
                end
                for i = 1, n do
                    assert(tp.main:post_task("parity", 2 * n + i))
                end
                ngx.print("ok")
            }
        }
        location /map {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local n = tonumber(ngx.var.arg_n)
                for i = 1, n do
                    local t = assert(tp.main:push_task("map", i))
                    assert(t.k7 == 7)
                end
                ngx.print("ok")
            }
        }
        # Whether the orders the two sides sent differ, once both sent all.
        location /orders {
            content_by_lua_block {
                local orders = ngx.shared.orders
                local differ = false
                for i = 1, tonumber(ngx.var.arg_n) do
                    local main, alt = orders:get("main" .. i), orders:get("alt" .. i)
                    assert(main and alt, "an order is missing")
                    differ = differ or main ~= alt
                end
                ngx.print(differ)
            }
        }
        location /err {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                for _, x in ipairs({ "value", "same", "text" }) do
                    local ok, err = tp.main:push_task("err", x)
                    assert(ok == nil and err == x)
                end
                ngx.print("ok")
            }
        }
        location /sampled {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                for i = 1, tonumber(ngx.var.arg_n) do
                    assert(tp.sampled:push_task("parity", i) == i)
                end
                ngx.print("ok")
            }
        }
        # Whether every call returned while the shadow held its first task
        # (until the release at the end).
        location /full {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                for i = 1, 5 do
                    assert(tp.quick:push_task("hold", i) == i)
                end
                local orders = ngx.shared.orders
                ngx.print(orders:get("shadow_done") == nil)
                orders:set("release", true)
            }
        }
        location /md5 {
            content_by_lua_block {
                local sh = require "sh"
                local tp = require "resty.threadpool"
                local size = tonumber(ngx.var.arg_size)
                for i = 1, tonumber(ngx.var.arg_n) do
                    local s = string.rep(string.char(97 + i % 26), size - 8) .. string.format("%8d", i)
                    local m, back = tp.main:push_task("md5", s)
                    assert(m == ngx.md5(s) and back == s)
                    -- the caller's string and the returned one go, their
                    -- memory is reused, here and in POOL's thread
                    s, back = nil, nil
                    sh.churn(size)
                    assert(tp.main:push_task("churn", size) == nil)
                    ngx.shared.orders:set("churned" .. i, true)
                end
                ngx.print("ok")
            }
        }
        location /log {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local secret = "session=" .. ngx.var.arg_secret
                local big = string.rep("\1x", 50000)
                for _ = 1, 3 do
                    assert(pool:push_task("differ", secret, big) == "a")
                end
                ngx.print("ok")
            }
        }
        # As /full, with one call.
        location /slow {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                assert(tp.main:push_task("hold", 1) == 1)
                local orders = ngx.shared.orders
                ngx.print(orders:get("shadow_done") == nil)
                orders:set("release", true)
            }
        }
    }
"#;

fn start() -> Nginx {
    let http = HTTP.replace("REPO", &common::repo().display().to_string());
    Case::new("").http(&http).file("sh.lua", SH).start()
}

fn get(n: &Nginx, path: &str) -> String {
    let r = request(n.port, "GET", path, &[], b"");
    assert_eq!(r.status, 200, "{path}: {}\n{}", r.text(), n.error_log());
    r.text()
}

/// (compared, mismatched, skipped) of `pool`'s shadow, once `compared`
/// reaches `want` (skipped ones never will be).
fn counts_once(n: &Nginx, pool: &str, want: impl Fn(u64, u64) -> bool) -> (u64, u64, u64) {
    let mut c = (0, 0, 0);
    let ok = eventually(Duration::from_secs(10), || {
        let text = get(n, &format!("/stats?pool={pool}"));
        let v: Vec<u64> = text.split(' ').map(|w| w.parse().unwrap()).collect();
        c = (v[0], v[1], v[2]);
        want(c.0, c.2)
    });
    assert!(ok, "{pool}: counts stayed at {c:?}");
    // nothing more comes
    std::thread::sleep(Duration::from_millis(300));
    let text = get(n, &format!("/stats?pool={pool}"));
    assert_eq!(text, format!("{} {} {}", c.0, c.1, c.2));
    c
}

#[test]
fn counts_are_exact_under_a_known_mix() {
    let n = start();
    assert_eq!(get(&n, "/parity?n=10"), "ok");
    // 30 tasks (10 pushed, a batch of 10, 10 posted): the odd ones differ
    let c = counts_once(&n, "main", |compared, _| compared >= 30);
    assert_eq!(c, (30, 15, 0));
    let metrics = prometheus(&get(&n, "/metrics"));
    let at = |name: &str| metrics[&format!("{name}{{pool=main,shadow=alt,worker=0}}")];
    assert_eq!(at("ngx_threadpool_shadow_compared_total"), 30.0);
    assert_eq!(at("ngx_threadpool_shadow_mismatched_total"), 15.0);
    assert_eq!(at("ngx_threadpool_shadow_skipped_total"), 0.0);
    // pools without a shadow have no shadow series
    assert!(!metrics
        .keys()
        .any(|k| k.contains("pool=alt,") && k.starts_with("ngx_threadpool_shadow")));
    n.assert_clean_log();
}

#[test]
fn tables_compare_whatever_the_order_of_their_keys() {
    let n = start();
    assert_eq!(get(&n, "/map?n=5"), "ok");
    assert_eq!(counts_once(&n, "main", |c, _| c >= 5), (5, 0, 0));
    // the two sides' tables iterated in different orders
    assert_eq!(get(&n, "/orders?n=5"), "true");
    n.assert_clean_log();
}

#[test]
fn an_error_differs_from_a_result_and_error_values_are_compared() {
    let n = start();
    assert_eq!(get(&n, "/err"), "ok");
    // "value": error vs result; "same": equal errors; "text": other text
    assert_eq!(counts_once(&n, "main", |c, _| c >= 3), (3, 2, 0));
    n.assert_clean_log();
}

#[test]
fn a_sample_of_a_quarter_compares_a_quarter() {
    let n = start();
    assert_eq!(get(&n, "/sampled?n=40"), "ok");
    // every fourth task: 4, 8, ... (even: all equal)
    assert_eq!(counts_once(&n, "sampled", |c, _| c >= 10), (10, 0, 0));
    n.assert_clean_log();
}

#[test]
fn a_full_shadow_queue_skips_and_counts_and_the_caller_goes_on() {
    let n = start();
    // SHADOW: one thread, one queue slot, its first task held until the
    // caller is done; POOL answers at once: the shadow holds at most two
    // tasks (one run, one queued), the rest are skipped, and the caller
    // returns all the while
    assert_eq!(get(&n, "/full"), "true");
    let (compared, mismatched, skipped) = counts_once(&n, "quick", |c, s| c + s >= 5);
    assert_eq!(compared + skipped, 5);
    assert!(skipped >= 3, "skipped {skipped}");
    assert_eq!(mismatched, 0);
    n.assert_clean_log();
}

/// The one line /log's three mismatches on `pool` write.
fn mismatch_line(pool: &str, secret: &str) -> String {
    let n = start();
    assert_eq!(get(&n, &format!("/log?pool={pool}&secret={secret}")), "ok");
    assert_eq!(counts_once(&n, pool, |c, _| c >= 3), (3, 3, 0));
    // a mismatch is counted before its line is written
    eventually(Duration::from_secs(10), || {
        n.error_log().contains("and its shadow")
    });
    let log = n.error_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("and its shadow"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("[warn]"), "{}", lines[0]);
    n.assert_clean_log();
    lines[0].to_string()
}

#[test]
fn the_first_mismatch_is_logged_without_values_and_the_next_ones_counted() {
    let line = mismatch_line("main", "hunter2-7f3a");
    assert!(!line.contains("hunter2"), "{line}");
    assert!(!line.contains("session"), "{line}");
    // "differ", "session=hunter2-7f3a" and 50,000 "\001x" as Lua source
    assert!(
        line.contains(
            r#"thread pool "main" and its shadow "alt" differ (0 more since the last line): arguments: 3 values, 250036 bytes, digest "#
        ),
        "{line}"
    );
    assert!(
        line.contains(r#"; "main" returned: 1 value, 3 bytes, digest "#)
            && line.contains(r#"; "alt" returned: 1 value, 3 bytes, digest "#),
        "{line}"
    );
    // the digests tell the two results apart
    let digest = |after: &str| line.split(after).nth(1).unwrap()[..8].to_string();
    assert_ne!(
        digest(r#""main" returned: 1 value, 3 bytes, digest "#),
        digest(r#""alt" returned: 1 value, 3 bytes, digest "#)
    );
}

#[test]
fn with_log_values_the_first_mismatch_is_logged_cut_with_its_values() {
    let line = mismatch_line("loud", "hunter2-7f3a");
    assert!(
        line.contains(
            r#"thread pool "loud" and its shadow "loud_alt" differ (0 more since the last line): arguments: "differ", "session=hunter2-7f3a", "\001x\001x"#
        ),
        "{line}"
    );
    assert!(
        line.contains(r#"..."; "loud" returned: "a"; "loud_alt" returned: "b""#)
            || line.contains(r#"...; "loud" returned: "a"; "loud_alt" returned: "b""#),
        "{line}"
    );
    // 100,000 bytes of arguments, shown in at most 256 (+ "...")
    assert!(line.len() < 600, "{} bytes: {line}", line.len());
}

#[test]
fn zero_copy_strings_both_ways_outlive_their_owners() {
    let n = start();
    // 64 KiB strings, borrowed from 1 KiB on, each way: the shadow reads
    // them once the caller and POOL's thread let go of theirs and reused
    // the memory
    assert_eq!(get(&n, "/md5?size=65536&n=5"), "ok");
    assert_eq!(counts_once(&n, "main", |c, _| c >= 10), (10, 0, 0));
    n.assert_clean_log();
}

#[test]
fn the_caller_does_not_wait_for_the_shadow() {
    let n = start();
    // the shadow held its task until the caller had returned
    assert_eq!(get(&n, "/slow"), "true");
    assert_eq!(counts_once(&n, "main", |c, _| c >= 1), (1, 0, 0));
    n.assert_clean_log();
}

#[test]
fn configuration_errors() {
    let handlers = r#"
        lua_thread_pool a threads=1;
        lua_thread_pool b threads=1;
        lua_thread_pool c threads=1;
        thread_pool_process_by_lua a "return ...";
        thread_pool_process_by_lua b "return ...";
        thread_pool_process_by_lua c "return ...";
    "#;
    for (directives, error) in [
        (
            "thread_pool_shadow a b sample=0;",
            r#""thread_pool_shadow" directive takes POOL SHADOW [sample=RATIO] [log_values=on|off], RATIO in (0, 1]: invalid "sample=0""#,
        ),
        (
            "thread_pool_shadow a b sample=1.5;",
            r#"invalid "sample=1.5""#,
        ),
        ("thread_pool_shadow a b rate=1;", r#"invalid "rate=1""#),
        (
            "thread_pool_shadow a b log_values=yes;",
            r#"invalid "log_values=yes""#,
        ),
        (
            "thread_pool_shadow a a;",
            r#""thread_pool_shadow" directive cannot make thread pool "a" its own shadow"#,
        ),
        (
            "thread_pool_shadow a b; thread_pool_shadow a c;",
            r#""thread_pool_shadow" directive is duplicate for pool "a""#,
        ),
        (
            "thread_pool_shadow a b; thread_pool_shadow b c;",
            r#"thread pool "a" has the shadow "b", which has a shadow of its own: a shadow cannot be shadowed, in "#,
        ),
        (
            "thread_pool_shadow a nowhere;",
            r#"unknown thread pool "nowhere""#,
        ),
        (
            "lua_thread_pool d threads=1; thread_pool_shadow a d;",
            r#"thread pool "d" has lua_thread_pool but no thread_pool_process_by_lua in "#,
        ),
    ] {
        let out = Case::new("")
            .http(&format!("{handlers}{directives}"))
            .nginx_t();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{directives}: {stderr}");
        assert!(stderr.contains(error), "{directives}: {stderr}");
    }
    let out = Case::new("")
        .http(&format!(
            "{handlers}thread_pool_shadow a b sample=0.5; thread_pool_shadow c b log_values=off;"
        ))
        .nginx_t();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
