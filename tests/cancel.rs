//! Cooperative cancellation: a Lua handler that loops until
//! `require("resty.threadpool").cancelled()` sees its caller give up
//! within 1 ms — a single task's timeout, a batch's timeout, a request
//! whose client closed — and sees false while its caller waits; on the
//! event loop the same call is false, so a shared handler runs inline.
//!
//! Both sides read CLOCK_MONOTONIC (one clock for every thread of the
//! process): the caller when its timeout returned (or, for a request that
//! went away, its log phase, which nginx runs just before it frees the
//! request and lets go of its tasks), the handler before each look at the
//! flag. What is checked is when the handler last began a look that found
//! the flag down: a handler that the scheduler of a busy machine set aside
//! sees the flag late, but its first look after the caller gave up must
//! find it set. A handler that never sees it gives up after 2 s.

mod common;

use common::{eventually, request, Nginx};
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

/// The shared handler and clock (conf/cx.lua).
const CX: &str = r#"
local ffi = require "ffi"
ffi.cdef [[
typedef struct { long s; long ns; } cx_ts;
int cx_clock_gettime(int, cx_ts *) asm("clock_gettime");
]]
local C = ffi.C
local tp = require "resty.threadpool"
local ts = ffi.new("cx_ts")

local _M = {}

local function clock(id)
    C.cx_clock_gettime(id, ts)
    return tonumber(ts.s) + tonumber(ts.ns) * 1e-9
end

function _M.now()
    return clock(1)  -- CLOCK_MONOTONIC
end

-- This thread's CPU time: what a loop costs, however long the scheduler
-- of a busy machine sets the thread aside.
function _M.cpu()
    return clock(3)  -- CLOCK_THREAD_CPUTIME_ID
end

-- Spins until cancelled or for `limit` seconds; records when it saw the
-- flag (-1: never) under `key`, and when it last began a look that found
-- it down under `key`_down; returns whether it saw it.
function _M.spin(key, limit)
    local now = _M.now
    local deadline = now() + limit
    local seen, down = -1, -1
    while true do
        local t = now()
        if t >= deadline then
            break
        end
        if tp.cancelled() then
            seen = t
            break
        end
        down = t
    end
    if key then
        ngx.shared.cx:set(key, seen)
        ngx.shared.cx:set(key .. "_down", down)
    end
    return seen >= 0
end

return _M
"#;

const HTTP: &str = r#"
    lua_package_path "$prefix/conf/?.lua;REPO/lua/?.lua;;";
    lua_shared_dict cx 1m;
    lua_thread_pool spin threads=2;
    lua_thread_pool bench threads=1;
    thread_pool_scheduling spin normal nice=0;
    thread_pool_process_by_lua_block spin {
        return require("cx").spin
    }
    thread_pool_process_by_lua_block bench {
        local tp = require "resty.threadpool"
        local now = require("cx").cpu
        return function(n)
            local seen = 0
            local t0 = now()
            for _ = 1, n do
                if tp.cancelled() then seen = seen + 1 end
            end
            return (now() - t0) / n, seen
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;
        location /dict {
            content_by_lua_block { ngx.print(ngx.shared.cx:get(ngx.var.arg_k)) }
        }
        location /single {
            content_by_lua_block {
                local cx = require "cx"
                local t0 = cx.now()
                local ok, err = require("resty.threadpool").spin:push_task_timeout(0.05, ngx.var.arg_key, 2)
                local t1 = cx.now()
                ngx.shared.cx:set(ngx.var.arg_key .. "_gaveup", t1)
                ngx.say(tostring(ok), " ", err, " ", t1 - t0)
            }
        }
        location /batch {
            content_by_lua_block {
                local cx = require "cx"
                local key = ngx.var.arg_key
                local res, err = require("resty.threadpool").spin:push_tasks_timeout(0.05,
                    { { key .. "a", 2 }, { key .. "b", 2 } })
                ngx.shared.cx:set(key .. "_gaveup", cx.now())
                ngx.say(tostring(res), " ", err)
            }
        }
        location /gone {
            lua_check_client_abort on;
            content_by_lua_block {
                require("resty.threadpool").spin:push_task(ngx.var.arg_key, 2)
                ngx.say("not gone")
            }
            log_by_lua_block {
                ngx.shared.cx:set(ngx.var.arg_key .. "_gaveup", require("cx").now())
            }
        }
        location /wait {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local cx = require "cx"
                -- a caller that waits: the handler runs its whole 50 ms
                local ok, err = tp.spin:push_task(nil, 0.05)
                -- the same handler inline, on the event loop
                local inline = cx.spin(nil, 0.001)
                ngx.say(tostring(ok), " ", tostring(err), " ", tostring(inline), " ",
                        tostring(tp.cancelled()))
            }
        }
        location /cost {
            content_by_lua_block {
                local per, seen = require("resty.threadpool").bench:push_task(10000000)
                ngx.say(per * 1e9, " ", seen)
            }
        }
    }
