//! Absolute deadlines (`push_task_until`, `push_tasks_until`): a deadline
//! given in seconds since the epoch, such as `ngx.req.start_time() + s`,
//! counts the time the request spent before the push. A request that
//! spent its budget in an earlier phase is refused at once with
//! "overloaded" and its task never runs, where `push_task_timeout` with
//! the same number would still run it; a deadline still ahead bounds the
//! wait to the time left, and admission refuses what the pool cannot
//! finish by it; the same in a timer; wrong deadlines raise an error that
//! blames the caller's line.
//!
//! A task that runs leaves a file behind: a refused one must leave none.

mod common;

use common::*;
use std::time::Duration;

const HTTP: &str = r##"
    lua_shared_dict results 1m;
    thread_pool_process_by_lua_block p { HANDLER }
    init_by_lua_block { HOLD }
    server {
        listen 127.0.0.1:$PORT;
        location /sleep {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.print(select(2, tp.p:push_task("sleep", tonumber(ngx.var.arg_s))) or "slept")
            }
        }
        # The request spends 0.3 s in its access phase; its deadline is
        # 0.2 s from its start, so it has passed at the push.
        location /spent {
            access_by_lua_block { ngx.sleep(0.3) }
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local at = ngx.req.start_time() + 0.2
                local out = {
                    o.show(tp.p:push_task_until(at, "mark", o.trace("until"))),
                    o.show(tp.p:push_tasks_until(at, {
                        { "mark", o.trace("batch1") }, { "mark", o.trace("batch2") } })),
                    o.show(tp.p:push_task_timeout(0.2, "mark", o.trace("timeout"))),
                }
                ngx.print(table.concat(out, " "))
            }
        }
        # 1 s spent before the push, a deadline 1.5 s from the start, a
        # task of 3 s: the caller stops waiting at the deadline, 0.5 s
        # after its push, not 1.5 s after it.
        location /left {
            access_by_lua_block { ngx.sleep(1) }
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local start = ngx.req.start_time()
                local res = o.show(tp.p:push_task_until(start + 1.5, "sleep", 3))
                ngx.update_time()
                local took = ngx.now() - start
                ngx.print(res, " by_deadline=", tostring(took >= 1.45 and took < 2.2))
            }
        }
        # The thread held (1 s or more by the measured run time): a deadline
        # 0.5 s ahead cannot be met and is refused at once; one 30 s ahead
        # is queued and runs once the thread is free.
        location /held {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local release = o.hold("p")
                local out = { o.show(tp.p:push_task_until(ngx.now() + 0.5, "mark", o.trace("near"))) }
                local far = ngx.thread.spawn(function()
                    return tp.p:push_task_until(ngx.now() + 30, "mark", o.trace("far"))
                end)
                release()
                out[2] = o.show(select(2, ngx.thread.wait(far)))
                ngx.print(table.concat(out, " "))
            }
        }
        # The same calls from a timer, which has no request start of its
        # own to count from: the caller gives ngx.now() + seconds.
        location /timer {
            content_by_lua_block {
                local dict = ngx.shared.results
                dict:delete("timer")
                assert(ngx.timer.at(0, function()
                    local tp = require "resty.threadpool"
                    local o = require "hold"
                    dict:set("timer", table.concat({
                        o.show(tp.p:push_task_until(ngx.now() + 30, "mark", o.trace("timer"))),
                        o.show(tp.p:push_task_until(ngx.now() - 1, "mark", o.trace("timer_past"))),
                        o.show(tp.p:push_tasks_until(0, { { "mark", o.trace("timer_zero") } })),
                    }, " "))
                end))
                for _ = 1, 5000 do
                    local v = dict:get("timer")
                    if v then return ngx.print(v) end
                    ngx.sleep(0.002)
                end
                ngx.print("no answer")
            }
        }
        location /args {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local pool = tp.p
                local function try(what, f)
                    local ok, err = pcall(f)
                    ngx.say(what, ": ", tostring(ok), " ", tostring(err))
                end
                for _, v in ipairs({ "1", 0 / 0, math.huge, -math.huge, -1, {} }) do
                    try("push_task_until " .. tostring(v), function()
                        local res = pool:push_task_until(v, "mark", "x")
                        return res
                    end)
                    try("push_tasks_until " .. tostring(v), function()
                        local res = pool:push_tasks_until(v, { { "mark", "x" } })
                        return res
                    end)
                end
                -- (no tail calls: they would hide the caller's line)
                try("push_task_until nil", function()
                    local res = pool:push_task_until()
                    return res
                end)
                try("milliseconds", function()
                    local res = pool:push_task_until(ngx.now() * 1000 + 450, "mark", "x")
                    return res
                end)
                try("dot push_task_until", function()
                    local res = tp.p.push_task_until(ngx.now() + 1, "x")
                    return res
                end)
                try("dot push_tasks_until", function()
                    local res = tp.p.push_tasks_until(ngx.now() + 1, {})
                    return res
                end)
                ngx.say("still: ", pool:push_task_until(ngx.now() + 30, "fine"))
            }
        }
        location /stats {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").p:stats())
                ngx.print("overloaded=", s.overloaded, " busy=", s.busy)
            }
        }
    }
