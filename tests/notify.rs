//! ngx_notify shared by three thread pools in one worker: nginx's own
//! (`aio threads` reading a static file, and `ngx.run_worker_thread`) and
//! ours (push_task).
//!
//! Why this exercises the race: nginx's epoll notify keeps one handler slot;
//! a notify stores its handler and writes the eventfd, and the event loop
//! calls whatever handler is stored when it wakes. nginx's thread pools
//! notify with ngx_thread_pool_handler, ours with its own handler, so without
//! the multiplexer of src/notify.rs a completion of one kind arriving between
//! a completion of the other kind and the event loop's wake-up overwrites
//! the slot, and one handler is never called. A lost wake-up of ours leaves
//! our "wake-up pending" flag set, so no pool thread notifies again and every
//! push_task hangs; a lost one of nginx's leaves an aio read or a worker
//! thread task undelivered until nginx's next notify, and the last one of a
//! burst hangs. Either way a request hangs, and its client's read times out.
//! The load below keeps all three kinds completing at once, from many
//! threads, in thousands of tiny tasks (each static response is 256 aio
//! reads of 8 KiB; each push_task and run_worker_thread does almost no
//! work), so the window between two notifies and the loop's wake-up is hit
//! many times per round. With the multiplexer disabled (multiplex()
//! forwarding each caller's own handler), the first round fails every time
//! within READ_TIMEOUT: push_task requests hang.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const FILE_SIZE: usize = 2 * 1024 * 1024;
const CLIENTS: usize = 8;
const REQUESTS: usize = 100;
const ROUNDS: usize = 3;
/// Every request is done in well under a second; a hang is a lost wake-up.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

const MAIN: &str = r#"
thread_pool io_pool threads=2;
thread_pool rwt_pool threads=2;
thread_pool tp_pool threads=2;
"#;

const HTTP: &str = r#"
    thread_pool_process_by_lua tp_pool "
        local s, i = ...
        return s:upper() .. i
    ";

    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;

        location = /big.txt {
            root conf;
            aio threads=io_pool;
            sendfile off;
            output_buffers 2 8k;
        }

        # n tasks each from 4 light threads at once.
        location = /tp {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local n = tonumber(ngx.var.arg_n)
                local function run(tag)
                    for i = 1, n do
                        local res, err = tp.tp_pool:push_task(tag, i)
                        if res ~= tag:upper() .. i then
                            return "tp " .. tag .. " " .. i .. ": " .. tostring(res or err)
                        end
                    end
                    return "ok"
                end
                local threads = {}
                for t = 1, 4 do
                    threads[t] = ngx.thread.spawn(run, "t" .. t)
                end
                for t = 1, 4 do
                    local _, res = ngx.thread.wait(threads[t])
                    if res ~= "ok" then
                        ngx.say(res)
                        return
                    end
                end
                ngx.say("tp ok")
            }
        }

        location = /rwt {
            content_by_lua_block {
                local n = tonumber(ngx.var.arg_n)
                for i = 1, n do
                    local ok, res = ngx.run_worker_thread("rwt_pool", "rwt_mod", "work", "w", i)
                    if not ok or res ~= "W" .. i then
                        ngx.say("rwt ", i, ": ", tostring(ok), " ", tostring(res))
                        return
                    end
                end
                ngx.say("rwt ok")
            }
        }

        # Both Lua-driven pools in one request, concurrently. (The static
        # file is not read here with ngx.location.capture: a subrequest to
        # an aio location returns an empty body and leaves the connection
        # open, lua-nginx-module issue #587, with or without this module.)
        location = /mixed {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local n = tonumber(ngx.var.arg_n)
                local t1 = ngx.thread.spawn(function()
                    for i = 1, n do
                        if tp.tp_pool:push_task("m", i) ~= "M" .. i then
                            return "tp failed at " .. i
                        end
                    end
                    return "ok"
                end)
                local t2 = ngx.thread.spawn(function()
                    for i = 1, n do
                        local ok, res = ngx.run_worker_thread("rwt_pool", "rwt_mod", "work", "m", i)
                        if not ok or res ~= "M" .. i then
                            return "rwt failed at " .. i .. ": " .. tostring(res)
                        end
                    end
                    return "ok"
                end)
                local _, r1 = ngx.thread.wait(t1)
                local _, r2 = ngx.thread.wait(t2)
                ngx.say("mixed ", r1, " ", r2)
            }
        }
    }
