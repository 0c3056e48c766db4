//! Zero-copy strings (`thread_pool_zero_copy`): a string argument from the
//! pool's size on is read in place by the pool thread, and a string the
//! handler returns is read in place by the event loop.
//! - values cross intact at and around the size, nested or not, alone and
//!   in batches, and the debug log shows they were borrowed (and not when
//!   the pool copies);
//! - a caller that gives up (timeout) while the thread reads its strings
//!   keeps them alive until the task ends, though its own references are
//!   gone, a collection ran and their memory was filled: the thread reads
//!   what was sent; and lets go of them at the next collection cycle when it
//!   pushes nothing more;
//! - a thread keeps its returned strings alive until the event loop read
//!   them, though the next task of that thread collected garbage and
//!   reused the memory.
//!
//! The abort, timeout and kill scenarios of tests/lifetime.rs pass 64 KiB
//! strings both ways, borrowed under the default size: their RSS bounds and
//! the valgrind run cover the borrowed strings' lifetimes.

mod common;

use common::{eventually, skipped_once_idle, Case, Nginx};
use std::time::Duration;

const HTTP: &str = r#"
    thread_pool_process_by_lua one "
        local ffi = require 'ffi'
        ffi.cdef 'int poll(void *fds, unsigned long nfds, int timeout);'
        local junk = {}
        -- Fills freed memory with other strings of the same sizes.
        local function churn(size)
            collectgarbage()
            collectgarbage()
            for i = 1, 64 do
                junk[i] = string.rep(string.char(65 + i % 26), size - 8) .. string.format('%8d', i)
            end
        end
        return function(op, a, b, ...)
            if op == 'echo' then
                return a, b, a and ngx.md5(type(a) == 'table' and a.s or a)
            elseif op == 'md5' then
                ffi.C.poll(nil, 0, b)
                ngx.log(ngx.INFO, 'GOT ', ngx.md5(a))
            elseif op == 'md5s' then
                ngx.log(ngx.INFO, 'READ ', tonumber(a:sub(1, 8)), ' ', ngx.md5(table.concat({ a, b, ... })))
            elseif op == 'make' then
                return string.rep(string.char(97 + b % 26), a - 8) .. string.format('%8d', b)
            elseif op == 'churn' then
                churn(a)
            elseif op == 'oom' then
                local t = {}
                for i = 1, math.huge do
                    t[i] = string.rep('x', 1024 * 1024) .. i
                end
            end
        end
    ";
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;

        # Echoes strings of the sizes in ?sizes, top-level and nested, one
        # task each and as one batch; says what differs, or ok.
        location /echo {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local pool = tp[ngx.var.arg_pool]
                local out = {}
                local list = {}
                for size in ngx.var.arg_sizes:gmatch("%d+") do
                    local s = string.rep("z", tonumber(size) - 8) .. string.format("%8d", size)
                    local a, t, sum = pool:push_task("echo", s, { s = s, n = { s } })
                    if a ~= s or t.s ~= s or t.n[1] ~= s or sum ~= ngx.md5(s) then
                        out[#out + 1] = "differs at " .. size
                    end
                    list[#list + 1] = { "echo", s }
                end
                local res = assert(pool:push_tasks(list))
                for i, r in ipairs(res) do
                    if r[2] ~= list[i][2] or r[4] ~= ngx.md5(list[i][2]) then
                        out[#out + 1] = "batch differs at " .. i
                    end
                end
                ngx.say(#out == 0 and "ok" or table.concat(out, ", "))
            }
        }

        # The caller gives up 1 ms after the push, while the thread reads
        # its 15 strings of 1 MiB, and at once drops them, collects and
        # fills the memory: the strings must stay until the thread is done.
        location /give_up {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local args = {}
                for k = 1, 15 do
                    args[k] = string.format("%8d%8d", ngx.var.arg_i, k) .. string.rep("g", 1048560)
                end
                ngx.log(ngx.INFO, "SENT ", ngx.var.arg_i, " ", ngx.md5(table.concat(args)))
                local res, err = tp.one:push_task_timeout(0.001, "md5s", unpack(args))
                args = nil
                collectgarbage()
                collectgarbage()
                local junk = {}
                for k = 1, 15 do
                    junk[k] = string.rep("j", 1048560) .. string.format("%16d", k)
                end
                ngx.say(err)
            }
        }

        # A batch of 12 tasks with a 1 MiB string each, given up on while
        # its first task runs (or before it): the others are not run, and
        # the batch ends after the caller's last push, so only the shim's
        # collection-cycle sentinel lets go of the strings.
        location /hold_batch {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local list = {}
                for k = 1, 12 do
                    list[k] = { "md5", string.format("%8d", k) .. string.rep("h", 1048568), 100 }
                end
                local res, err = tp.one:push_tasks_timeout(0.05, list)
                ngx.say(err)
            }
        }

        # A task that reads its 1 MiB string after 150 ms, given up on at
        # 50 ms: a timeout that is no deadline, so that it is queued
        # whatever waits ahead of it.
        location /hold {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local s = string.format("%8d", ngx.var.arg_i) .. string.rep("h", 1048568)
                tp.one:set_timeout(0.05)
                local res, err = tp.one:push_task("md5", s, 150)
                tp.one:set_timeout(60)
                ngx.say(err)
            }
        }
        # A batch of more tasks than a C function's stack holds values,
        # every 1000th with a borrowed string.
        location /many {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local list = {}
                for i = 1, tonumber(ngx.var.arg_n) do
                    local s = tostring(i)
                    if i % 1000 == 0 then
                        s = string.rep("m", 16384) .. s
                    end
                    list[i] = { "echo", s }
                end
                local res, err = tp.one:push_tasks(list)
                if not res then
                    ngx.say(err)
                    return
                end
                for i, r in ipairs(res) do
                    if r[2] ~= list[i][2] or r[4] ~= ngx.md5(list[i][2]) then
                        ngx.say("differs at ", i)
                        return
                    end
                end
                ngx.say(#res)
            }
        }

        # A __gc that replaces the borrowed string of an argument while it
        # is pushed (?batch: the batch's entry itself): a step of the
        # collector, run by an allocation of the push once the values are
        # encoded, finalizes it.
        location /changed {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local batch = ngx.var.arg_batch
                local t = { s = string.rep("a", 100000) }
                local other = string.rep("b", 100000)
                local list
                local function push()
                    if not batch then
                        return tp.one:push_task("echo", t)
                    end
                    list = { { "echo", t } }
                    local res, err = tp.one:push_tasks(list)
                    return res and res[1][2], err
                end
                -- the push's own first allocations, before the collector is set
                assert(push())
                local ran, armed = 0, false
                collectgarbage()
                collectgarbage("stop")
                for _ = 1, 100 do
                    getmetatable(newproxy(true)).__gc = function()
                        ran = ran + 1
                        if armed and batch then
                            list[1] = 42
                        elseif armed then
                            t.s = other
                        end
                    end
                end
                -- step by step until the finalizers have begun
                local mul = collectgarbage("setstepmul", 1)
                repeat collectgarbage("step", 0) until ran > 0
                local before = ran
                collectgarbage("restart")
                armed = true
                local res, err = push()
                armed = false
                collectgarbage("setstepmul", mul)
                ngx.say(ran > before and "ran in the push" or "ran before", ": ",
                        res and res.s:sub(1, 1), " ", err)
                res = assert(push())
                ngx.say("then: ", res.s:sub(1, 1))
            }
        }
        location /gc {
            content_by_lua_block {
                collectgarbage()
                collectgarbage()
                ngx.say("collected")
            }
        }
        # Tasks queued or running, and those skipped so far (their caller
        # gave up before the thread took them).
        location /idle {
            content_by_lua_block {
                local s = require("resty.threadpool").one:stats()
                ngx.print(s.busy + s.queued, " ", s.cancelled + s.expired)
            }
        }

        # The second task runs the thread out of memory, which rebuilds
        # its Lua state; the third fills the memory the old one freed; then
        # the first task's result is read.
        location /oom {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local seed = tonumber(ngx.var.arg_i)
                local res = assert(tp.one:push_tasks({ { "make", 1048576, seed },
                                                      { "oom" },
                                                      { "churn", 1048576 } }))
                local want = string.rep(string.char(97 + seed % 26), 1048576 - 8)
                             .. string.format("%8d", seed)
                ngx.say(res[1][2] == want and "ok" or "differs", " ", res[2][2])
            }
        }

        # One thread runs both tasks of the batch in turn: the result of
        # the first is read only after the second collected and refilled.
        location /pinned {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local size, seed = tonumber(ngx.var.arg_size), tonumber(ngx.var.arg_i)
                local res = assert(tp.one:push_tasks({ { "make", size, seed },
                                                      { "churn", size } }))
                local want = string.rep(string.char(97 + seed % 26), size - 8)
                             .. string.format("%8d", seed)
                ngx.say(res[1][2] == want and "ok" or "differs")
            }
        }
    }
