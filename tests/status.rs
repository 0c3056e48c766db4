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
    thread_pool_process_by_lua_block one {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        return function(op, arg)
            if op == "sleep" then ffi.C.usleep(arg * 1e6) end
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
        # a timeout, then a refusal while the timed-out task holds the
        # pool's one thread and another fills its queue of one
        location /timeout_and_reject {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local _, terr = tp.one:push_task_timeout(0.05, "sleep", 0.3)
                local queued = ngx.thread.spawn(function() return tp.one:push_task("ok") end)
                local _, rerr = tp.one:push_task("ok")
                ngx.thread.wait(queued)
                ngx.print(ngx.worker.id(), " ", terr, " ", rerr)
            }
        }
        location = /metrics { thread_pool_status; }
    }
"#;

#[test]
fn every_worker_and_pool_in_prometheus_text() {
    let ngx = Nginx::start_with(
        2,
        "thread_pool st threads=2;\nthread_pool quiet threads=1;\nthread_pool one threads=1 max_queue=1;",
        HTTP,
        &[],
    );
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
    // the timed-out tasks finish before the scrape
    std::thread::sleep(std::time::Duration::from_millis(400));
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
        // per round: the sleeper and the queued task
        assert_eq!(
            get("ngx_threadpool_tasks_pushed_total", "one", w),
            Some(2.0 * r)
        );
        assert_eq!(
            get("ngx_threadpool_tasks_completed_total", "one", w),
            Some(2.0 * r)
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
    let ngx = Nginx::start(
        "",
        r#"server {
            listen 127.0.0.1:$PORT;
            location = /metrics { thread_pool_status; }
        }"#,
    );
    let r = ngx.get("/metrics");
    assert_eq!((r.status, r.text()), (200, String::new()));
    ngx.assert_clean_log();
}