"#;

/// The module run by ngx.run_worker_thread; it must be requireable from
/// lua_package_path, which therefore adds $prefix/conf/ (see `http`).
const RWT_MOD: &str = r#"
local _M = {}
function _M.work(s, i)
    return s:upper() .. i
end
return _M
"#;

/// HTTP with a lua_package_path that finds rwt_mod.lua in conf/.
fn http() -> String {
    let path = format!("{}/lua/?.lua;$prefix/conf/?.lua;;", repo().display());
    format!("    lua_package_path \"{path}\";\n{HTTP}")
}

/// A static file whose every 8 KiB read is distinct.
fn big_file() -> String {
    let mut s = String::with_capacity(FILE_SIZE);
    let mut line = 0;
    while s.len() < FILE_SIZE {
        s.push_str(&format!("{line:015}\n"));
        line += 1;
    }
    s.truncate(FILE_SIZE);
    s
}

/// The request a client sends as its `i`-th, and the body it must get.
fn nth(i: usize, file: &str) -> (&'static str, String) {
    match i % 4 {
        0 => ("/big.txt", file.to_string()),
        1 => ("/tp?n=25", "tp ok\n".into()),
        2 => ("/rwt?n=10", "rwt ok\n".into()),
        _ => ("/mixed?n=10", "mixed ok ok\n".into()),
    }
}

#[test]
fn three_thread_pools_share_notify_without_losing_wakeups() {
    let file = big_file();
    let n = Case::new(MAIN)
        .http(&http())
        .file("big.txt", &file)
        .file("rwt_mod.lua", RWT_MOD)
        .start();
    let worker = n.workers();
    assert_eq!(worker.len(), 1);
    // Two threads each for io_pool and rwt_pool (nginx's), two of ours,
    // our slow-task watchdog and our update thread.
    let want = 1 + 2 + 2 + 2 + 1 + 1;
    assert!(
        eventually(Duration::from_secs(5), || thread_count(worker[0]) == want),
        "worker has {} threads, expected {want}",
        thread_count(worker[0])
    );

    for round in 0..ROUNDS {
        let stop = AtomicBool::new(false);
        let failures: Vec<String> = std::thread::scope(|s| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let file = &file;
                    let (port, stop) = (n.port, &stop);
                    s.spawn(move || {
                        let mut failures = Vec::new();
                        for i in 0..REQUESTS {
                            // After one failure the others would only wait
                            // out their timeouts as well.
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            let (path, want) = nth(c + i, file);
                            match try_request(port, "GET", path, &[], b"", READ_TIMEOUT) {
                                Ok(r) if r.status == 200 && r.body == want.as_bytes() => {}
                                Ok(r) => failures.push(format!(
                                    "{path}: status {}, body {:?}",
                                    r.status,
                                    r.text().chars().take(200).collect::<String>()
                                )),
                                Err(e) => failures.push(format!(
                                    "{path}: no answer within {READ_TIMEOUT:?} (a lost wake-up?): {e}"
                                )),
                            }
                            if !failures.is_empty() {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                        failures
                    })
                })
                .collect();
            clients
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect()
        });
        assert!(
            failures.is_empty(),
            "round {round}: {} requests failed, first: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }
    assert_eq!(n.workers(), worker, "the worker crashed");
    n.assert_clean_log();
    let log = n.error_log();
    assert!(!log.contains("[error]"), "{log}");
}
