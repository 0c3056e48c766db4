//! `thread_pool_status`: every worker's counters of every pool in
//! Prometheus's text format, from the module's shared memory, read by
//! Prometheus's own parser (Debian's python3-prometheus-client).

mod common;

use common::*;

const HTTP: &str = r#"
    thread_pool_process_by_lua_block st {
        return function(op)
            if op == "err" then error("failed on purpose") end
            return op
        end
    }
    thread_pool_process_by_lua quiet "return ...";
    lua_shared_dict released 1m;
    thread_pool_process_by_lua_block one {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        return function(op, key)
            if op == "hold" then
                -- until the caller releases it (10 s at most)
                for _ = 1, 2000 do
                    if ngx.shared.released:get(key) then break end
                    ffi.C.usleep(5000)
                end
            end
            return op
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        location /run {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local res = tp.st:push_task(ngx.var.arg_op)
                ngx.print(ngx.worker.id(), " ", tostring(res))
            }
        }
        # While a task holds the pool's one thread: a task that times out
        # in its queue of one, then a refusal, the timed-out task still
        # filling the queue (the thread skips it once released).
        location /timeout_and_reject {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local function wait_until(f)
                    for _ = 1, 10000 do
                        if f() then return end
                        ngx.sleep(0.001)
                    end
                end
                local function stats() return tp.one:stats() end
                -- the last round's skipped task is gone
                wait_until(function() return stats().busy + stats().queued == 0 end)
                local key = "release" .. ngx.var.connection
                local holder = ngx.thread.spawn(function() return tp.one:push_task("hold", key) end)
                wait_until(function() return stats().busy > 0 end)
                -- a timeout that is no deadline: queued whatever the
                -- wait, which push_task_timeout's admission would refuse
                tp.one:set_timeout(0.05)
                local _, terr = tp.one:push_task("ok")
                tp.one:set_timeout(60)
                local _, rerr = tp.one:push_task("ok")
                ngx.shared.released:set(key, true)
                ngx.thread.wait(holder)
                ngx.print(ngx.worker.id(), " ", terr, " ", rerr)
            }
        }
        location = /metrics { thread_pool_status; }
    }
"#;

#[test]
fn every_worker_and_pool_in_prometheus_text() {
    let ngx = Case::new("thread_pool st threads=2;\nthread_pool quiet threads=1;\nthread_pool one threads=1 max_queue=1;").http(HTTP).workers(2).start();
    // Known work, tallied by the worker that did it.
    let mut ok = [0u32; 2];
    let mut errors = [0u32; 2];
    for i in 0..40 {
        let op = if i % 4 == 0 { "err" } else { "ok" };
        let out = ngx.get(&format!("/run?op={op}")).text();
        let (worker, res) = out.split_once(' ').unwrap();
        let w: usize = worker.parse().unwrap();
        if op == "err" {
            assert_eq!(res, "nil");
            errors[w] += 1;
        } else {
            assert_eq!(res, "ok");
            ok[w] += 1;
        }
    }
    let mut rounds = [0u32; 2];
    for _ in 0..4 {
        let out = ngx.get("/timeout_and_reject").text();
        let mut parts = out.splitn(3, ' ');
        let w: usize = parts.next().unwrap().parse().unwrap();
        assert_eq!(
            parts.collect::<Vec<_>>(),
            ["timeout", "queue full"],
            "{out}"
        );
        rounds[w] += 1;
    }
    // the threads skip the timed-out tasks before the scrape
    let idle = |text: &str| {
        let m = prometheus(text);
        (0..2).all(|w| {
            ["busy_threads", "queued_tasks"].iter().all(|name| {
                m.get(&format!("ngx_threadpool_{name}{{pool=one,worker={w}}}")) == Some(&0.0)
            })
        })
    };
    assert!(
        eventually(std::time::Duration::from_secs(30), || idle(
            &ngx.get("/metrics").text()
        )),
        "{}",
        ngx.get("/metrics").text()
    );
    let resp = ngx.get("/metrics");
    assert_eq!(resp.status, 200);
    let text = resp.text();
    assert!(
        text.contains("# TYPE ngx_threadpool_tasks_pushed_total counter"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE ngx_threadpool_run_seconds histogram"),
        "{text}"
    );
    let m = prometheus(&text);
    let get = |name: &str, pool: &str, w: usize| {
        m.get(&format!("{name}{{pool={pool},worker={w}}}")).copied()
    };
    for w in 0..2 {
        let pushed = f64::from(ok[w] + errors[w]);
        assert_eq!(get("ngx_threadpool_threads", "st", w), Some(2.0));
        assert_eq!(get("ngx_threadpool_threads", "quiet", w), Some(1.0));
        assert_eq!(
            get("ngx_threadpool_tasks_pushed_total", "st", w),
            Some(pushed)
        );
        assert_eq!(
            get("ngx_threadpool_tasks_completed_total", "st", w),
            Some(f64::from(ok[w]))
        );
        assert_eq!(
            get("ngx_threadpool_task_errors_total", "st", w),
            Some(f64::from(errors[w]))
        );
        assert_eq!(
            get("ngx_threadpool_tasks_rejected_total", "st", w),
            Some(0.0)
        );
        assert_eq!(
            get("ngx_threadpool_tasks_pushed_total", "quiet", w),
            Some(0.0)
        );
        assert_eq!(get("ngx_threadpool_busy_threads", "st", w), Some(0.0));
        assert_eq!(
            get("ngx_threadpool_run_seconds_count", "st", w),
            Some(pushed)
        );
        assert_eq!(
            get("ngx_threadpool_queue_wait_seconds_count", "st", w),
            Some(pushed)
        );
        let r = f64::from(rounds[w]);
        assert_eq!(
            get("ngx_threadpool_tasks_timed_out_total", "one", w),
            Some(r)
        );
        assert_eq!(
            get("ngx_threadpool_tasks_rejected_total", "one", w),
            Some(r)
        );
        // per round: the holder, which completes, and the timed-out task,
        // which the thread skips
        assert_eq!(
            get("ngx_threadpool_tasks_pushed_total", "one", w),
            Some(2.0 * r)
        );
        assert_eq!(
            get("ngx_threadpool_tasks_completed_total", "one", w),
            Some(r)
        );
        assert_eq!(
            get("ngx_threadpool_tasks_cancelled_total", "one", w),
            Some(r)
        );
        assert_eq!(get("ngx_threadpool_queued_tasks", "one", w), Some(0.0));
        let inf = m.get(&format!(
            "ngx_threadpool_run_seconds_bucket{{le=+Inf,pool=st,worker={w}}}"
        ));
        assert_eq!(inf.copied(), Some(pushed));
    }
    ngx.assert_clean_log();
}

#[test]
fn without_pools_an_empty_exposition() {
    Case::new("")
        .server("location = /metrics { thread_pool_status; }")
        .get("/metrics", 200, "")
        .run();
}
