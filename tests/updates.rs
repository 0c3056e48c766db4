//! Live updates (docs/updates.md): `pool:update(...)` and
//! `pool:update_opts{code, wait}` reach every thread of every worker, and
//! later workers, between two tasks; a failing update leaves every thread
//! at its version.

mod common;

use common::handlers;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A pool whose state is the version its update chunk was given; a task
/// spins `spin` ms and returns the version it saw at its start and at its
/// end.
const POOL: &str = r#"
    thread_pool_init_by_lua_block live { STATE = { version = 0 } }
    thread_pool_update_by_lua_block live {
        local version, how = ...
        if how == "error" then error("refused by the update chunk") end
        if how == "slow" then
            local t = os.clock() + 0.5
            while os.clock() < t do end
        end
        STATE = { version = version }
    }
    thread_pool_process_by_lua_block live {
        return function(spin)
            local at_start = STATE.version
            local t = os.clock() + spin / 1000
            while os.clock() < t do end
            return at_start, STATE.version
        end
    }
"#;

/// /work answers `PID VERSION`, or MIXED or BACKWARDS: a version lower
/// than one this worker already answered. /update and /update_opts make
/// updates.
const SERVER: &str = r#"
    server {
        listen 127.0.0.1:$PORT;
        location /work {
            content_by_lua_block {
                -- this worker's: the main VM's own table
                local seen = package.loaded.seen_versions or { max = 0 }
                package.loaded.seen_versions = seen
                local floor = seen.max
                local a, b = require("resty.threadpool").live:push_task(
                    tonumber(ngx.var.arg_spin) or 1)
                if not a then
                    ngx.say("error: ", b)
                elseif a ~= b then
                    ngx.say("MIXED ", a, " ", b)
                elseif a < floor then
                    ngx.say("BACKWARDS ", a, " < ", floor)
                else
                    if a > seen.max then seen.max = a end
                    ngx.say(ngx.worker.pid(), " ", a)
                end
            }
        }
        location /update {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local args = ngx.req.get_uri_args()
                local v, err
                if args.code or args.wait then
                    v, err = tp.live:update_opts(
                        { code = args.code, wait = tonumber(args.wait) },
                        tonumber(args.n), args.how)
                else
                    v, err = tp.live:update(tonumber(args.n), args.how)
                end
                ngx.print(v or ("error: " .. err))
            }
        }
        location /stats {
            content_by_lua_block {
                local s = require("resty.threadpool").live:stats()
                ngx.print(s.update_version, " ", s.updates_applied, " ",
                          s.updates_failed, " ",
                          table.concat(s.thread_versions, ","))
            }
        }
        location /metrics { thread_pool_status; }
    }
"#;

fn case(workers: usize) -> Case {
    Case::new("thread_pool live threads=2;")
        .http(&format!("{POOL}{SERVER}"))
        .workers(workers)
}

/// The version the workers' answers to /work show, once every one of
/// `n`'s workers answered at least once (each answer `PID VERSION`).
fn versions_of(n: &Nginx, workers: usize) -> std::collections::BTreeMap<String, String> {
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let body = n.get("/work").text();
        let (pid, version) = body
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("{body}\n{}", n.error_log()));
        seen.insert(pid.to_string(), version.to_string());
        if seen.len() >= workers {
            break;
        }
    }
    seen
}

#[test]
fn a_stream_of_updates_under_load_runs_each_task_on_one_version() {
    let n = case(2).start();
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (stop, answers, port) = (stop.clone(), answers.clone(), n.port);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = request(port, "GET", "/work?spin=2", &[], b"");
                    answers.lock().unwrap().push((r.status, r.text()));
                }
            })
        })
        .collect();
    for v in 1..100 {
        assert_eq!(n.get(&format!("/update?n={v}")).text(), v.to_string());
        std::thread::sleep(Duration::from_millis(3));
    }
    // the last waits for every thread of both workers
    assert_eq!(n.get("/update?n=100&wait=10").text(), "100");
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let answers = answers.lock().unwrap();
    let mut versions = std::collections::BTreeSet::new();
    for (status, body) in answers.iter() {
        let (pid, version) = body.trim().split_once(' ').unwrap_or(("", ""));
        assert!(
            *status == 200 && pid.parse::<u32>().is_ok(),
            "{status} {body}"
        );
        versions.insert(version.parse::<u32>().unwrap());
    }
    assert!(versions.len() > 2, "tasks saw versions {versions:?}");
    for version in versions_of(&n, 2).values() {
        assert_eq!(version, "100");
    }
    // every thread of this worker moved to 100 (and counted each move)
    let stats = n.get("/stats").text();
    assert!(
        stats.starts_with("100 ") && stats.ends_with(" 0 100,100"),
        "{stats}"
    );
    let metrics = n.get("/metrics").text();
    for worker in 0..2 {
        for thread in 0..2 {
            let series = format!("ngx_threadpool_thread_update_version{{pool=\"live\",worker=\"{worker}\",thread=\"{thread}\"}} 100");
            assert!(metrics.contains(&series), "{series}\n{metrics}");
        }
    }
    assert!(
        n.error_log()
            .contains("thread pool \"live\": update 100 made by worker"),
        "{}",
        n.error_log()
    );
    n.assert_clean_log();
}

