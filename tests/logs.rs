//! What the module writes to nginx's error log: a notice when a worker's
//! pools start and stop, and, with `error_log ... debug`, a line at each
//! step of a task's journey. All of them start with the one prefix.

mod common;

use common::*;
use std::time::Duration;

const HTTP: &str = r#"
    thread_pool_process_by_lua dbg "return (...)";
    server {
        listen 127.0.0.1:$PORT;
        location / {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.print(tp.dbg:push_task("hello"))
            }
        }
    }
"#;

#[test]
fn lifecycle_notices_and_the_journey_in_the_debug_log() {
    let mut ngx = Nginx::start(
        "thread_pool dbg threads=2 max_queue=7;\nerror_log logs/debug.log debug;",
        HTTP,
    );
    assert_eq!(ngx.get("/").text(), "hello");
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
    let debug = std::fs::read_to_string(ngx.dir.join("logs/debug.log")).unwrap();
    for step in [
        "queued for thread pool \"dbg\", ",
        "started in thread pool \"dbg\" thread #",
        "finished in thread pool \"dbg\": Done, ",
        "done, resuming its caller",
        "resumed, ",
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