"#;

fn start(zero_copy: &str) -> Nginx {
    Case::new("thread_pool one threads=1;\nerror_log logs/debug.log debug;")
        .http(&format!("{HTTP}\nthread_pool_zero_copy one {zero_copy};"))
        .start()
}

#[test]
fn a_batch_larger_than_a_c_stack_borrows_and_crosses() {
    let n = start("16k");
    assert_eq!(n.get("/many?n=20000").text(), "20000\n");
    n.assert_clean_log();
}

/// The payload reads the strings that were encoded; a `__gc` that swaps
/// one out before it is anchored (or a batch's entry, for a number) would
/// leave the thread reading a string nothing keeps alive. The push
/// notices and queues nothing.
#[test]
fn an_argument_changed_by_a_finalizer_during_the_push_is_refused() {
    let n = start("16k");
    for (query, then) in [("", "b"), ("?batch=1", "a")] {
        for _ in 0..3 {
            assert_eq!(
                n.get(&format!("/changed{query}")).text(),
                format!(
                    "ran in the push: nil an argument changed while it was pushed\nthen: {then}\n"
                ),
                "{query}"
            );
        }
    }
    n.assert_clean_log();
}

/// Reloads and waits for the one new worker.
fn reload(n: &Nginx) {
    let old = n.workers();
    n.signal("HUP");
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = n.workers();
            now.len() == 1 && !old.contains(&now[0])
        }),
        "no new worker: {}",
        n.error_log()
    );
}

