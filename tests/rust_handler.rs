//! Rust pools end to end: a library built with the handler crate
//! (tests/fixtures/rust_handler, its ops listed in src/handler.rs) in
//! `thread_pool_process_by_rust` pools, called from Lua as any pool:
//! push_task, push_tasks and post_task with typed and borrowed arguments
//! and several results; typed argument errors, `Err` and panics as
//! `nil, e`; the log crate's lines in error.log; a spinning handler that
//! sees its caller's timeout; the queue bound and timeouts; stats() and
//! metrics; shadow comparison Lua → Rust and Rust → Lua; a reload that
//! loads a library renamed in; strings of a request's own VM
//! (`lua_code_cache off`) copied, not lent.

mod common;

use common::handlers::*;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Pools: `r` (the fixture), `q` (one queue slot), and two shadow pairs,
/// `lmain` (Lua) → `ralt` (Rust, CONFIG "alt") and `rmain` (Rust) →
/// `lalt` (Lua), whose "parity" differs for odd numbers. POST /run runs
/// its body as Lua, `tp` in scope, and prints what it returns.
const HTTP: &str = r#"
    lua_thread_pool r threads=1;
    lua_thread_pool q threads=1 max_queue=1;
    lua_thread_pool lmain threads=1;
    lua_thread_pool ralt threads=1;
    lua_thread_pool rmain threads=1;
    lua_thread_pool lalt threads=1;
    thread_pool_process_by_rust r LIB;
    thread_pool_process_by_rust q LIB;
    thread_pool_process_by_rust ralt LIB alt;
    thread_pool_process_by_rust rmain LIB;
    thread_pool_process_by_lua lmain "ALT = false; return PARITY";
    thread_pool_process_by_lua lalt "ALT = true; return PARITY";
    thread_pool_shadow lmain ralt;
    thread_pool_shadow rmain lalt;
    server {
        listen 127.0.0.1:$PORT;
        location /metrics { thread_pool_status; }
        location /run {
            content_by_lua_block {
                ngx.req.read_body()
                local f = assert(loadstring("local tp = require 'resty.threadpool'\n"
                    .. ngx.req.get_body_data()))
                ngx.print(f())
            }
        }
    }
"#;

/// The Lua side of the shadow pairs: Rust's "parity" and "map".
const PARITY: &str = r#"function(op, x)
        if op == "map" then
            local t = {}
            for i = 40, 1, -1 do t["k" .. i] = i end
            return t
        end
        if ALT and x % 2 == 1 then return x * 10 + 1 end
        return x
    end"#;

fn start_with(main: &str, lib: &Path) -> Nginx {
    let http = HTTP
        .replace("LIB", &lib.display().to_string())
        .replace("PARITY", &PARITY.replace('"', "\\\""));
    Case::new(main).http(&http).start()
}

fn start() -> Nginx {
    start_with("", &rust_fixture().v1)
}

/// Runs `lua` in nginx (see HTTP): its output.
fn run(n: &Nginx, lua: &str) -> String {
    let r = n.post("/run", lua.as_bytes());
    assert_eq!(r.status, 200, "{lua}: {}\n{}", r.text(), n.error_log());
    r.text()
}

