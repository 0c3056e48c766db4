//! Deadline-aware admission: a push that carries a deadline
//! (`push_task_timeout`, `push_tasks_timeout`, or a pool's
//! `thread_pool_deadline`) and that the pool cannot finish before it, by
//! the tasks ahead, its threads and its measured run time, is refused at
//! once with "overloaded"; a queued task whose deadline came too close
//! while it waited is never started; pushes without a deadline queue as
//! before; while the queue stands, a push is admitted only for a wait of
//! about one run; and the counters say which happened.
//!
//! Deterministic: the pool has one thread, held by a task that waits for
//! a file the location creates; the run time the pool measures is set
//! first by a task that sleeps a known time (a sleep only ever lasts
//! longer, which makes every decision below only surer). A task that runs
//! leaves a file behind: a refused or expired one must leave none.

mod common;

use common::*;
use std::collections::HashMap;
use std::time::Duration;

const HTTP: &str = r##"
    thread_pool_deadline dl 100ms;
    thread_pool_process_by_lua_block ov { HANDLER }
    thread_pool_process_by_lua_block dl { HANDLER }
    init_by_lua_block { HOLD }
    server {
        listen 127.0.0.1:$PORT;
        location /sleep {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local pool = tp[ngx.var.arg_pool or "ov"]
                ngx.print(select(2, pool:push_task("sleep", tonumber(ngx.var.arg_s))) or "slept")
            }
        }
        # While the thread is held: refusals with a deadline, and pushes
        # that are queued (no deadline, or one far enough).
        location /refuse {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local release = o.hold("ov")
                local out = {}
                out[1] = o.show(tp.ov:push_task_timeout(0.1, "mark", o.trace("one")))
                out[2] = o.show(tp.ov:push_tasks_timeout(0.1, {
                    { "mark", o.trace("batch1") }, { "mark", o.trace("batch2") } }))
                local plain = ngx.thread.spawn(function()
                    return tp.ov:push_task("mark", o.trace("plain"))
                end)
                local roomy = ngx.thread.spawn(function()
                    return tp.ov:push_task_timeout(30, "mark", o.trace("roomy"))
                end)
                release()
                out[3] = o.show(select(2, ngx.thread.wait(plain)))
                out[4] = o.show(select(2, ngx.thread.wait(roomy)))
                ngx.print(table.concat(out, " "))
            }
        }
        # The pool's own deadline makes push_task's.
        location /default {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local release = o.hold("dl")
                local res = o.show(tp.dl:push_task("mark", o.trace("default")))
                release()
                ngx.print(res)
            }
        }
        # The thread is held past the latest start of a queued task that
        # still has time left, with a task behind it: it is never started,
        # its caller hears why before its own timeout. With `more`, a known
        # mix around it.
        location /expire {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local release = o.hold("ov")
                local out = {}
                local s = tp.ov:stats()
                out[#out + 1] = "wait=" .. tostring(s.expected_wait == s.run_estimate
                                                    and s.expected_wait > 0)
                local late = ngx.thread.spawn(function()
                    return tp.ov:push_task_timeout(4, "mark", o.trace("late"))
                end)
                local behind = { ngx.thread.spawn(function()
                    return tp.ov:push_task("mark", o.trace("behind"))
                end) }
                if ngx.var.arg_more then
                    out[#out + 1] = o.show(tp.ov:push_task_timeout(0.1, "mark", o.trace("x")))
                    out[#out + 1] = o.show(tp.ov:push_tasks_timeout(0.1, {
                        { "mark", o.trace("y") }, { "mark", o.trace("z") } }))
                    behind[2] = ngx.thread.spawn(function()
                        return tp.ov:push_task("mark", o.trace("behind2"))
                    end)
                    out[#out + 1] = o.show(tp.ov:push_task("mark", o.trace("full")))
                end
                ngx.sleep(3.1)
                release()
                out[#out + 1] = o.show(select(2, ngx.thread.wait(late)))
                for _, t in ipairs(behind) do
                    out[#out + 1] = o.show(select(2, ngx.thread.wait(t)))
                end
                ngx.print(table.concat(out, " "))
            }
        }
        # The queue stands: one task after another taken after a wait, for
        # longer than an interval (a sleep of 0.15 s, then a second hold).
        # While it stands, a push with all the time it needs is refused
        # when it would wait more than a run; once tasks have been taken
        # at once for an interval, it is admitted again.
        location /standing {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local o = require "hold"
                local function queue(...)
                    local args = { ... }
                    return ngx.thread.spawn(function()
                        return tp.ov:push_task(unpack(args))
                    end)
                end
                local function limit(want)
                    for _ = 1, want and 10000 or 400 do
                        local s = tp.ov:stats()
                        if (s.wait_limit > 0) == want then
                            return s.wait_limit == s.run_estimate
                        end
                        -- short waits, for an interval, end the standing: few
                        -- tasks in it, each of which a slow wake-up could spoil
                        if not want then tp.ov:push_task("sleep", 0.05) end
                        ngx.sleep(0.001)
                    end
                    return "never"
                end
                local release = o.hold("ov")
                local go2 = o.trace("go2")
                local queued = { queue("sleep", 0.15), queue("hold", go2),
                                 queue("mark", o.trace("behind")) }
                ngx.sleep(0.01)
                release()
                local out = { "limit=" .. tostring(limit(true)) }
                local refused = ngx.thread.spawn(function()
                    return tp.ov:push_task_timeout(60, "mark", o.trace("refused"))
                end)
                assert(io.open(go2, "w")):close()
                for _, t in ipairs(queued) do assert(ngx.thread.wait(t)) end
                out[#out + 1] = o.show(select(2, ngx.thread.wait(refused)))
                out[#out + 1] = "limit=" .. tostring(limit(false))
                release = o.hold("ov")
                local behind = queue("mark", o.trace("behind2"))
                local admitted = ngx.thread.spawn(function()
                    return tp.ov:push_task_timeout(60, "mark", o.trace("admitted"))
                end)
                release()
                assert(ngx.thread.wait(behind))
                out[#out + 1] = o.show(select(2, ngx.thread.wait(admitted)))
                ngx.print(table.concat(out, " "))
            }
        }
        location /stats {
            content_by_lua_block {
                local s = assert(require("resty.threadpool")[ngx.var.arg_pool]:stats())
                local out = {}
                for _, k in ipairs({ "busy", "queued", "pushed", "completed", "errors",
                                     "rejected", "overloaded", "expired", "timed_out",
                                     "cancelled", "expected_wait" }) do
                    out[#out + 1] = k .. "=" .. s[k]
                end
                out[#out + 1] = "wait.count=" .. s.wait.count
                out[#out + 1] = "run.count=" .. s.run.count
                out[#out + 1] = "measured=" .. tostring(s.run_estimate > 0)
                ngx.print(table.concat(out, " "))
            }
        }
        location = /metrics { thread_pool_status; }
    }
"##;

fn start(max_queue: usize) -> Nginx {
    let main =
        format!("thread_pool ov threads=1 max_queue={max_queue};\nthread_pool dl threads=1;");
    Case::new(&main)
        .http(
            &HTTP
                .replace("HANDLER", handlers::SLEEP_HOLD_MARK)
                .replace("HOLD", handlers::HOLD_LUA),
        )
        .start()
}

fn stats(ngx: &Nginx) -> HashMap<String, String> {
    pool_stats(ngx, "ov")
}

fn pool_stats(ngx: &Nginx, pool: &str) -> HashMap<String, String> {
    ngx.get(&format!("/stats?pool={pool}"))
        .text()
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn traced(ngx: &Nginx, name: &str) -> bool {
    ngx.dir.join(format!("trace-{name}")).exists()
}

/// The pool measures a run of at least 1 s.
fn measure(ngx: &Nginx, pool: &str) {
    assert_eq!(ngx.get(&format!("/sleep?pool={pool}&s=1")).text(), "slept");
}

#[test]
fn a_push_that_cannot_finish_before_its_deadline_is_refused() {
    let ngx = start(65536);
    measure(&ngx, "ov");
    // Ahead of each: the held task, 1 s or more by the measured run
    // time, then its own second: not within 0.1 s. Without a deadline,
    // or with 30 s, the push is queued and runs once the thread is free.
    assert_eq!(
        ngx.get("/refuse").text(),
        "nil,overloaded nil,overloaded mark mark"
    );
    for name in ["one", "batch1", "batch2"] {
        assert!(!traced(&ngx, name), "{name} ran");
    }
    for name in ["plain", "roomy"] {
        assert!(traced(&ngx, name), "{name} did not run");
    }
    let s = stats(&ngx);
    for (k, want) in [
        ("overloaded", "3"),
        ("rejected", "0"),
        ("expired", "0"),
        ("pushed", "4"),
        ("completed", "4"),
    ] {
        assert_eq!(s[k], want, "{k}: {s:?}");
    }
    ngx.assert_clean_log();
}

#[test]
fn a_pool_deadline_is_push_tasks_own() {
    let ngx = start(65536);
    // its timeout too: the caller stops waiting after 100 ms
    assert_eq!(ngx.get("/sleep?pool=dl&s=1").text(), "timeout");
    // which ran on, and set the pool's run time, once done
    assert!(
        eventually(Duration::from_secs(10), || pool_stats(&ngx, "dl")["busy"]
            == "0"),
        "{:?}",
        pool_stats(&ngx, "dl")
    );
    assert_eq!(ngx.get("/default").text(), "nil,overloaded");
    assert!(!traced(&ngx, "default"));
    ngx.assert_clean_log();
}

#[test]
fn a_task_whose_deadline_came_in_the_queue_never_runs() {
    let ngx = start(65536);
    measure(&ngx, "ov");
    // Queued with 4 s, 1 s or more ahead and 1 s or more to run; started
    // no sooner than 3.1 s later, it could not end in time, and a task
    // waits behind it.
    assert_eq!(ngx.get("/expire").text(), "wait=true nil,overloaded mark");
    assert!(!traced(&ngx, "late"), "the late task ran");
    assert!(traced(&ngx, "behind"));
    let s = stats(&ngx);
    for (k, want) in [
        ("expired", "1"),
        ("overloaded", "0"),
        ("cancelled", "0"),
        ("timed_out", "0"),
        ("pushed", "4"),
        ("completed", "3"),
    ] {
        assert_eq!(s[k], want, "{k}: {s:?}");
    }
    ngx.assert_clean_log();
}

#[test]
fn a_standing_queue_admits_a_wait_of_one_run() {
    let ngx = start(65536);
    measure(&ngx, "ov");
    // Standing, the hold running and one task queued: the push would
    // wait two runs (2 s or more), within its 60 s but not one run. Not
    // standing, the same queue admits it: it waits, then runs.
    assert_eq!(
        ngx.get("/standing").text(),
        "limit=true nil,overloaded limit=false mark"
    );
    assert!(!traced(&ngx, "refused"), "the refused task ran");
    assert!(traced(&ngx, "admitted"));
    assert_eq!(stats(&ngx)["overloaded"], "1");
    ngx.assert_clean_log();
}

/// Accepted, refused (overloaded, a batch's tasks counted each, queue
/// full) and expired, each counted exactly, in stats() and in the
/// Prometheus exposition; the expected wait is one run time while the
/// thread is held, 0 once the pool is idle.
#[test]
fn counters_under_a_known_mix() {
    let ngx = start(3);
    measure(&ngx, "ov");
    assert_eq!(
        ngx.get("/expire?more=1").text(),
        "wait=true nil,overloaded nil,overloaded nil,queue full nil,overloaded mark mark"
    );
    assert!(
        eventually(Duration::from_secs(10), || stats(&ngx)["busy"] == "0"),
        "{:?}",
        stats(&ngx)
    );
    for name in ["late", "x", "y", "z", "full"] {
        assert!(!traced(&ngx, name), "{name} ran");
    }
    let s = stats(&ngx);
    // run: the measure, the hold, behind, behind2
    for (k, want) in [
        ("busy", "0"),
        ("queued", "0"),
        ("pushed", "5"),
        ("completed", "4"),
        ("errors", "0"),
        ("rejected", "1"),
        ("overloaded", "3"),
        ("expired", "1"),
        ("timed_out", "0"),
        ("cancelled", "0"),
        ("expected_wait", "0"),
        ("wait.count", "4"),
        ("run.count", "4"),
        ("measured", "true"),
    ] {
        assert_eq!(s[k], want, "{k}: {s:?}");
    }
    let m = prometheus(&ngx.get("/metrics").text());
    for (name, want) in [
        ("tasks_overloaded_total", 3.0),
        ("tasks_expired_total", 1.0),
        ("tasks_rejected_total", 1.0),
        ("expected_wait_seconds", 0.0),
        ("wait_limit_seconds", 0.0),
    ] {
        let key = format!("ngx_threadpool_{name}{{pool=ov,worker=0}}");
        assert_eq!(m.get(&key), Some(&want), "{key}: {m:?}");
    }
    let estimate = m["ngx_threadpool_run_estimate_seconds{pool=ov,worker=0}"];
    assert!(estimate > 0.0, "{m:?}");
    ngx.assert_clean_log();
}