"##;

fn start() -> Nginx {
    Case::new("thread_pool p threads=1;")
        .http(
            &HTTP
                .replace("HANDLER", handlers::SLEEP_HOLD_MARK)
                .replace("HOLD", handlers::HOLD_LUA),
        )
        .start()
}

fn traced(ngx: &Nginx, name: &str) -> bool {
    ngx.dir.join(format!("trace-{name}")).exists()
}

fn idle(ngx: &Nginx) {
    assert!(
        eventually(Duration::from_secs(10), || ngx
            .get("/stats")
            .text()
            .ends_with("busy=0")),
        "{}",
        ngx.get("/stats").text()
    );
}

#[test]
fn a_deadline_from_the_request_start_sees_the_time_before_the_push() {
    let ngx = start();
    // The pool is idle and has measured nothing: only the deadline's
    // having passed refuses the first two; the same number as a timeout
    // from the push runs.
    assert_eq!(
        ngx.get("/spent").text(),
        "nil,overloaded nil,overloaded mark"
    );
    for name in ["until", "batch1", "batch2"] {
        assert!(!traced(&ngx, name), "{name} ran");
    }
    assert!(traced(&ngx, "timeout"));
    // a refusal at the push, each task of the batch counted
    assert_eq!(ngx.get("/stats").text(), "overloaded=3 busy=0");
    ngx.assert_clean_log();
}

#[test]
fn the_wait_ends_at_the_deadline_not_a_timeout_after_the_push() {
    let ngx = start();
    assert_eq!(ngx.get("/left").text(), "nil,timeout by_deadline=true");
    idle(&ngx);
    ngx.assert_clean_log();
}

#[test]
fn admission_measures_an_absolute_deadline_against_the_queue() {
    let ngx = start();
    assert_eq!(ngx.get("/sleep?s=1").text(), "slept");
    assert_eq!(ngx.get("/held").text(), "nil,overloaded mark");
    assert!(!traced(&ngx, "near"), "the refused task ran");
    assert!(traced(&ngx, "far"));
    assert_eq!(ngx.get("/stats").text(), "overloaded=1 busy=0");
    ngx.assert_clean_log();
}

#[test]
fn a_timer_pushes_with_a_deadline_as_a_request_does() {
    let ngx = start();
    assert_eq!(
        ngx.get("/timer").text(),
        "mark nil,overloaded nil,overloaded"
    );
    assert!(traced(&ngx, "timer"));
    assert!(!traced(&ngx, "timer_past"));
    assert!(!traced(&ngx, "timer_zero"));
    ngx.assert_clean_log();
}

#[test]
fn a_wrong_deadline_raises_an_error_blaming_the_caller() {
    let ngx = start();
    let text = ngx.get("/args").text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 17, "{text}");
    let expected = "bad deadline: expected seconds since the epoch \
                    (ngx.req.start_time() + seconds, ngx.now() + seconds)";
    for line in &lines[..13] {
        assert!(
            line.contains(": false content_by_lua(nginx.conf:") && line.ends_with(expected),
            "{line}"
        );
    }
    assert!(
        lines[13].starts_with("milliseconds: false content_by_lua(nginx.conf:")
            && lines[13].ends_with(
                "bad deadline: more than 2147483.647 seconds ahead \
                 (seconds since the epoch expected)"
            ),
        "{}",
        lines[13]
    );
    for (line, method) in lines[14..16]
        .iter()
        .zip(["push_task_until", "push_tasks_until"])
    {
        assert!(
            line.ends_with(&format!("bad self: call it as pool:{method}(...)")),
            "{line}"
        );
    }
    assert_eq!(lines[16], "still: fine");
    // nothing was pushed by a wrong call
    assert_eq!(ngx.get("/stats").text(), "overloaded=0 busy=0");
    ngx.assert_clean_log();
}
