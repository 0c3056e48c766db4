//! Cooperative cancellation: a Lua handler that loops until
//! `require("resty.threadpool").cancelled()` sees its caller give up — a
//! single task's timeout, a batch's timeout, a request whose client
//! closed — and sees false while its caller waits; on the event loop the
//! same call is false, so a shared handler runs inline.
//!
//! Both sides read CLOCK_MONOTONIC (one clock for every thread of the
//! process): the caller once it gave up (when its timeout returned; for a
//! request that went away, in a timer its log phase started, which runs
//! after nginx freed the request and let go of its tasks), the handler
//! before each look at the flag. The flag is set by then, so every look
//! that found it down began before: a verdict that holds however long the
//! scheduler of a busy machine sets either side aside. How soon a handler
//! sees the flag is a figure of `make bench` (its "Mechanisms" section).
//! A task no thread took before its caller gave up is not run: it must
//! count as cancelled instead.

mod common;

use common::{eventually, request, skipped_once_idle, Case, Nginx};
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

-- Spins until cancelled or for `limit` seconds; records that it started
-- under `key`_started, when it saw the flag (-1: never) under `key`, and
-- when it last began a look that found it down under `key`_down; returns
-- whether it saw it. The flag is looked at before the deadline: a thread
-- set aside past it still looks once.
function _M.spin(key, limit)
    local now = _M.now
    local deadline = now() + limit
    local seen, down = -1, -1
    if key then
        ngx.shared.cx:set(key .. "_started", now())
    end
    while true do
        local t = now()
        if tp.cancelled() then
            seen = t
            break
        end
        if t >= deadline then
            break
        end
        down = t
    end
    if key then
        ngx.shared.cx:set(key .. "_down", down)
        ngx.shared.cx:set(key, seen)
    end
    return seen >= 0
end

return _M
"#;

