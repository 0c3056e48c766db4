//! `pool:post_task(...)`: fire-and-forget from any phase (log, header and
//! body filters, timers, content), never yielding; the handler's errors
//! are logged (at most once a second per thread) and counted.

mod common;

use common::*;
use std::time::Duration;

const HTTP: &str = r#"
    lua_shared_dict posted 1m;
    thread_pool_process_by_lua_block fire {
        return function(key, fail)
            if fail then error("posted boom") end
            ngx.shared.posted:incr(key, 1, 0)
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        location /phases {
            header_filter_by_lua_block {
                require("resty.threadpool").fire:post_task("header_filter")
            }
            body_filter_by_lua_block {
                if ngx.arg[2] then
                    require("resty.threadpool").fire:post_task("body_filter")
                end
            }
            log_by_lua_block {
                require("resty.threadpool").fire:post_task("log")
            }
            content_by_lua_block {
                local tp = require "resty.threadpool"
                assert(tp.fire:post_task("content"))
                assert(ngx.timer.at(0, function()
                    assert(tp.fire:post_task("timer"))
                end))
                ngx.print("ok")
            }
        }
        location /fail {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                for _ = 1, 5 do assert(tp.fire:post_task("x", true)) end
                ngx.print("posted")
            }
        }
        location /count {
            content_by_lua_block {
                local d = ngx.shared.posted
                local s = require("resty.threadpool").fire:stats()
                ngx.print(d:get("content"), d:get("timer"), d:get("header_filter"),
                          d:get("body_filter"), d:get("log"), " ", s.errors)
            }
        }
    }
"#;

#[test]
fn posted_from_every_phase_and_failures_logged_once_a_second() {
    let ngx = Case::new("thread_pool fire threads=1;").http(HTTP).start();
    for _ in 0..3 {
        assert_eq!(ngx.get("/phases").text(), "ok");
    }
    assert!(
        eventually(Duration::from_secs(5), || ngx.get("/count").text()
            == "33333 0"),
        "{}",
        ngx.get("/count").text()
    );
    assert_eq!(ngx.get("/fail").text(), "posted");
    assert!(eventually(Duration::from_secs(5), || ngx
        .get("/count")
        .text()
        .ends_with(" 5")));
    let log = ngx.error_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[warn]") && l.contains("posted task failed"))
        .collect();
    // The five failures come one after another: one line, unless the
    // scheduler of a busy machine spread them over more than a second;
    // lines at least a second apart (their times, in whole seconds, are
    // then at least as many seconds apart as lines follow the first).
    assert!(!lines.is_empty(), "{log}");
    assert!(lines.iter().all(|l| l.contains("posted boom")), "{log}");
    let span = seconds(lines[lines.len() - 1]) - seconds(lines[0]);
    assert!(lines.len() as i64 - 1 <= span, "{log}");
    ngx.assert_clean_log();
}

/// The time of an error.log line ("2026/11/27 12:00:00 [warn] ..."), in
/// seconds since the start of its month.
fn seconds(line: &str) -> i64 {
    let field = |at: std::ops::Range<usize>| -> i64 { line[at].parse().unwrap() };
    ((field(8..10) * 24 + field(11..13)) * 60 + field(14..16)) * 60 + field(17..19)
}
