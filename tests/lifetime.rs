//! A request (or timer) that goes away while its task (or batch) is in flight: the
//! task record must outlive it, the late result must be dropped, and nothing
//! may crash or leak. And a light thread killed while its request goes on:
//! its task's record must go when the task ends.
//!
//! Each scenario runs a warm-up round, then ROUNDS more, and checks:
//! - the tasks really were in flight when their caller went away (the pool
//!   thread logs TASK-START/TASK-END; the caller logs DELIVERED only if it
//!   got the result, and the pool counts the tasks whose request went
//!   away, so a scenario that did not abort anything fails); a task of a
//!   timeout scenario ends only once its caller gave up, however late the
//!   scheduler of a busy machine runs either;
//! - the worker is the same process at the end (no crash), and error.log has
//!   no error, crit, alert or signal;
//! - the worker's RSS grew by less than RSS_BOUND_KIB over the measured
//!   rounds. Each task carries a 64 KiB argument of its own that comes back
//!   as a 64 KiB result (both borrowed, not copied, under the default
//!   `thread_pool_zero_copy`), so a leaked record, payload, anchored
//!   argument or pinned result costs at least 64 KiB per task:
//!   ROUNDS * PER_ROUND = 1,600 aborted tasks would leak >= 100 MiB. The
//!   bound leaves room for allocator and Lua GC noise (each round queues all
//!   its tasks at once, and the warm-up round has already made the heap as
//!   large as one round needs; even so the settled RSS of unchanged code
//!   grew by 0 to 17 MiB from run to run on a quiet machine, more when a
//!   busy one lets tasks pile up differently), half the smallest leak it
//!   must catch. Each task's strings are its own, so garbage is collected
//!   after each round and before RSS is read.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const PER_ROUND: usize = 200;
const ROUNDS: usize = 8;
const RSS_BOUND_KIB: u64 = 50 * 1024;
/// How long a task sleeps in its pool thread (without using CPU).
const TASK_MS: u32 = 20;

const MAIN: &str = "thread_pool slow_pool threads=4;";

/// The pool's handler sleeps `ms` with poll(2) and returns its payload; it
/// logs TASK-START and TASK-END so the tests can count tasks. With `ms`
/// -1 it waits instead until its caller gave up: until the shared dict
/// `gave_up` holds the payload's first 8 bytes (10 s at most).
const POOL: &str = r#"
    lua_shared_dict gave_up 1m;
    thread_pool_process_by_lua slow_pool "
        local ffi = require 'ffi'
        ffi.cdef 'int poll(void *fds, unsigned long nfds, int timeout);'
        local C = ffi.C
        return function(ms, payload)
            ngx.log(ngx.INFO, 'TASK-START')
            if ms < 0 then
                local key = payload:sub(1, 8)
                for _ = 1, 2000 do
                    if ngx.shared.gave_up:get(key) then break end
                    C.poll(nil, 0, 5)
                end
            else
                C.poll(nil, 0, ms)
            end
            ngx.log(ngx.INFO, 'TASK-END')
            return payload
        end
    ";
"#;