"#;

fn start() -> Nginx {
    let http = HTTP.replace("REPO", &common::repo().display().to_string());
    Nginx::start_with(1, "", &http, &[("cx.lua", CX)])
}

/// A number the test recorded in the shared dict, once it is there.
fn recorded(n: &Nginx, key: &str) -> f64 {
    let mut v = None;
    assert!(
        eventually(Duration::from_secs(5), || {
            let r = request(n.port, "GET", &format!("/dict?k={key}"), &[], b"");
            v = r.text().trim().parse::<f64>().ok();
            v.is_some()
        }),
        "{key}: nothing recorded"
    );
    v.unwrap()
}

/// How long after its caller gave up (the time recorded under
/// `{caller}_gaveup`) the handler that recorded under `key` last began a
/// look at the flag that found it down (negative: every such look began
/// before), and how long after it the handler saw the flag.
fn lateness(n: &Nginx, caller: &str, key: &str) -> (f64, f64) {
    let seen = recorded(n, key);
    assert!(
        seen >= 0.0,
        "{key}: the handler never saw its caller give up"
    );
    let gaveup = recorded(n, &format!("{caller}_gaveup"));
    (recorded(n, &format!("{key}_down")) - gaveup, seen - gaveup)
}

/// Within 1 ms: the median of the trials, so that one trial whose event
/// loop the scheduler set aside between a request's log phase and its end
/// does not fail the run; a trial 50 ms late fails it.
fn assert_within_1ms(what: &str, trials: Vec<(f64, f64)>) {
    let us = |xs: &[f64]| -> Vec<String> { xs.iter().map(|l| format!("{:.1}", l * 1e6)).collect() };
    let (mut late, seen): (Vec<f64>, Vec<f64>) = trials.into_iter().unzip();
    late.sort_by(f64::total_cmp);
    eprintln!("{what}: seen after (µs): {}", us(&seen).join(" "));
    eprintln!(
        "{what}: last found down after (µs): {}",
        us(&late).join(" ")
    );
    let median = late[late.len() / 2];
    assert!(median < 1e-3, "{what}: median {:.3} ms", median * 1e3);
    assert!(
        late.iter().all(|&l| l < 50e-3),
        "{what}: {:?} µs",
        us(&late)
    );
}

#[test]
fn a_handler_sees_its_callers_timeout_within_1ms() {
    let n = start();
    let mut late = Vec::new();
    for i in 0..5 {
        let key = format!("single{i}");
        let r = request(n.port, "GET", &format!("/single?key={key}"), &[], b"");
        let text = r.text();
        let mut words = text.split_whitespace();
        assert_eq!(words.next(), Some("nil"), "{text}");
        assert_eq!(words.next(), Some("timeout"), "{text}");
        let waited: f64 = words.next().unwrap().parse().unwrap();
        assert!(waited >= 0.049, "{text}");
        late.push(lateness(&n, &key, &key));
    }
    assert_within_1ms("single task", late);
    n.assert_clean_log();
}

#[test]
fn every_task_of_a_batch_sees_the_batchs_timeout_within_1ms() {
    let n = start();
    let mut late = Vec::new();
    for i in 0..3 {
        let key = format!("batch{i}");
        let r = request(n.port, "GET", &format!("/batch?key={key}"), &[], b"");
        assert_eq!(r.text().trim(), "nil timeout");
        for task in ["a", "b"] {
            late.push(lateness(&n, &key, &format!("{key}{task}")));
        }
    }
    assert_within_1ms("batch", late);
    n.assert_clean_log();
}

#[test]
fn a_handler_sees_its_request_go_away_within_1ms() {
    let n = start();
    let mut late = Vec::new();
    for i in 0..5 {
        let key = format!("gone{i}");
        let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
        write!(s, "GET /gone?key={key} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        // the task runs, then the client goes
        std::thread::sleep(Duration::from_millis(100));
        drop(s);
        late.push(lateness(&n, &key, &key));
    }
    assert_within_1ms("request gone", late);
}

#[test]
fn cancelled_is_false_while_the_caller_waits_and_on_the_event_loop() {
    let n = start();
    let r = request(n.port, "GET", "/wait", &[], b"");
    assert_eq!(r.text().trim(), "false nil false false");
    n.assert_clean_log();
}

#[test]
fn cancelled_costs_nanoseconds() {
    let n = start();
    let r = request(n.port, "GET", "/cost", &[], b"");
    let text = r.text();
    let mut words = text.split_whitespace();
    let ns: f64 = words.next().and_then(|w| w.parse().ok()).expect(&text);
    assert_eq!(words.next(), Some("0"), "{text}");
    eprintln!("cancelled(): {ns:.2} ns per call");
    assert!(ns < 50.0, "{ns} ns per call");
}