/// The harness's log checks, and no error or critical line either.
fn assert_no_errors(n: &Nginx) {
    n.assert_clean_log();
    let log = n.error_log();
    for bad in ["[crit]", "[error]"] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
}

fn debug_lines(n: &Nginx, what: &str) -> Vec<String> {
    std::fs::read_to_string(n.dir.join("logs/debug.log"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(what))
        .map(String::from)
        .collect()
}

/// How many queued tasks and taken results borrowed `k` strings.
fn borrowed(n: &Nginx, k: usize) -> (usize, usize) {
    let count = |what: &str| {
        debug_lines(n, what)
            .iter()
            .filter_map(|l| l.split(", borrowed ").nth(1))
            .filter(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits == k.to_string()
            })
            .count()
    };
    (count("queued for thread pool"), count("resumed,"))
}

#[test]
fn large_strings_cross_in_place_both_ways() {
    let n = start("16k");
    let r = n.get("/echo?pool=one&sizes=16383,16384,65536,1048576,4194304");
    assert_eq!(r.text(), "ok\n", "{}", n.error_log());
    // Each size once alone, once in the batch. From 16384 bytes a task
    // alone borrows its three strings (the same one, three times), the
    // batch one per task (four); each result borrows its top-level string
    // but not the table's; below 16384, nothing is borrowed.
    assert_eq!(borrowed(&n, 3), (4, 0));
    assert_eq!(borrowed(&n, 4), (1, 0));
    assert_eq!(borrowed(&n, 1), (0, 8));
    assert_eq!(borrowed(&n, 0), (1, 2));
    n.assert_clean_log();

    let n = start("off");
    let r = n.get("/echo?pool=one&sizes=16384,1048576");
    assert_eq!(r.text(), "ok\n", "{}", n.error_log());
    assert_eq!(borrowed(&n, 0), (3, 4));
    n.assert_clean_log();

    // Every string borrowed, table keys included.
    let n = start("1");
    let r = n.get("/echo?pool=one&sizes=9,300,70000");
    assert_eq!(r.text(), "ok\n", "{}", n.error_log());
    assert_eq!(borrowed(&n, 0), (0, 0));
    n.assert_clean_log();
}

