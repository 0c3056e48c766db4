//! What the module writes to nginx's error log: a notice when a worker's
//! pools start and stop, and, with `error_log ... debug`, a line at each
//! step of a task's journey. All of them start with the one prefix.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn lifecycle_notices_and_the_journey_in_the_debug_log() {
    let mut ngx =
        Case::new("thread_pool dbg threads=2 max_queue=7;\nerror_log logs/debug.log debug;")
            .http(r#"thread_pool_process_by_lua dbg "return (...)";"#)
            .lua("/", r#"ngx.print(tp.dbg:push_task("hello"))"#)
            .get("/", 200, "hello")
            .run();
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
    let debug = std::fs::read_to_string(ngx.dir.join("logs/debug.log")).unwrap();
    for step in [
        "queued for thread pool \"dbg\": ",
        "started in thread pool \"dbg\" thread #",
        "finished in thread pool \"dbg\": Done, ",
        "done, resuming its caller",
        " resumed",
    ] {
        assert!(
            debug.lines().any(|l| l.contains("[debug]")
                && l.contains("ngx_threadpool: task 0x")
                && l.contains(step)),
            "no {step:?} in the debug log"
        );
    }
    // The info-level log has the notices, and no debug line.
    let log = ngx.error_log();
    assert!(
        log.lines().any(|l| l.contains("[notice]")
            && l.contains("ngx_threadpool: thread pool \"dbg\": 2 threads, queue bound 7")),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("[notice]")
            && l.contains("ngx_threadpool: thread pool \"dbg\": stopped")),
        "{log}"
    );
    assert!(!log.contains("ngx_threadpool: task "), "{log}");
}

#[test]
fn a_slow_task_gets_one_warn_line() {
    let http = r#"
    thread_pool_slow_task_log slow 100ms;
    thread_pool_process_by_lua_block slow {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        return function(s) ffi.C.usleep(s * 1e6) return s end
    }
"#;
    let ngx = Case::new("thread_pool slow threads=1;")
        .http(http)
        .lua("/", "ngx.print(tp.slow:push_task(tonumber(ngx.var.arg_s)))")
        .get("/?s=0.01", 200, "0.01")
        .get("/?s=0.5", 200, "0.5")
        .run();
    let log = ngx.error_log();
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[warn]") && l.contains("has been running for"))
        .collect();
    assert_eq!(warns.len(), 1, "{log}");
    assert!(
        warns[0].contains("ngx_threadpool: thread pool \"slow\" thread #0: task 0x"),
        "{}",
        warns[0]
    );
}

#[test]
fn slow_task_log_takes_a_time_or_off() {
    let http = "thread_pool_slow_task_log p soon;\nthread_pool_process_by_lua p \"return ...\";";
    let out = Case::new("thread_pool p threads=1;").http(http).nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "\"thread_pool_slow_task_log\" directive expects a time (100ms, 5s...) or off"
        ),
        "{err}"
    );
    let http = "thread_pool_slow_task_log p off;\nthread_pool_process_by_lua p \"return ...\";";
    assert!(Case::new("thread_pool p threads=1;")
        .http(http)
        .nginx_t()
        .status
        .success());
}
