//! `tp.NAME:stats()`: this worker's counters and timings of a pool, after
//! a known mix of tasks: returned, failed, refused (queue full), timed
//! out and abandoned by their request; the wait of a batch's task counts
//! the tasks before it. The timings are checked by what holds on a busy
//! machine: a task that sleeps 0.2 s ran (or waited) at least that long.

mod common;

use common::*;
use std::time::Duration;

/// The pool of these tests, declared by `main`, and its pages.
fn start(main: &str) -> Nginx {
    let handler = r#"
    thread_pool_process_by_lua_block st {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        return function(op, arg)
            if op == "sleep" then
                ffi.C.usleep(arg * 1e6)
            elseif op == "err" then
                error("failed on purpose")
            end
            return op
        end
    }
"#;
    let reject = r#"
        local a = ngx.thread.spawn(function() return tp.st:push_task("sleep", 0.3) end)
        -- the thread takes a: the queue's one slot is free
        for _ = 1, 10000 do
            if tp.st:stats().busy > 0 then break end
            ngx.sleep(0.001)
        end
        local b = ngx.thread.spawn(function() return tp.st:push_task("sleep", 0.01) end)
        local _, err = tp.st:push_task("ok")
        ngx.thread.wait(a)
        ngx.thread.wait(b)
        ngx.print(err)
"#;
    let abandon = r#"
        ngx.thread.spawn(function() return tp.st:push_task("sleep", 0.2) end)
        ngx.sleep(0.01)
        ngx.exit(200)
"#;
    let json = r#"
        local cjson = require "cjson"
        local ok, json = pcall(cjson.encode, assert(tp.st:stats()))
        if not ok then
            return ngx.print(json)
        end
        local s = cjson.decode(json)
        local last = s.run.buckets[#s.run.buckets]
        ngx.print(#s.run.buckets, " ", s.wait.buckets[1].le, " ", last.le, " ",
                  tonumber(last.le) == math.huge, " ", s.pushed)
"#;
    let stats = r#"
        local s = assert(tp.st:stats())
        local out = {}
        for _, k in ipairs({ "threads", "busy", "queued", "in_flight", "pushed",
                             "completed", "errors", "rejected", "timed_out",
                             "abandoned", "cancelled", "expired" }) do
            out[#out + 1] = k .. "=" .. s[k]
        end
        for _, h in ipairs({ "wait", "run" }) do
            out[#out + 1] = h .. ".count=" .. s[h].count
            local le = 0 -- up to 0.1 s (the fifth bucket's bound)
            for i = 1, 5 do le = le + s[h].buckets[i].count end
            out[#out + 1] = h .. ".le0.1=" .. le
            out[#out + 1] = h .. ".gt0.1=" .. s[h].count - le
            out[#out + 1] = h .. ".sum=" .. s[h].sum
        end
        ngx.print(table.concat(out, " "))
"#;
    Case::new(main)
        .http(handler)
        .lua(
            "/run",
            "ngx.print(tostring(tp.st:push_task(ngx.var.arg_op)))",
        )
        .lua(
            "/timeout",
            r#"ngx.print(select(2, tp.st:push_task_timeout(0.05, "sleep", 0.3)))"#,
        )
        .lua("/reject", reject)
        .lua(
            "/batch",
            r#"local res = assert(tp.st:push_tasks({ { "sleep", 0.2 }, { "ok" } }))
               ngx.print(res[2][2])"#,
        )
        .lua("/abandon", abandon)
        .lua(
            "/idle",
            "local s = tp.st:stats() ngx.print(s.busy + s.queued == 0)",
        )
        .lua("/json", json)
        .lua("/stats", stats)
        .start()
}

/// The fields of /stats by name.
fn stats(ngx: &Nginx) -> std::collections::HashMap<String, f64> {
    ngx.get("/stats")
        .text()
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Waits until no task of the pool is queued or running.
fn idle(ngx: &Nginx) {
    assert!(
        eventually(Duration::from_secs(30), || ngx.get("/idle").text()
            == "true"),
        "{}",
        ngx.get("/stats").text()
    );
}

#[test]
fn counters_after_a_known_workload() {
    let ngx = start("thread_pool st threads=1 max_queue=1;");
    for _ in 0..5 {
        assert_eq!(ngx.get("/run?op=ok").text(), "ok");
    }
    for _ in 0..2 {
        assert_eq!(ngx.get("/run?op=err").text(), "nil");
    }
    assert_eq!(ngx.get("/timeout").text(), "timeout");
    // the timed-out task may still hold the thread
    idle(&ngx);
    assert_eq!(ngx.get("/reject").text(), "queue full");
    assert_eq!(ngx.get("/abandon").status, 200);
    idle(&ngx);
    assert_eq!(ngx.get("/run?op=ok").text(), "ok");
    let s = stats(&ngx);
    let at = |k: &str| s[k];
    // The timed-out task and the abandoned one run, or are skipped if the
    // thread took them only after their caller gave up (cancelled): on a
    // busy machine either may be.
    let skipped = at("cancelled") + at("expired");
    assert!(skipped <= 2.0, "{s:?}");
    for (k, want) in [
        ("threads", 1.0),
        ("busy", 0.0),
        ("queued", 0.0),
        ("in_flight", 0.0),
        ("pushed", 12.0),
        ("completed", 10.0 - skipped),
        ("errors", 2.0),
        ("rejected", 1.0),
        ("timed_out", 1.0),
        ("abandoned", 1.0),
        ("wait.count", 12.0 - skipped),
        ("run.count", 12.0 - skipped),
    ] {
        assert_eq!(at(k), want, "{k}: {s:?}");
    }
    // Three sleepers of 0.2-0.3 s (one of the 0.3 s ones always runs),
    // less those skipped, ran past 0.1 s; seven tasks return at once, and
    // one of them at least did not take 0.1 s.
    assert!(at("run.gt0.1") >= 3.0 - skipped, "{s:?}");
    assert!(at("run.le0.1") >= 1.0, "{s:?}");
    assert!(at("run.sum") >= 0.3 + 0.01, "{s:?}");
    assert!(at("wait.sum") > 0.0, "{s:?}");
    ngx.assert_clean_log();
}

/// With cjson's defaults, which refuse infinities: the last bucket's bound
/// is "+Inf", which tonumber() reads as math.huge.
#[test]
fn stats_encode_as_json() {
    let ngx = start("thread_pool st threads=1;");
    assert_eq!(ngx.get("/run?op=ok").text(), "ok");
    assert_eq!(ngx.get("/json").text(), "8 1e-05 +Inf true 1");
    ngx.assert_clean_log();
}

/// A thread that runs a batch's tasks in turn: the second waited for the
/// first (0.2 s, or more on a busy machine), and says so in `wait`.
#[test]
fn a_batch_task_waits_for_the_tasks_before_it() {
    let ngx = start("thread_pool st threads=1;");
    assert_eq!(ngx.get("/batch").text(), "ok");
    let s = stats(&ngx);
    for (k, want) in [("wait.count", 2.0), ("run.count", 2.0)] {
        assert_eq!(s[k], want, "{k}: {s:?}");
    }
    assert!(s["wait.gt0.1"] >= 1.0, "{s:?}");
    assert!(s["wait.sum"] >= 0.2, "{s:?}");
    assert!(s["run.gt0.1"] >= 1.0, "{s:?}");
    ngx.assert_clean_log();
}

/// `stats()` and `thread_pool_status` show each number of the module's one
/// table (src/stats/counters.rs) under its name, and nothing else: the Lua
/// keys (with the shim's `in_flight` and each thread's update version) and
/// kinds, and Prometheus's families and their series, a shadow's and each
/// thread's update version among them.
#[test]
fn stats_and_the_status_page_show_the_table() {
    use ngx_threadpool::stats::{Kind, Labels, STATS};
    let ngx = Case::new("thread_pool p threads=1;\nthread_pool q threads=1;")
        .http(
            r#"thread_pool_process_by_lua p "return ...";
               thread_pool_process_by_lua q "return ...";
               thread_pool_shadow p q;"#,
        )
        .lua(
            "/keys",
            r#"local out = {}
               for k, v in pairs(assert(tp.p:stats())) do
                   out[#out + 1] = k .. "=" .. (type(v) ~= "table" and type(v)
                                                or v.buckets and #v.buckets
                                                or "array of " .. #v)
               end
               table.sort(out)
               ngx.print(table.concat(out, " "))"#,
        )
        .server("location = /metrics { thread_pool_status; }")
        .start();
    let mut want: Vec<String> = STATS
        .iter()
        .map(|s| match s.kind {
            Kind::Histogram => format!("{}=8", s.name),
            _ => format!("{}=number", s.name),
        })
        .chain(["in_flight=number", "thread_versions=array of 1"].map(String::from))
        .collect();
    want.sort();
    assert_eq!(ngx.get("/keys").text(), want.join(" "));

    let text = ngx.get("/metrics").text();
    let families: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
        .collect();
    let want: Vec<(&str, &str)> = STATS
        .iter()
        .map(|s| (s.metric, s.kind.prometheus()))
        .chain([(ngx_threadpool::api::status::THREAD_VERSION_METRIC, "gauge")])
        .collect();
    assert_eq!(families, want, "{text}");
    let thread = format!(
        "{}{{pool=\"q\",worker=\"0\",thread=\"0\"}} 0",
        ngx_threadpool::api::status::THREAD_VERSION_METRIC
    );
    assert!(text.contains(&thread), "no {thread}: {text}");
    for s in STATS {
        let series = match s.kind {
            Kind::Histogram => format!("{}_count{{", s.metric),
            _ => format!("{}{{", s.metric),
        };
        let labels = match s.labels {
            Labels::Pool => "pool=\"p\",worker=\"0\"",
            Labels::Shadow => "pool=\"p\",shadow=\"q\",worker=\"0\"",
        };
        assert!(
            text.lines()
                .any(|l| l.starts_with(&series) && l.contains(labels)),
            "no {series}{labels}}}: {text}"
        );
    }
    ngx.assert_clean_log();
}