/// Locations, each ending its request while a task is in flight.
const LOCATIONS: &str = r#"
    # The handler of (a) below.
    init_by_lua_block {
        package.loaded.abort_while_running = function()
            local tp = require "resty.threadpool"
            local payload = string.format("%08x", math.random(0, 0x7fffffff)) .. string.rep("x", 65528)
            local t = ngx.thread.spawn(function()
                local res, err = tp.slow_pool:push_task(tonumber(ngx.var.arg_ms), payload)
                ngx.log(ngx.INFO, "DELIVERED ", res and #res or err)
                return res and #res or err
            end)
            -- a pool thread has taken the task before the client goes
            ngx.sleep(0.002)
            ngx.say("pushed")
            ngx.flush(true)
            ngx.say(select(2, ngx.thread.wait(t)))
        end
    }

    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;

        # (a) The client closes after reading "pushed", which comes once a
        # pool thread runs the task: the request goes while it runs. (The
        # other scenarios end most requests before a thread has taken the
        # task, which is then not run.)
        location = /abort_on {
            lua_check_client_abort on;
            content_by_lua_block { require("abort_while_running")() }
        }
        location = /abort_off {
            lua_check_client_abort off;
            content_by_lua_block { require("abort_while_running")() }
        }

        # (b) The main coroutine exits while a light thread waits: spawn
        # returns once the thread has pushed its task and yielded.
        location = /exit_thread {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local payload = string.format("%08x", math.random(0, 0x7fffffff)) .. string.rep("x", 65528)
                ngx.thread.spawn(function()
                    local res, err = tp.slow_pool:push_task(tonumber(ngx.var.arg_ms), payload)
                    ngx.log(ngx.INFO, "DELIVERED ", res and #res or err)
                end)
                ngx.say("exiting")
                ngx.exit(200)
            }
        }

        # (c) A waiting light thread is killed; the request goes on and
        # pushes another task, which must work.
        location = /kill_thread {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local payload = string.format("%08x", math.random(0, 0x7fffffff)) .. string.rep("x", 65528)
                local t = ngx.thread.spawn(function()
                    local res, err = tp.slow_pool:push_task(tonumber(ngx.var.arg_ms), payload)
                    ngx.log(ngx.INFO, "DELIVERED ", res and #res or err)
                end)
                local ok, err = ngx.thread.kill(t)
                if not ok then
                    ngx.say("kill failed: ", err)
                    return
                end
                local res, err = tp.slow_pool:push_task(0, "after kill")
                ngx.say(res or err)
            }
        }

        # (e) As (a), with a batch of two tasks (push_tasks).
        location = /abort_batch {
            lua_check_client_abort on;
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local payload = string.format("%08x", math.random(0, 0x7fffffff)) .. string.rep("x", 65528)
                local ms = tonumber(ngx.var.arg_ms)
                ngx.say("pushed")
                ngx.flush(true)
                local res, err = tp.slow_pool:push_tasks({ { ms, payload }, { ms, payload } })
                ngx.log(ngx.INFO, "DELIVERED ", res and #res[1][2] or err)
                ngx.say(res and #res or err)
            }
        }

        # (f) As (d), with a batch whose tasks end one before, one after the
        # timeout.
        location = /timeout_batch {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local key = string.format("%08x", tonumber(ngx.var.connection))
                local payload = key .. string.rep("x", 65528)
                -- a plain timeout, not a deadline: push_tasks_timeout's
                -- admission could refuse the push while the threads still
                -- end the last request's tasks (see /timeout)
                tp.slow_pool:set_timeout(0.005)
                local res, err = tp.slow_pool:push_tasks({ { 0, payload }, { -1, payload } })
                tp.slow_pool:set_timeout(60)
                ngx.shared.gave_up:set(key, true)
                if res then
                    ngx.log(ngx.INFO, "DELIVERED ", #res)
                end
                ngx.say(res and "late" or err)
            }
        }

        # (g) Light threads killed while their request goes on (as a
        # timer's loop may go on for good): each task's record, result and
        # borrowed 1 MiB argument must go once the task ends. Answers how
        # many were counted abandoned and the Lua heap in MiB after that.
        location = /kill_and_stay {
            content_by_lua_block {
                local pool = require("resty.threadpool").slow_pool
                local n, ms = tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_ms)
                local before = pool:stats().abandoned
                for i = 1, n do
                    local payload = string.format("%08x", i) .. string.rep("x", 1048568)
                    local t = ngx.thread.spawn(function()
                        return pool:push_task(ms, payload)
                    end)
                    ngx.thread.kill(t)
                end
                local deadline = ngx.now() + 10
                while pool:stats().abandoned - before < n and ngx.now() < deadline do
                    ngx.sleep(0.01)
                end
                -- the shim's finalizer lets go of the strings in one
                -- collection cycle, the next one frees them
                for _ = 1, 3 do collectgarbage() end
                ngx.say(pool:stats().abandoned - before, " ",
                        math.floor(collectgarbage("count") / 1024))
            }
        }

        # A count of the pool's stats(): "cancelled", tasks not run (their
        # caller gave up before a thread took them); "abandoned", tasks
        # whose request went away.
        location = /stat {
            content_by_lua_block {
                ngx.print(require("resty.threadpool").slow_pool:stats()[ngx.var.arg_k])
            }
        }

        # Before RSS is read: the event loop's garbage collected.
        location = /gc {
            content_by_lua_block {
                collectgarbage()
                collectgarbage()
                ngx.say("collected")
            }
        }

        # (d) The caller times out and the request ends before the result:
        # the task ends only once its caller gave up (the request's
        # connection number, unique in the worker, names it).
        location = /timeout {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local key = string.format("%08x", tonumber(ngx.var.connection))
                local payload = key .. string.rep("x", 65528)
                -- a plain timeout, not a deadline: on a busy machine the
                -- threads may still end the last requests' tasks, and
                -- push_task_timeout's admission would refuse this push;
                -- set for this push only (these requests come one by one)
                tp.slow_pool:set_timeout(0.005)
                local res, err = tp.slow_pool:push_task(-1, payload)
                tp.slow_pool:set_timeout(60)
                ngx.shared.gave_up:set(key, true)
                if res then
                    ngx.log(ngx.INFO, "DELIVERED ", #res)
                end
                ngx.say(res and "late" or err)
            }
        }
    }