/// The caller gives up (and frees its strings) while the thread is still
/// reading them: only the anchor keeps them alive until the task ends.
/// A task no thread had taken when its caller gave up is not run (on a
/// busy machine, many may be): the tasks that ran must have read what was
/// sent, and trials go on until three ran.
#[test]
fn strings_stay_while_the_thread_reads_them() {
    let n = start("16k");
    warm_up(&n);
    let (mut ran, mut tried) = (0, 0);
    while ran < 3 {
        assert!(tried < 50, "only {ran} of {tried} tasks ran");
        let before = skipped_once_idle(&n, "/idle");
        let r = n.get(&format!("/give_up?i={tried}"));
        assert_eq!(r.text(), "timeout\n", "{}", n.error_log());
        tried += 1;
        if skipped_once_idle(&n, "/idle") == before {
            ran += 1;
        }
    }
    let log = n.error_log();
    let sums = |what: &str| -> std::collections::HashMap<String, String> {
        log.lines()
            .filter_map(|l| l.split(what).nth(1))
            .filter_map(|s| {
                let mut w = s.split([' ', ',']);
                Some((w.next()?.to_string(), w.next()?.to_string()))
            })
            .collect()
    };
    let (sent, read) = (sums("SENT "), sums("READ "));
    assert_eq!(read.len(), ran, "tasks that ran and logged:\n{log}");
    for (i, sum) in &read {
        assert_eq!(sent.get(i), Some(sum), "task {i} read freed strings");
    }
    n.assert_clean_log();
}

/// The pool's thread is ready (its Lua state built): a task that must run
/// while its caller times out is not left queued, and then not run.
fn warm_up(n: &Nginx) {
    assert_eq!(n.get("/echo?pool=one&sizes=9").text(), "ok\n");
}

/// The strings of callers that stopped waiting are let go of once their
/// tasks ended, at the next collection of the event loop's VM, even though
/// the worker pushes nothing more.
#[test]
fn strings_of_callers_gone_are_let_go_of_without_another_push() {
    let n = start("16k");
    warm_up(&n);
    assert_eq!(n.get("/hold_batch").text(), "timeout\n");
    // the batch done (its first task run, or on a busy machine taken only
    // after the caller gave up and skipped with the others), and the pool
    // thread idle long enough to give its memory back
    skipped_once_idle(&n, "/idle");
    std::thread::sleep(Duration::from_millis(1500));
    let worker = n.workers()[0];
    let held = common::rss_kib(worker);
    // The batch's end reaches the event loop after the thread is idle:
    // its strings go at the first collection after that.
    let mut after = held;
    let let_go = eventually(Duration::from_secs(10), || {
        assert_eq!(n.get("/gc").text(), "collected\n");
        after = common::rss_kib(worker);
        held.saturating_sub(after) > 10 * 1024
    });
    assert!(
        let_go,
        "12 MiB of strings were not let go of: RSS {held} -> {after} KiB"
    );
    n.assert_clean_log();
}