const HTTP: &str = r#"
    lua_package_path "$prefix/conf/?.lua;REPO/lua/?.lua;;";
    lua_shared_dict cx 1m;
    lua_thread_pool spin threads=2;
    thread_pool_scheduling spin normal nice=0;
    thread_pool_process_by_lua_block spin {
        return require("cx").spin
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
                local ok, err = require("resty.threadpool").spin:push_task_timeout(0.05, ngx.var.arg_key, LIMIT)
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
                    { { key .. "a", LIMIT }, { key .. "b", LIMIT } })
                ngx.shared.cx:set(key .. "_gaveup", cx.now())
                ngx.say(tostring(res), " ", err)
            }
        }
        location /gone {
            lua_check_client_abort on;
            content_by_lua_block {
                require("resty.threadpool").spin:push_task(ngx.var.arg_key, LIMIT)
                ngx.say("not gone")
            }
            # nginx frees the request and lets go of its tasks after this
            # phase, before the timer runs
            log_by_lua_block {
                local key = ngx.var.arg_key
                assert(ngx.timer.at(0, function()
                    ngx.shared.cx:set(key .. "_gaveup", require("cx").now())
                end))
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
        location /idle {
            content_by_lua_block {
                local s = require("resty.threadpool").spin:stats()
                ngx.print(s.busy + s.queued, " ", s.cancelled + s.expired)
            }
        }
    }
"#;

/// How long a handler spins at most when it never sees the flag (a module
/// that does not set it): the tests then fail, this much later.
const LIMIT_S: u32 = 10;

fn start() -> Nginx {
    let http = HTTP
        .replace("REPO", &common::repo().display().to_string())
        .replace("LIMIT", &LIMIT_S.to_string());
    Case::new("").http(&http).file("cx.lua", CX).start()
}

/// A number the test recorded in the shared dict under `key`, if any.
fn lookup(n: &Nginx, key: &str) -> Option<f64> {
    let r = request(n.port, "GET", &format!("/dict?k={key}"), &[], b"");
    r.text().trim().parse::<f64>().ok()
}

/// A number the test recorded in the shared dict, once it is there.
fn recorded(n: &Nginx, key: &str) -> f64 {
    let mut v = None;
    assert!(
        eventually(Duration::from_secs(3 * LIMIT_S as u64), || {
            v = lookup(n, key);
            v.is_some()
        }),
        "{key}: nothing recorded"
    );
    v.unwrap()
}

/// For the handler that records under `key`, whose caller recorded when
/// it gave up under `{caller}_gaveup`: asserts that it saw the flag and
/// that every look that found it down began before the caller gave up.
/// Returns how long after the caller gave up the handler saw it (seconds;
/// printed, not judged).
fn check_seen(n: &Nginx, caller: &str, key: &str) -> f64 {
    let seen = recorded(n, key);
    assert!(
        seen >= 0.0,
        "{key}: the handler never saw its caller give up"
    );
    let gaveup = recorded(n, &format!("{caller}_gaveup"));
    let down = recorded(n, &format!("{key}_down"));
    assert!(
        down < gaveup,
        "{key}: a look {:.1} µs after the caller gave up found the flag down",
        (down - gaveup) * 1e6
    );
    seen - gaveup
}

/// Checks the handlers of `tasks` (caller, key), which each ran or were
/// skipped: those that started saw the flag at once (check_seen), the
/// others were counted as cancelled (the pool's count grew by as many
/// since `skipped_before`). Returns how many ran.
fn check_trials(n: &Nginx, what: &str, tasks: &[(String, String)], skipped_before: u64) -> usize {
    let skipped_now = skipped_once_idle(n, "/idle");
    let mut seen_after = Vec::new();
    let mut not_run = 0;
    for (caller, key) in tasks {
        if lookup(n, &format!("{key}_started")).is_some() {
            seen_after.push(format!("{:.1}", check_seen(n, caller, key) * 1e6));
        } else {
            not_run += 1;
        }
    }
    eprintln!(
        "{what}: seen after (µs): {}; {not_run} not run",
        seen_after.join(" ")
    );
    assert_eq!(
        skipped_now - skipped_before,
        not_run,
        "{what}: tasks not run and tasks counted as cancelled"
    );
    seen_after.len()
}

/// Trials of `one` (which makes the trial's caller give up and returns its
/// tasks) until RUN handlers ran, each trial checked: under load a thread
/// may take a task only after its caller gave up, and then not run it.
fn until_run(n: &Nginx, what: &str, mut one: impl FnMut(usize) -> Vec<(String, String)>) {
    const RUN: usize = 3;
    let mut ran = 0;
    for i in 0..50 {
        let before = skipped_once_idle(n, "/idle");
        let tasks = one(i);
        ran += check_trials(n, what, &tasks, before);
        if ran >= RUN {
            return;
        }
    }
    panic!("{what}: only {ran} of the handlers ran");
}

#[test]
fn a_handler_sees_its_callers_timeout() {
    let n = start();
    until_run(&n, "single task", |i| {
        let key = format!("single{i}");
        let r = request(n.port, "GET", &format!("/single?key={key}"), &[], b"");
        let text = r.text();
        let mut words = text.split_whitespace();
        assert_eq!(words.next(), Some("nil"), "{text}");
        assert_eq!(words.next(), Some("timeout"), "{text}");
        let waited: f64 = words.next().unwrap().parse().unwrap();
        assert!(waited >= 0.049, "{text}");
        vec![(key.clone(), key)]
    });
    n.assert_clean_log();
}

#[test]
fn every_task_of_a_batch_sees_the_batchs_timeout() {
    let n = start();
    until_run(&n, "batch", |i| {
        let key = format!("batch{i}");
        let r = request(n.port, "GET", &format!("/batch?key={key}"), &[], b"");
        assert_eq!(r.text().trim(), "nil timeout");
        ["a", "b"]
            .iter()
            .map(|task| (key.clone(), format!("{key}{task}")))
            .collect()
    });
    n.assert_clean_log();
}

#[test]
fn a_handler_sees_its_request_go_away() {
    let n = start();
    until_run(&n, "request gone", |i| {
        let key = format!("gone{i}");
        let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
        write!(s, "GET /gone?key={key} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        // the task runs, then the client goes
        recorded(&n, &format!("{key}_started"));
        drop(s);
        recorded(&n, &format!("{key}_gaveup"));
        vec![(key.clone(), key)]
    });
}

#[test]
fn cancelled_is_false_while_the_caller_waits_and_on_the_event_loop() {
    let n = start();
    let r = request(n.port, "GET", "/wait", &[], b"");
    assert_eq!(r.text().trim(), "false nil false false");
    n.assert_clean_log();
}