"#;

fn start() -> Nginx {
    Case::new(MAIN).http(&format!("{POOL}{LOCATIONS}")).start()
}

fn count(n: &Nginx, needle: &str) -> usize {
    n.error_log().matches(needle).count()
}

fn only_worker(n: &Nginx) -> u32 {
    let w = n.workers();
    assert_eq!(w.len(), 1, "expected one worker: {w:?}");
    w[0]
}

/// Fails on a crash, an alert or an error: the log checks of the harness
/// plus [error], [crit] and segfault, and the worker's pid.
fn assert_no_crash(n: &Nginx, worker: u32) {
    n.assert_clean_log();
    let log = n.error_log();
    for bad in ["[error]", "[crit]", "segfault"] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
    assert_eq!(n.workers(), vec![worker], "the worker changed: it crashed");
}

/// Sends a GET, reads until the body shows `marker`, and closes without
/// reading the rest.
fn get_then_close(port: u16, path: &str, marker: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(marker.len()).any(|w| w == marker) {
        let k = s.read(&mut buf).expect("read before close");
        assert!(
            k > 0,
            "connection closed before {marker:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..k]);
    }
}

/// Tasks a thread had not taken yet when their caller went away, or whose
/// deadline had passed, are not run: they end without a TASK-START.
fn cancelled(n: &Nginx) -> usize {
    stat(n, "cancelled") + stat(n, "expired")
}

/// A count of the pool's stats() (see /stat).
fn stat(n: &Nginx, k: &str) -> usize {
    n.get(&format!("/stat?k={k}")).text().parse().unwrap()
}

/// Tasks that ran or were cancelled.
fn began(n: &Nginx) -> usize {
    count(n, "TASK-START") + cancelled(n)
}

/// Tasks that ended or were cancelled.
fn ended(n: &Nginx) -> usize {
    count(n, "TASK-END") + cancelled(n)
}

/// Runs `round` (which starts PER_ROUND tasks of the slow pool per call)
/// once as warm-up and ROUNDS times measured; after each round waits until
/// every task started so far has ended. Asserts the RSS bound.
fn measure(n: &Nginx, tasks_per_round: usize, mut round: impl FnMut()) {
    let worker = only_worker(n);
    let mut started = 0;
    let ended = || ended(n);
    let mut run_round = |started: &mut usize| {
        round();
        *started += tasks_per_round;
        let want = *started;
        assert!(
            eventually(Duration::from_secs(30), || ended() >= want),
            "only {} of {want} tasks ended",
            ended()
        );
        assert_eq!(began(n), want, "unexpected number of tasks");
        // a round's garbage goes before the next
        assert_eq!(n.get("/gc").text(), "collected\n");
    };
    run_round(&mut started);
    let before = settled_rss(n, worker);
    for _ in 0..ROUNDS {
        run_round(&mut started);
    }
    let after = settled_rss(n, worker);
    assert!(
        before > 0 && after > 0,
        "cannot read RSS of worker {worker}"
    );
    assert_eq!(ended(), started, "more tasks ended than started");
    assert_no_crash(n, worker);
    let growth = after.saturating_sub(before);
    eprintln!(
        "RSS {before} KiB -> {after} KiB (+{growth} KiB) over {} tasks",
        ROUNDS * tasks_per_round
    );
    assert!(
        growth < RSS_BOUND_KIB,
        "worker RSS grew by {growth} KiB over {} tasks ({before} -> {after} KiB)",
        ROUNDS * tasks_per_round
    );
}

/// The worker's RSS once garbage is collected: the pool threads' when they
/// have been idle for a second after large payloads (src/thread/run.rs),
/// then the event loop's (whose collection also lets go of the borrowed
/// strings of callers that went away). Every task's strings are its own,
/// so garbage of a round would otherwise show as growth.
fn settled_rss(n: &Nginx, worker: u32) -> u64 {
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(n.get("/gc").text(), "collected\n");
    rss_kib(worker)
}

/// (a) `count` requests to /abort_on or /abort_off, each closed by the
/// client while its task of `ms` is in flight.
fn abort_requests(n: &Nginx, location: &str, ms: u32, count: usize) {
    let path = format!("{location}?ms={ms}");
    for _ in 0..count {
        get_then_close(n.port, &path, b"pushed");
    }
}

/// (b), (c), (d): `count` requests to `location`, each answered with `want`
/// while a task of `ms` is still in flight.
fn early_end_requests(n: &Nginx, location: &str, want: &str, ms: u32, count: usize) {
    let path = format!("{location}?ms={ms}");
    for _ in 0..count {
        let r = n.get(&path);
        assert_eq!((r.status, r.text().as_str()), (200, want), "{path}");
    }
}

#[test]
fn client_abort_with_check_client_abort_on() {
    let n = start();
    measure(&n, PER_ROUND, || {
        abort_requests(&n, "/abort_on", TASK_MS, PER_ROUND)
    });
    // nginx saw the closes and ended the requests (499) while their tasks
    // ran: those results had nobody to go to. (How many: as many as the
    // client closed within a task's 20 ms, which a busy machine decides.)
    assert_aborted(&n);
}

/// Some requests went away while their tasks were in flight, and their
/// results were not delivered.
fn assert_aborted(n: &Nginx) {
    let total = (ROUNDS + 1) * PER_ROUND;
    let (abandoned, delivered) = (stat(n, "abandoned"), count(n, "DELIVERED"));
    eprintln!("{abandoned} tasks abandoned, {delivered} of {total} requests delivered");
    assert!(
        abandoned > 0 && delivered < total,
        "{abandoned} tasks abandoned, {delivered} of {total} results delivered: \
         the aborts did not end the requests"
    );
}

#[test]
fn client_abort_with_check_client_abort_off() {
    let n = start();
    measure(&n, PER_ROUND, || {
        abort_requests(&n, "/abort_off", TASK_MS, PER_ROUND)
    });
    // Without the check nginx does not notice the close while the task
    // runs: every result reaches its request, whose response then goes to a
    // closed socket.
    let total = (ROUNDS + 1) * PER_ROUND;
    assert!(
        eventually(Duration::from_secs(10), || count(&n, "DELIVERED 65536")
            == total),
        "{} of {total} results delivered",
        count(&n, "DELIVERED 65536")
    );
}

#[test]
fn exit_while_light_thread_waits() {
    let n = start();
    measure(&n, PER_ROUND, || {
        early_end_requests(&n, "/exit_thread", "exiting\n", TASK_MS, PER_ROUND)
    });
    assert_eq!(
        count(&n, "DELIVERED"),
        0,
        "a light thread survived ngx.exit"
    );
}

#[test]
fn kill_waiting_light_thread_then_push_again() {
    let n = start();
    measure(&n, 2 * PER_ROUND, || {
        early_end_requests(&n, "/kill_thread", "after kill\n", TASK_MS, PER_ROUND)
    });
    assert_eq!(
        count(&n, "DELIVERED"),
        0,
        "a killed light thread got its result"
    );
}

/// (g): a killed light thread's task is let go of when it ends, not when
/// its request does.
#[test]
fn killed_light_threads_let_go_while_the_request_goes_on() {
    const KILLED: usize = 32;
    let n = start();
    let worker = only_worker(&n);
    let out = n
        .get(&format!("/kill_and_stay?n={KILLED}&ms={TASK_MS}"))
        .text();
    let figures: Vec<usize> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(figures.len(), 2, "unexpected answer {out:?}");
    assert_eq!(
        figures[0], KILLED,
        "tasks of killed light threads counted abandoned"
    );
    assert!(
        figures[1] < KILLED / 4,
        "{} MiB of Lua heap once the tasks of {KILLED} killed light threads ended: \
         their 1 MiB arguments are still anchored",
        figures[1]
    );
    assert_no_crash(&n, worker);
}

#[test]
fn timeout_then_request_ends_before_result() {
    let n = start();
    measure(&n, PER_ROUND, || {
        early_end_requests(&n, "/timeout", "timeout\n", TASK_MS, PER_ROUND)
    });
    assert_eq!(count(&n, "DELIVERED"), 0, "a timed-out task was delivered");
}

#[test]
fn client_abort_during_a_batch() {
    let n = start();
    measure(&n, 2 * PER_ROUND, || {
        abort_requests(&n, "/abort_batch", TASK_MS, PER_ROUND)
    });
    assert_aborted(&n);
}

#[test]
fn batch_timeout_then_request_ends_before_results() {
    let n = start();
    measure(&n, 2 * PER_ROUND, || {
        early_end_requests(&n, "/timeout_batch", "timeout\n", TASK_MS, PER_ROUND)
    });
    assert_eq!(count(&n, "DELIVERED"), 0, "a timed-out batch was delivered");
}

/// Scenarios (a) to (f) once in nginx run by valgrind's memcheck (`make
/// valgrind`; not part of `make test`: it takes up to a minute). nginx runs
/// as a single process, so the process valgrind watches is the one whose
/// requests end under their tasks; after the requests it quits and valgrind
/// checks for leaks. Fails on any memory error or definite leak that
/// tests/valgrind.supp does not name (it names nginx's own). Tasks take
/// 200 ms: the event loop is slow under valgrind, and the requests must
/// still end while their tasks run.
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn abort_scenarios_under_valgrind() {
    const MS: u32 = 200;
    const COUNT: usize = 20;
    let mut n = Case::new(MAIN)
        .http(&format!("{POOL}{LOCATIONS}"))
        .under_valgrind()
        .start();
    abort_requests(&n, "/abort_on", MS, COUNT);
    abort_requests(&n, "/abort_off", MS, COUNT);
    early_end_requests(&n, "/exit_thread", "exiting\n", MS, COUNT);
    early_end_requests(&n, "/kill_thread", "after kill\n", MS, COUNT);
    early_end_requests(&n, "/timeout", "timeout\n", MS, COUNT);
    abort_requests(&n, "/abort_batch", MS, COUNT);
    early_end_requests(&n, "/timeout_batch", "timeout\n", MS, COUNT);
    // Quit only when idle: a single process exits at once on QUIT, and a
    // request still open then would show as nginx's leak, not ours.
    let tasks = 10 * COUNT;
    let idle = eventually(Duration::from_secs(120), || {
        ended(&n) == tasks && count(&n, "DELIVERED") >= COUNT
    });
    assert!(idle, "tasks or requests did not finish:\n{}", n.error_log());
    assert_eq!(began(&n), tasks);
    // The last responses are written right after their DELIVERED line.
    n.quit_under_valgrind();
    n.assert_clean_log();
}

/// A timer in init_worker pushes 200 ms tasks in a loop until the worker
/// exits; `sig` ends the worker while one is in flight.
fn timer_at_shutdown(sig: &str) -> Nginx {
    let http = format!(
        r#"{POOL}
    init_worker_by_lua_block {{
        local tp = require "resty.threadpool"
        local function loop(premature)
            if premature then
                return
            end
            while not ngx.worker.exiting() do
                local res, err = tp.slow_pool:push_task(200, "tick")
                ngx.log(ngx.INFO, "TIMER-TICK ", res or err)
            end
            ngx.log(ngx.INFO, "TIMER-EXIT")
        end
        assert(ngx.timer.at(0, loop))
    }}
    server {{ listen 127.0.0.1:$PORT; location / {{ return 200; }} }}
"#
    );
    let mut n = Case::new(MAIN).http(&http).start();
    let worker = only_worker(&n);
    assert!(
        eventually(Duration::from_secs(10), || count(&n, "TIMER-TICK tick")
            >= 2),
        "the timer's tasks do not complete:\n{}",
        n.error_log()
    );
    // The loop pushes the next task at once, so a task is almost always in
    // flight; wait for a moment when the log shows one.
    assert!(
        eventually(Duration::from_secs(5), || count(&n, "TASK-START")
            > count(&n, "TIMER-TICK")),
        "no task in flight"
    );
    n.signal(sig);
    assert!(
        n.wait_exit(Duration::from_secs(10)),
        "nginx did not exit after {sig}"
    );
    let log = n.error_log();
    assert!(
        log.contains(&format!("worker process {worker} exited with code 0")),
        "the worker did not exit cleanly after {sig}:\n{log}"
    );
    assert_no_crash_after_exit(&n);
    n
}

fn assert_no_crash_after_exit(n: &Nginx) {
    n.assert_clean_log();
    let log = n.error_log();
    for bad in ["[error]", "[crit]", "segfault", "still running at exit"] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
}

#[test]
fn timer_waiting_at_graceful_shutdown() {
    let n = timer_at_shutdown("QUIT");
    // Graceful: the timer's last task completed and its loop saw exiting().
    assert!(n.error_log().contains("TIMER-EXIT"), "{}", n.error_log());
    assert_eq!(count(&n, "TASK-START"), count(&n, "TASK-END"));
    assert_eq!(count(&n, "TASK-START"), count(&n, "TIMER-TICK tick"));
}

#[test]
fn timer_waiting_at_fast_shutdown() {
    let n = timer_at_shutdown("TERM");
    // Fast: the worker leaves the timer's coroutine waiting; exit joins the
    // pool thread once the running task returns, and frees the record.
    assert!(!n.error_log().contains("TIMER-EXIT"), "{}", n.error_log());
    assert_eq!(count(&n, "TASK-START"), count(&n, "TASK-END"));
    assert_eq!(count(&n, "TASK-START"), count(&n, "TIMER-TICK tick") + 1);
}