#[test]
fn push_task_push_tasks_and_post_task_reach_a_rust_pool() {
    let n = start();
    // typed arguments back, a nil among them
    let echo = r##"
        local cjson = require "cjson"
        local function pack(...) return { n = select("#", ...), ... } end
        local v = pack(tp.r:push_task("echo", 42, 1.5, true, { a = { 1, 2 } }, nil, "x"))
        return v.n, " ", cjson.encode({ v[1], v[2], v[3], v[4], v[5], v[6] })"##;
    assert_eq!(run(&n, echo), r#"6 [42,1.5,true,{"a":[1,2]},null,"x"]"#);
    assert_eq!(
        run(&n, r#"return tp.r:push_task("upper", "foo", 2)"#),
        "FOOFOO3"
    );
    // a 1 MiB string, read in place (zero-copy from 16 KiB), borrowed as
    // &str, and its 1 MiB result
    let big = r#"
        local s = string.rep("abcdefgh", 131072)
        local up, len = tp.r:push_task("upper", s)
        return up == s:upper(), " ", len"#;
    assert_eq!(run(&n, big), "true 1048576");
    let values = r##"
        local function pack(...) return { n = select("#", ...), ... } end
        local v = pack(tp.r:push_task("values"))
        local rec = v[4]
        return v.n, " ", v[1], " ", tostring(v[2]), " ", v[3], " ", rec.name, " ",
            table.concat(rec.list, ","), " ", tostring(rec.flags.on), tostring(rec.flags.off),
            " ", table.concat(v[5], ","), " ", tostring(rec.missing == ngx.null), " ",
            #rec.holes, tostring(rec.holes[2] == ngx.null)"##;
    // None is nil as a value, ngx.null inside a table
    assert_eq!(
        run(&n, values),
        "5 1 nil two rec 1,2,3 truefalse 7,8 true 2true"
    );
    let batch = r#"
        local res = assert(tp.r:push_tasks({ { "upper", "a" }, { "tag" }, { "error" } }))
        local out = {}
        for i, r in ipairs(res) do
            out[i] = tostring(r[1]) .. ":" .. tostring(r[2]) .. ":" .. tostring(r[3])
        end
        return table.concat(out, " ")"#;
    assert_eq!(
        run(&n, batch),
        "true:A:1 true:v1:nil false:handler error:nil"
    );
    assert_eq!(
        run(&n, r#"assert(tp.r:post_task("error")) return "posted""#),
        "posted"
    );
    assert!(
        eventually(Duration::from_secs(5), || n
            .error_log()
            .contains("posted task failed: handler error")),
        "{}",
        n.error_log()
    );
    n.assert_clean_log();
}

#[test]
fn typed_argument_errors_give_the_documented_texts() {
    let n = start();
    for (args, want) in [
        (r#""typed", 1, { limit = 2 }"#, "3|nil"),
        (
            r#""typed", "x", { limit = 2 }"#,
            "nil|bad argument #2: expected u32, got string",
        ),
        (
            r#""typed", 1, { limit = -1 }"#,
            r#"nil|bad argument #3 at ["limit"]: expected u32, got -1"#,
        ),
        (
            r#""typed", 1, { limit = 2 }, "z""#,
            "nil|bad argument #4: expected at most 3 arguments, got string",
        ),
        (
            r#""upper", "ab\255""#,
            "nil|bad argument #2: expected a UTF-8 string, got invalid UTF-8 at byte 3",
        ),
        (
            r#""upper", 42"#,
            "nil|bad argument #2: expected a borrowed string, got 42",
        ),
    ] {
        let lua =
            format!("local r, e = tp.r:push_task({args}) return tostring(r), '|', tostring(e)");
        assert_eq!(run(&n, &lua), want, "{args}");
    }
    n.assert_clean_log();
}

/// The payload's limits, at and past them: past them the handler crate
/// refuses the results with the texts a Lua handler's caller gets, where
/// the module would only see a bad payload.
#[test]
fn results_past_the_payload_limits_give_the_lua_encoders_errors() {
    let n = start();
    let lua = r##"
        local function count(...) return select("#", ...) end
        local d, depth = tp.r:push_task("deep", 100), 0
        while type(d) == "table" do depth, d = depth + 1, d[1] end
        local many, many_err = tp.r:push_task("many", 4097)
        local deep, deep_err = tp.r:push_task("deep", 101)
        return count(tp.r:push_task("many", 4096)), "|", depth, "|", tostring(many), "|",
            many_err, "|", tostring(deep), "|", deep_err"##;
    assert_eq!(
        run(&n, lua),
        "4096|100|nil|too many return values (max 4096)|\
         nil|cannot encode return value #1: table nested deeper than 100"
    );
    n.assert_clean_log();
}

#[test]
fn err_is_nil_e_and_a_panic_leaves_the_thread_serving_with_its_state() {
    let n = start();
    let lua = r#"
        local function show(a, b, c) return tostring(a) .. "," .. tostring(b) .. "," .. tostring(c) end
        return show(tp.r:push_task("count")), "|", show(tp.r:push_task("error")), "|",
            show(tp.r:push_task("panic")), "|", show(tp.r:push_task("count"))"#;
    let out = run(&n, lua);
    let parts: Vec<&str> = out.split('|').collect();
    assert_eq!(parts.len(), 4, "{out}");
    let (first, id) = parts[0].split_once(',').unwrap();
    assert_eq!(first, "1");
    assert_eq!(parts[1], "nil,handler error,nil");
    assert_eq!(parts[2], "nil,panic: boom at task 3,nil");
    // the same thread, its count kept across the panic
    assert_eq!(parts[3], format!("4,{id}"), "{out}");
    let log = n.error_log();
    for bad in ["signal", "[alert]", "[emerg]"] {
        assert!(!log.contains(bad), "{bad}:\n{log}");
    }
}

/// An `Err` or a panic in the handler's `init`, in the words the handler
/// crate documents: the error log names the pool and thread, and the
/// thread's tasks get `nil, 'thread pool "NAME" is not usable: TEXT'`,
/// TEXT being `panic: MESSAGE` for a panic.
#[test]
fn an_init_error_or_panic_leaves_the_pool_unusable_with_its_text() {
    let http = r#"
    lua_thread_pool f threads=1;
    lua_thread_pool p threads=1;
    thread_pool_process_by_rust f LIB init-fails;
    thread_pool_process_by_rust p LIB init-panics;
    server {
        listen 127.0.0.1:$PORT;
        location /run {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local r1, e1 = tp.f:push_task("tag")
                local r2, e2 = tp.p:push_task("tag")
                ngx.print(tostring(r1), ",", e1, "|", tostring(r2), ",", e2)
            }
        }
    }"#;
    let n = Case::new("")
        .http(&http.replace("LIB", &rust_fixture().v1.display().to_string()))
        .start();
    assert_eq!(
        n.get("/run").text(),
        "nil,thread pool \"f\" is not usable: init refused by CONFIG|\
         nil,thread pool \"p\" is not usable: panic: init panicked on CONFIG"
    );
    let log = n.error_log();
    for text in [
        "thread pool \"f\" thread #0: init refused by CONFIG",
        "thread pool \"p\" thread #0: panic: init panicked on CONFIG",
    ] {
        let line = log.lines().find(|l| l.contains(text));
        assert!(
            line.is_some_and(|l| l.contains("[error]")),
            "{text}:\n{log}"
        );
    }
}

#[test]
fn log_macros_write_at_their_levels_with_the_pool_name() {
    let mut n = start_with("error_log logs/debug.log debug;", &rust_fixture().v1);
    assert_eq!(run(&n, r#"return tostring(tp.r:push_task("log"))"#), "nil");
    let info = n.error_log();
    let debug = std::fs::read_to_string(n.dir.join("logs/debug.log")).unwrap();
    for (level, shown_at) in [
        ("error", "error"),
        ("warn", "warn"),
        ("info", "info"),
        ("debug", "debug"),
        ("trace", "debug"),
    ] {
        let line = format!("[native] log test {level}, thread pool: r");
        let found = |log: &str| {
            log.lines()
                .find(|l| l.contains(&line))
                .map(|l| l.contains(&format!("[{shown_at}]")))
        };
        assert_eq!(found(&debug), Some(true), "{line} at {shown_at}:\n{debug}");
        // the info log has what is info and above
        let want = (shown_at != "debug").then_some(true);
        assert_eq!(found(&info), want, "{line} in the info log:\n{info}");
    }
    // the handler's own line at level error
    n.expect_errors(&["[error] *[native] log test error, thread pool: r"]);
    n.assert_clean_log();
}

#[test]
fn a_spinning_rust_handler_sees_its_callers_timeout() {
    let http = format!(
        "thread_pool_process_by_rust c {};\n{SPIN_SERVER}",
        rust_fixture().v1.display()
    );
    let n = Case::new("thread_pool c threads=1;").http(&http).start();
    assert_spinning_handler_sees_timeout(&n, "c");
    n.assert_clean_log();
}

/// Refused at once: the push does not yield (a timer due at once has not
/// run when it returns). The timeouts' tasks spin until cancelled, so
/// only the timeouts can end the calls.
#[test]
fn a_full_queue_fails_fast_and_timeouts_return_in_time() {
    let n = start();
    // one task runs, one waits in the queue's one slot, the next is refused
    let full = r#"
        local a = ngx.thread.spawn(function() return tp.q:push_task("sleep", 300) end)
        -- the thread takes a: the queue's slot is free
        for _ = 1, 10000 do
            if tp.q:stats().busy > 0 then break end
            ngx.sleep(0.001)
        end
        local b = ngx.thread.spawn(function() return tp.q:push_task("sleep", 300) end)
        local yielded = false
        assert(ngx.timer.at(0, function() yielded = true end))
        local r, e = tp.q:push_task("tag")
        local at_once = not yielded
        local _, ra = ngx.thread.wait(a)
        local _, rb = ngx.thread.wait(b)
        return tostring(r), " ", e, " ", at_once, " ", ra, " ", rb"#;
    assert_eq!(run(&n, full), "nil queue full true slept slept");
    let timeouts = r#"
        local r, e = tp.r:push_task_timeout(0.05, "spin")
        local b, be = tp.r:push_tasks_timeout(0.05, { { "spin" }, { "spin" } })
        return tostring(r), " ", e, " ", tostring(b), " ", be"#;
    assert_eq!(run(&n, timeouts), "nil timeout nil timeout");
    n.assert_clean_log();
}

#[test]
fn stats_and_metrics_count_a_rust_pools_tasks() {
    let n = start();
    let lua = r#"
        tp.r:push_task("tag")
        tp.r:push_task("error")
        tp.r:push_tasks({ { "tag" }, { "error" }, { "tag" } })
        tp.r:push_task_timeout(0.01, "spin")
        return "ok""#;
    assert_eq!(run(&n, lua), "ok");
    // The timed-out task ran (completed) or, taken only after its caller
    // gave up or its deadline passed, was skipped (cancelled, expired):
    // one of the two.
    let stats = r#"
        local s = tp.r:stats()
        return s.pushed, " ", s.completed + s.cancelled + s.expired, " ", s.errors, " ", s.timed_out, " ",
               s.threads"#;
    assert!(
        eventually(Duration::from_secs(5), || run(&n, stats) == "6 4 2 1 1"),
        "{}",
        run(&n, stats)
    );
    let metrics = prometheus(&n.get("/metrics").text());
    let at = |name: &str| metrics[&format!("ngx_threadpool_{name}{{pool=r,worker=0}}")];
    assert_eq!(at("tasks_pushed_total"), 6.0);
    assert_eq!(
        at("tasks_completed_total") + at("tasks_cancelled_total"),
        4.0
    );
    assert_eq!(at("task_errors_total"), 2.0);
    assert_eq!(at("tasks_timed_out_total"), 1.0);
    n.assert_clean_log();
}

/// (compared, mismatched, skipped) of `pool`'s shadow once `compared`
/// reaches `want`, and still after a pause.
fn shadow_counts(n: &Nginx, pool: &str, want: u64) -> String {
    let lua = format!(
        "local s = tp.{pool}:stats() return s.shadow_compared, ' ', s.shadow_mismatched, ' ', s.shadow_skipped"
    );
    let compared = |text: &str| text.split(' ').next().unwrap().parse::<u64>().unwrap();
    assert!(eventually(Duration::from_secs(10), || compared(&run(
        n, &lua
    )) >= want));
    std::thread::sleep(Duration::from_millis(300));
    run(n, &lua)
}

/// Lua → Rust and Rust → Lua, each under the same known mix: 30 "parity"
/// tasks (10 pushed, a batch of 10, 10 posted), the odd ones differing,
/// and 5 "map" tables equal as values (built in another key order).
#[test]
fn shadow_counts_are_exact_between_lua_and_rust_pools() {
    let n = start();
    for (pool, shadow) in [("lmain", "ralt"), ("rmain", "lalt")] {
        let mix = format!(
            r#"
            local p = tp.{pool}
            for i = 1, 10 do assert(p:push_task("parity", i) == i) end
            local list = {{}}
            for i = 1, 10 do list[i] = {{ "parity", 10 + i }} end
            for i, r in ipairs(assert(p:push_tasks(list))) do assert(r[2] == 10 + i) end
            for i = 1, 10 do assert(p:post_task("parity", 20 + i)) end
            for _ = 1, 5 do assert(p:push_task("map").k7 == 7) end
            return "ok""#
        );
        assert_eq!(run(&n, &mix), "ok");
        assert_eq!(shadow_counts(&n, pool, 35), "35 15 0", "{pool} → {shadow}");
        let metrics = prometheus(&n.get("/metrics").text());
        let at = |name: &str| {
            metrics[&format!(
                "ngx_threadpool_shadow_{name}_total{{pool={pool},shadow={shadow},worker=0}}"
            )]
        };
        assert_eq!((at("compared"), at("mismatched")), (35.0, 15.0));
        let line = format!(r#"thread pool "{pool}" and its shadow "{shadow}" differ"#);
        assert!(n.error_log().contains(&line), "{line}:\n{}", n.error_log());
    }
    n.assert_clean_log();
}

/// With `lua_code_cache off`, lua-nginx-module runs a request's Lua in a
/// VM of its own and closes it with the request. /fresh runs so, /main in
/// the main VM; both push 1 MiB strings ("late": read after `ms`) and
/// give up after 1 ms; /main stops the main VM's collector, /mem restarts
/// it, collects and gives the VM's size in KiB.
const VMS: &str = r#"
    lua_thread_pool r threads=1;
    thread_pool_process_by_rust r LIB;
    server {
        listen 127.0.0.1:$PORT;
        location /fresh {
            lua_code_cache off;
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local s = string.rep("x", 1048576)
                -- a timeout that is no deadline: queued whatever waits
                -- ahead (this VM's pool object goes with the request)
                tp.r:set_timeout(0.001)
                ngx.print(tp.r:push_task("late", s, 100))
            }
        }
        location /main {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                -- no cycle, so no reaping, before /mem
                collectgarbage("stop")
                -- timeouts that are no deadlines: all 8 queued
                tp.r:set_timeout(0.001)
                for i = 1, 8 do
                    local s = string.rep(string.char(96 + i), 1048576)
                    assert(not tp.r:push_task("late", s, 50))
                end
                tp.r:set_timeout(60)
                ngx.print("gave up")
            }
        }
        location /mem {
            content_by_lua_block {
                collectgarbage("restart")
                collectgarbage()
                collectgarbage()
                ngx.print(math.floor(collectgarbage("count")))
            }
        }
        location /stats {
            content_by_lua_block {
                local st = require("resty.threadpool").r:stats()
                ngx.print(st.completed + st.cancelled + st.expired)
            }
        }
    }
"#;

/// Waits until pool r has completed or skipped `tasks` tasks.
fn settled(n: &Nginx, tasks: u64) {
    assert!(
        eventually(Duration::from_secs(5), || n.get("/stats").text()
            == tasks.to_string()),
        "{}\n{}",
        n.get("/stats").text(),
        n.error_log()
    );
}

/// A Rust handler reads its borrowed strings for as long as it runs; a VM
/// closed with its request lends none: the handler reads its copy intact
/// after the caller's VM is gone (lent, the worker crashed on the first).
/// And such a VM does not take the reaping of the main VM's strings: they
/// are let go of (else 8 MiB stayed anchored).
#[test]
fn strings_of_a_vm_closed_with_its_request_are_copied() {
    let http = VMS.replace("LIB", &rust_fixture().v1.display().to_string());
    let n = Case::new("").http(&http).start();
    let worker = n.workers();
    // until three handlers have read: a task whose caller gave up before
    // the thread took it is skipped
    let mut pushed = 0;
    while n.error_log().matches("late read").count() < 3 {
        assert!(pushed < 30, "{}", n.error_log());
        assert_eq!(n.get("/fresh").text(), "niltimeout");
        pushed += 1;
        settled(&n, pushed);
    }
    assert_eq!(n.error_log().matches("late read: intact").count(), 3);
    let base: u64 = n.get("/mem").text().parse().unwrap();
    // the main VM's 8 strings, each anchored until its task ends
    assert_eq!(n.get("/main").text(), "gave up");
    settled(&n, pushed + 8);
    // a push from a fresh VM before the main VM reaps
    assert_eq!(n.get("/fresh").text(), "niltimeout");
    settled(&n, pushed + 9);
    let after: u64 = n.get("/mem").text().parse().unwrap();
    assert!(after < base + 2048, "{base} KiB, then {after} KiB");
    let log = n.error_log();
    assert_eq!(n.workers(), worker, "{log}");
    assert!(!log.contains("exited on signal"), "{log}");
    assert!(!log.contains("late read: changed"), "{log}");
}

/// Sends HUP and waits for a new generation of workers.
fn reload(n: &Nginx) {
    let before = n.workers();
    n.signal("HUP");
    assert!(eventually(Duration::from_secs(10), || {
        let now = n.workers();
        !now.is_empty() && now.iter().all(|w| !before.contains(w))
    }));
}

/// A copy of `lib` renamed over `path`, as an install does.
fn install(lib: &Path, path: &Path) {
    let tmp = path.with_extension("new");
    std::fs::copy(lib, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The library at one path, v1 then v2 renamed over it: the workers of a
/// reload run v2, and the old workers free their threads' states.
#[test]
fn a_reload_loads_a_rust_library_renamed_in() {
    let dir = prefix("lib");
    let path: PathBuf = dir.join("handler.so");
    install(&rust_fixture().v1, &path);
    let n = start_with("", &path);
    let tag = r#"return tp.r:push_task("tag")"#;
    assert_eq!(run(&n, tag), "v1");
    reload(&n);
    assert_eq!(run(&n, tag), "v1");
    install(&rust_fixture().v2, &path);
    reload(&n);
    assert!(
        eventually(Duration::from_secs(5), || run(&n, tag) == "v2"),
        "{}",
        run(&n, tag)
    );
    // each reload's old worker freed its threads' states
    let log = n.error_log();
    let freed = log
        .lines()
        .filter(|l| l.ends_with("[native] freeing thread 0, thread pool: r"))
        .count();
    assert!(freed >= 2, "{log}");
    n.assert_clean_log();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `abort_scenarios_under_valgrind` with the Rust fixture, whose results
/// include an `Err`, a panic (whose place Rust's panic hook writes to
/// stderr, the error log) and an oversized result; each thread's state is
/// freed at quit.
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn rust_abort_scenarios_under_valgrind() {
    let log = abort_scenarios_under_valgrind(
        &rust_fixture().v1,
        &[
            ("error", "handler error"),
            ("panic", "panic: boom at task"),
            ("big", "return values exceed 16777216 bytes"),
        ],
    );
    for thread in 0..2 {
        let line = format!("[native] freeing thread {thread}, thread pool: c");
        assert!(log.contains(&line), "{line}:\n{log}");
    }
    let hook = "panicked at tests/fixtures/rust_handler/src/handler.rs";
    assert_eq!(log.matches(hook).count(), 1, "{log}");
    assert_clean(&log.replace(hook, ""));
}
