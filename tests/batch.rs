//! `pool:push_tasks(list)` and `push_tasks_timeout`: many tasks queued
//! with one call and one yield; each result in the order of the list, as
//! `{ true, values... }` or `{ false, err }`; nothing queued on a full
//! queue or a bad value.

mod common;

use common::*;

const HTTP: &str = r#"
    lua_shared_dict who 1m;
    thread_pool_process_by_lua_block work {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        -- this thread's Lua state: a table's address is its own
        local me = (tostring({}):gsub("%W", ""))
        return function(op, x)
            if op == "err" then error("boom " .. tostring(x), 0) end
            if op == "who" then
                -- until both threads run a task (10 s at most)
                local seen = ngx.shared.who
                seen:set(me, true)
                for _ = 1, 2000 do
                    if #seen:get_keys() >= 2 then break end
                    ffi.C.usleep(5000)
                end
                return me
            end
            if op == "multi" then return 1, nil, 3 end
            if op == "sleep" then ffi.C.usleep(x * 1e6) return "slept" end
            if op == "square" then return x * x end
            return op
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;
        location /run {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local list = assert(loadstring("return " .. ngx.unescape_uri(ngx.var.arg_list)))()
                local res, err
                if ngx.var.arg_timeout then
                    res, err = tp[ngx.var.arg_pool or "work"]:push_tasks_timeout(
                        tonumber(ngx.var.arg_timeout), list)
                else
                    res, err = tp[ngx.var.arg_pool or "work"]:push_tasks(list)
                end
                if not res then
                    ngx.print("nil ", err)
                    return
                end
                local out = {}
                for i, r in ipairs(res) do
                    local vals = {}
                    for k = 1, r.n do vals[k] = tostring(r[k]) end
                    out[i] = "{" .. table.concat(vals, ",") .. "}"
                end
                ngx.print(#res, " ", table.concat(out, " "))
            }
        }
        location /squares {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local n = tonumber(ngx.var.arg_n)
                local list = {}
                for i = 1, n do list[i] = { "square", i } end
                local res = assert(tp.work:push_tasks(list))
                for i = 1, n do
                    assert(res[i][1] == true and res[i][2] == i * i, i)
                end
                ngx.print(#res)
            }
        }
        location /stats {
            content_by_lua_block {
                local s = require("resty.threadpool")[ngx.var.arg_pool]:stats()
                ngx.print(s.pushed, " ", s.rejected, " ", s.timed_out, " ", s.completed, " ",
                          s.cancelled + s.expired)
            }
        }
        location /phase {
            content_by_lua_block { ngx.print("x") }
            log_by_lua_block {
                local ok, err = pcall(function()
                    return require("resty.threadpool").work:push_tasks({ { "a" } })
                end)
                ngx.log(ngx.WARN, "BATCH IN LOG: ", err)
            }
        }
    }
"#;

fn start() -> Nginx {
    Case::new(
        "thread_pool work threads=2;\nthread_pool small threads=1 max_queue=2;\n\
         error_log logs/debug.log debug;",
    )
    .http(&format!(
        "{HTTP}\nthread_pool_process_by_lua small \"return ...\";"
    ))
    .start()
}

fn run(ngx: &Nginx, list: &str, extra: &str) -> String {
    let q: String = list
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    ngx.get(&format!("/run?list={q}{extra}")).text()
}

#[test]
fn results_in_order_with_errors_and_holes() {
    let ngx = start();
    assert_eq!(
        run(
            &ngx,
            r#"{ {"a"}, {"err", 2}, {"multi"}, {"sleep", 0.05}, {"b"}, {"err"} }"#,
            ""
        ),
        "6 {true,a} {false,boom 2} {true,1,nil,3} {true,slept} {true,b} {false,boom nil}"
    );
    assert_eq!(run(&ngx, "{}", ""), "0 ");
    // more results than the event loop reads at once (codec::Entries)
    assert_eq!(ngx.get("/squares?n=3000").text(), "3000");
    // A batch is one record and one completion: the caller is resumed
    // once for the whole batch.
    let debug = std::fs::read_to_string(ngx.dir.join("logs/debug.log")).unwrap();
    let lines = |what: &str| debug.lines().filter(|l| l.contains(what)).count();
    assert_eq!(lines("queued for thread pool \"work\": 3000 tasks"), 1);
    assert_eq!(lines("queued for thread pool \"work\": 6 tasks"), 1);
    assert_eq!(lines("done, resuming its caller"), 2);
    ngx.assert_clean_log();
}