#[test]
fn a_failing_update_leaves_every_thread_at_its_version() {
    let mut n = case(2).start();
    assert_eq!(n.get("/update?n=1&wait=10").text(), "1");
    // an error of the update chunk, new code with a syntax error, new
    // code that raises at its top level: each fails in the 4 threads,
    // which stay at 1
    let failures = [
        (
            "/update?n=2&wait=10&how=error",
            "refused by the update chunk",
        ),
        (
            "/update?n=3&wait=10&code=return%20function(",
            "expected near '<eof>'",
        ),
        (
            "/update?n=4&wait=10&code=error(%22boom%20at%20init%22)",
            "boom at init",
        ),
        // the latest code is every later update's: it fails until code
        // that works comes
        ("/update?n=5&wait=10", "boom at init"),
    ];
    for (version, (path, error)) in (2..).zip(failures) {
        let body = n.get(path).text();
        assert!(
            body.starts_with(&format!(
                "error: update {version} failed in 4 of 4 threads (0 applied it"
            )) && body.contains(error),
            "{body}"
        );
        for v in versions_of(&n, 2).values() {
            assert_eq!(v, "1");
        }
    }
    // the threads still take the next good update
    let code = "return%20function()%20return%20STATE.version,%20STATE.version%20end";
    assert_eq!(
        n.get(&format!("/update?n=6&wait=10&code={code}")).text(),
        "6"
    );
    for v in versions_of(&n, 2).values() {
        assert_eq!(v, "6");
    }
    // this worker: at 6, 2 updates applied and 4 failed by each thread
    let stats = n.get("/stats").text();
    assert!(stats.starts_with("6 4 8 6,6"), "{stats}");
    n.expect_errors(&[r#"thread pool "live": update * from worker * failed in 2 of 2 threads, which keep their version: *"#]);
    n.assert_clean_log();
}

#[test]
fn new_code_replaces_the_handler_in_every_thread() {
    let n = case(2).start();
    let code = "return%20function()%20return%201000,%201000%20end";
    assert_eq!(
        n.get(&format!("/update?n=1&wait=10&code={code}")).text(),
        "1"
    );
    for v in versions_of(&n, 2).values() {
        assert_eq!(v, "1000");
    }
    n.assert_clean_log();
}

#[test]
fn a_worker_killed_mid_update_comes_back_at_the_latest_version() {
    let mut n = case(2).start();
    assert_eq!(n.get("/update?n=1&wait=10").text(), "1");
    // each thread takes 0.5 s to apply 2: a worker is killed meanwhile
    assert_eq!(n.get("/update?n=2&how=slow").text(), "2");
    let victim = n.workers()[0];
    std::thread::sleep(Duration::from_millis(100));
    kill(victim, "KILL");
    assert!(eventually(Duration::from_secs(10), || {
        let w = n.workers();
        w.len() == 2 && !w.contains(&victim)
    }));
    let versions = versions_of(&n, 2);
    assert_eq!(versions.len(), 2, "{versions:?}");
    for v in versions.values() {
        assert_eq!(v, "2");
    }
    n.expect_errors(&[&format!("worker process {victim} exited on signal 9")]);
    n.assert_clean_log();
}

#[test]
fn a_reload_keeps_the_latest_update() {
    let mut n = case(2).start();
    assert_eq!(n.get("/update?n=7&wait=10").text(), "1");
    let old = n.workers();
    n.signal("HUP");
    assert!(eventually(Duration::from_secs(10), || {
        let w = n.workers();
        w.len() == 2 && w.iter().all(|p| !old.contains(p))
    }));
    for v in versions_of(&n, 2).values() {
        assert_eq!(v, "7");
    }
    assert_eq!(n.get("/update?n=8&wait=10").text(), "2");
    n.expect_errors(&[]);
    n.assert_clean_log();
}

#[test]
fn an_update_too_large_or_off_or_without_a_chunk_is_refused() {
    let n = Case::new(
        "thread_pool live threads=1; thread_pool plain threads=1; thread_pool off threads=1;",
    )
    .http(&format!(
        r#"{POOL}
            lua_shared_dict raised 64k;
            thread_pool_update_size live 1k;
            thread_pool_process_by_lua_block plain {{ return function() end }}
            thread_pool_process_by_lua_block off {{ return function() end }}
            thread_pool_update_size off off;
            server {{
                listen 127.0.0.1:$PORT;
                location /try {{
                    content_by_lua_block {{
                        local tp = require "resty.threadpool"
                        local _, e1 = tp.live:update(string.rep("x", 2000))
                        local _, e2 = tp.plain:update(1)
                        local _, e3 = tp.off:update(1)
                        local ok = tp.plain:update_opts({{ code = "return function() end" }})
                        -- misuse raises, before any update is made
                        local raised = {{}}
                        for _, call in ipairs({{
                            function() return tp.plain.update() end,
                            function() return tp.plain:update_opts("x") end,
                            function() return tp.plain:update_opts({{ code = 5 }}) end,
                            function() return tp.plain:update_opts({{ wait = -1 }}) end,
                        }}) do
                            local _, e = pcall(call)
                            raised[#raised + 1] = e
                        end
                        -- where the caller could not wait: refused, nothing made
                        local _, e4
                        table.sort({{ 1, 2 }}, function(a, b)
                            _, e4 = tp.plain:update_opts({{ wait = 1, code = "return function() end" }})
                            return a < b
                        end)
                        local v = tp.plain:update_opts({{ code = "return function() end" }})
                        ngx.print(e1, "\n", e2, "\n", e3, "\n", ok, "\n",
                                  table.concat(raised, "\n"), "\n", e4, "\n", v)
                    }}
                }}
                location /header {{
                    header_filter_by_lua_block {{
                        local tp = require "resty.threadpool"
                        local _, e = pcall(tp.plain.update_opts, tp.plain, {{ wait = 1 }})
                        ngx.shared.raised:set("e", e)
                    }}
                    content_by_lua_block {{ ngx.print("ok") }}
                }}
                location /raised {{
                    content_by_lua_block {{ ngx.print(ngx.shared.raised:get("e")) }}
                }}
            }}
            "#
    ))
    .start();
    let body = n.get("/try").text();
    let lines: Vec<&str> = body.lines().collect();
    assert!(
        lines[0].starts_with("update too large: 20")
            && lines[0].ends_with("thread_pool_update_size allows 1024"),
        "{body}"
    );
    assert_eq!(
        lines[1],
        "thread pool \"plain\" takes no such update: it has no thread_pool_update_by_lua* to apply an update's arguments"
    );
    assert_eq!(
        lines[2],
        "thread pool \"off\" takes no such update: its updates are off (thread_pool_update_size off)"
    );
    assert_eq!(lines[3], "1");
    assert_eq!(
        &lines[4..],
        [
            "bad self: call it as pool:update(...)",
            "bad opts: expected a table",
            "bad opts.code: expected a string",
            "bad opts.wait: expected a number of seconds > 0",
            "cannot wait here: called from a function that a C function called (a table.sort comparator, a string.gsub callback, a finalizer)",
            "2",
        ]
    );
    assert_eq!(n.get("/header").text(), "ok");
    assert!(
        n.get("/raised")
            .text()
            .starts_with("update_opts with wait: API disabled in the context of header_filter"),
        "{}",
        n.get("/raised").text()
    );
    n.assert_clean_log();
}

/// A native pool `n` (the library at `path`) in 2 workers: /tag answers
/// `PID TAG`, /update?tag= makes an update and waits for it.
fn native_case(path: &std::path::Path) -> Case {
    Case::new("thread_pool n threads=2;")
        .http(&format!(
            r#"thread_pool_process_by_rust n {};
            server {{
                listen 127.0.0.1:$PORT;
                location /work {{
                    content_by_lua_block {{
                        local tag = assert(require("resty.threadpool").n:push_task("tag"))
                        ngx.say(ngx.worker.pid(), " ", tag)
                    }}
                }}
                location /update {{
                    content_by_lua_block {{
                        local tp = require "resty.threadpool"
                        local v, err = tp.n:update_opts(
                            {{ wait = 10, code = ngx.var.arg_code }}, ngx.var.arg_tag)
                        ngx.print(v or ("error: " .. err))
                    }}
                }}
            }}"#,
            path.display()
        ))
        .workers(2)
}

#[test]
fn a_rust_handler_takes_updates_and_an_err_or_a_panic_leaves_its_state() {
    let n = native_case(&handlers::rust_fixture().v1).start();
    assert_eq!(n.get("/update?tag=v9").text(), "1");
    for v in versions_of(&n, 2).values() {
        assert_eq!(v, "v9");
    }
    for (version, (tag, error)) in (2..).zip([
        ("error", "update refused"),
        ("panic", "panic: update panicked"),
    ]) {
        let body = n.get(&format!("/update?tag={tag}")).text();
        assert_eq!(
            body,
            format!("error: update {version} failed in 4 of 4 threads (0 applied it; the others keep their version): {error}")
        );
        for v in versions_of(&n, 2).values() {
            assert_eq!(v, "v9");
        }
    }
    let mut n = n;
    // the panic's own lines, which Rust's hook writes to stderr
    n.expect_errors(&[
        r#"thread pool "n": update * failed in 2 of 2 threads*"#,
        "*panicked at tests/fixtures/rust_handler/*",
        "update panicked",
    ]);
    n.assert_clean_log();
}

#[test]
fn a_c_library_without_the_export_or_given_code_is_refused() {
    let libs = handlers::Libs::new();
    let n = native_case(&libs.build("with", &[])).start();
    assert_eq!(n.get("/update?tag=v2").text(), "1");
    assert_eq!(
        n.get("/update?tag=v3&code=x").text(),
        "error: thread pool \"n\" takes no such update: a native pool's code is its library: an update cannot replace it"
    );
    drop(n);
    let without = libs.build("without", &["-DNO_UPDATE"]);
    let n = native_case(&without).start();
    assert_eq!(
        n.get("/update?tag=v2").text(),
        format!(
            "error: thread pool \"n\" takes no such update: the library \"{}\" has no ngx_threadpool_update: its pool takes no updates",
            without.display()
        )
    );
    n.assert_clean_log();
}

/// Updates of a Lua pool (arguments, new code, failures) and of a Rust
/// pool (Err and panic among them), with tasks between them, under
/// valgrind: no memory error, no leak (`make valgrind`).
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn updates_under_valgrind() {
    let mut n = Case::new("thread_pool live threads=2; thread_pool n threads=2;")
        .http(&format!(
            r#"{POOL}
            thread_pool_process_by_rust n {};
            server {{
                listen 127.0.0.1:$PORT;
                location /run {{
                    content_by_lua_block {{
                        local tp = require "resty.threadpool"
                        local out = {{}}
                        local function add(a, b) out[#out + 1] = tostring(a) .. "," .. tostring(b) end
                        for i = 1, 10 do
                            add(tp.live:update_opts({{ wait = 60 }}, i, i % 3 == 0 and "error" or nil))
                            add(tp.live:push_task(1))
                            add(tp.n:update_opts({{ wait = 60 }}, ({{ "t" .. i, "error", "panic" }})[i % 3 + 1]))
                            add(tp.n:push_task("tag"))
                        end
                        add(tp.live:update_opts({{ wait = 60, code = "return function() return 7, 7 end" }}, 11))
                        add(tp.live:update_opts({{ wait = 60, code = "return function(" }}, 12))
                        add(tp.live:push_task(1))
                        ngx.print(table.concat(out, "\n"))
                    }}
                }}
            }}"#,
            handlers::rust_fixture().v1.display()
        ))
        .under_valgrind()
        .start();
    let body = n.get("/run").text();
    assert!(body.ends_with("\n7,7"), "{body}\n{}", n.error_log());
    assert_eq!(
        body.matches("failed in 2 of 2 threads").count(),
        11,
        "{body}"
    );
    n.quit_under_valgrind();
    n.expect_errors(&[
        r#"thread pool "*": update * failed in 2 of 2 threads*"#,
        "*panicked at tests/fixtures/rust_handler/*",
        "update panicked",
    ]);
    n.assert_clean_log();
}