/// Reload, then quit, while tasks borrowing strings of callers gone are
/// queued behind slow ones: the old worker drops or finishes them and
/// exits cleanly; the new one borrows as usual.
#[test]
fn reload_and_quit_with_borrowed_strings_in_flight() {
    let mut n = start("16k");
    for i in 0..10 {
        assert_eq!(n.get(&format!("/hold?i={i}")).text(), "timeout\n");
    }
    reload(&n);
    for i in 10..20 {
        assert_eq!(n.get(&format!("/hold?i={i}")).text(), "timeout\n");
    }
    // the new configuration's main VM lends too
    assert_eq!(borrowed(&n, 1).0, 20);
    assert!(n.quit(Duration::from_secs(10)), "nginx did not quit");
    assert_no_errors(&n);
}

/// The shim preloaded in init_by_lua (the master's Lua VM, closed at each
/// reload with its finalizers, the sentinel's included): reloads and quit
/// stay clean, and the workers' pushes work.
#[test]
fn shim_preloaded_in_the_master() {
    let mut n = Case::new("thread_pool one threads=1;")
        .http(&format!(
            "{HTTP}\ninit_by_lua_block {{ require \"resty.threadpool\" }}"
        ))
        .start();
    for round in 0..3 {
        assert_eq!(n.get(&format!("/hold?i={round}")).text(), "timeout\n");
        assert_eq!(n.get("/gc").text(), "collected\n");
        reload(&n);
    }
    let r = n.get("/echo?pool=one&sizes=20000");
    assert_eq!(r.text(), "ok\n");
    assert!(n.quit(Duration::from_secs(10)), "nginx did not quit");
    assert_no_errors(&n);
}

#[test]
fn a_thread_keeps_its_results_alive_until_read() {
    let n = start("16k");
    for i in 0..20 {
        let size = if i % 2 == 0 { 65536 } else { 1 << 20 };
        let r = n.get(&format!("/pinned?size={size}&i={i}"));
        assert_eq!(r.text(), "ok\n", "{}", n.error_log());
    }
    n.assert_clean_log();
}

/// A thread whose Lua state runs out of memory rebuilds it; the old state
/// stays until the event loop has read the strings it returned before.
#[test]
fn results_outlive_a_rebuilt_lua_state() {
    // One process, so the limit is the pool thread's process's.
    let mut n = Case::new("thread_pool one threads=1;")
        .http(HTTP)
        .single_process()
        .wrapper(&["prlimit", &format!("--as={}", 1u64 << 30)])
        .start();
    for i in 0..3 {
        let r = n.get(&format!("/oom?i={i}"));
        assert_eq!(r.text(), "ok not enough memory\n", "{}", n.error_log());
    }
    assert!(n.quit(Duration::from_secs(10)), "nginx did not quit");
    let log = n.error_log();
    assert_eq!(log.matches("rebuilding its Lua state").count(), 3, "{log}");
    n.assert_clean_log();
}

#[test]
fn nginx_t_checks_the_size() {
    for bad in ["0", "lots", "-1"] {
        let out = Case::new("thread_pool one threads=1;")
            .http(&format!(
                "thread_pool_process_by_lua one \"return ...\";\nthread_pool_zero_copy one {bad};"
            ))
            .nginx_t();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("takes a size (16k, 1m...) or off"),
            "{bad}: {err}"
        );
    }
    // A pool named only here is an error that names the directive.
    let out = Case::new("thread_pool one threads=1;")
        .http("thread_pool_zero_copy one 16k;")
        .nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(
                "thread pool \"one\" has thread_pool_zero_copy but no thread_pool_process_by_lua in "
            ),
        "{err}"
    );
}