#[test]
fn nothing_queued_on_a_full_queue_or_a_bad_value() {
    let ngx = start();
    // max_queue=2: three tasks do not fit, none is queued
    assert_eq!(
        run(&ngx, r#"{ {"a"}, {"b"}, {"c"} }"#, "&pool=small"),
        "nil queue full"
    );
    assert_eq!(ngx.get("/stats?pool=small").text(), "0 3 0 0 0");
    assert_eq!(
        run(&ngx, r#"{ {"a"}, {"b"} }"#, "&pool=small"),
        "2 {true,a} {true,b}"
    );
    assert_eq!(
        run(&ngx, r#"{ {"a"}, {"b", print} }"#, ""),
        "nil task 2: cannot pass function in argument #2"
    );
    assert_eq!(
        run(&ngx, r#"{ {"a"}, "b" }"#, ""),
        "nil task 2: expected a table of arguments"
    );
    assert_eq!(ngx.get("/stats?pool=work").text(), "0 0 0 0 0");
    ngx.assert_clean_log();
}

#[test]
fn a_timeout_lets_go_of_the_whole_batch() {
    let ngx = start();
    // both threads sleep (or, on a busy machine, one does and the other
    // has not claimed a task yet); "b" waits in the queue
    assert_eq!(
        run(
            &ngx,
            r#"{ {"sleep", 0.3}, {"sleep", 0.3}, {"b"} }"#,
            "&timeout=0.05"
        ),
        "nil timeout"
    );
    // the pool keeps working, the late results are dropped, and the tasks
    // no thread had started when the caller gave up are not run ("b" at
    // least)
    assert_eq!(run(&ngx, r#"{ {"c"} }"#, ""), "1 {true,c}");
    // pushed, rejected, timed out, completed, skipped, once the sleeps are
    // done: every task either completed or was skipped
    let stats = || {
        let text = ngx.get("/stats?pool=work").text();
        let v: Vec<u64> = text.split(' ').map(|w| w.parse().unwrap()).collect();
        (text, v)
    };
    let mut last = (String::new(), Vec::new());
    assert!(
        eventually(std::time::Duration::from_secs(10), || {
            last = stats();
            last.1[..3] == [4, 0, 1] && last.1[3] + last.1[4] == 4
        }),
        "{}",
        last.0
    );
    let skipped = last.1[4];
    assert!(skipped >= 1, "{}", last.0);
    let debug = std::fs::read_to_string(ngx.dir.join("logs/debug.log")).unwrap();
    assert_eq!(
        debug.matches("skipped: its caller gave up").count() as u64,
        skipped,
        "{debug}"
    );
    ngx.assert_clean_log();
}

#[test]
fn only_where_a_coroutine_may_yield() {
    let ngx = start();
    assert_eq!(ngx.get("/phase").text(), "x");
    assert!(eventually(std::time::Duration::from_secs(5), || ngx
        .error_log()
        .contains("BATCH IN LOG: ")));
    assert!(
        ngx.error_log()
            .contains("API disabled in the context of log"),
        "{}",
        ngx.error_log()
    );
}

/// The tasks of a batch of slow ones spread over the pool's threads: a
/// thread claims a share of those left, down to one (src/handoff/job.rs), so the
/// other thread takes its share while the first one runs. Each task waits
/// until both threads run one, so a thread the scheduler of a busy
/// machine wakes late still finds tasks left (which of them runs the
/// rest is the scheduler's choice).
#[test]
fn a_batch_of_slow_tasks_spreads_over_the_threads() {
    let ngx = start();
    let list = (0..8).map(|_| r#"{"who"}"#).collect::<Vec<_>>();
    let out = run(&ngx, &format!("{{ {} }}", list.join(", ")), "");
    let (n, results) = out.split_once(' ').expect("a count and results");
    assert_eq!(n, "8", "{out}");
    let mut by_thread = std::collections::BTreeMap::new();
    for r in results.split(' ') {
        *by_thread.entry(r).or_insert(0) += 1;
    }
    // both threads ran tasks of the batch
    assert_eq!(by_thread.len(), 2, "{out}");
    ngx.assert_clean_log();
}
