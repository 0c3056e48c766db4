//! Reload (HUP) and graceful quit (QUIT) with tasks in flight; reloads that
//! change the pool or fail.
//!
//! A worker's threads are its main thread, the threads of our pool and
//! those of nginx's own pools (nginx starts them for every declared pool we
//! do not take over), so each worker must have exactly
//! 1 + slow_threads + IO_THREADS threads, slow_threads of them named after
//! our pool.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;

const WORKERS: usize = 2;
const IO_THREADS: usize = 2;
/// How long a worker may take to exit once its last task is done.
const EXIT_BOUND: Duration = Duration::from_secs(10);

fn main_conf(slow_threads: usize) -> String {
    format!(
        "thread_pool slow_pool threads={slow_threads};\nthread_pool io_pool threads={IO_THREADS};"
    )
}

/// `process` is the pool's handler chunk (a reload may change it).
fn http_conf(process: &str) -> String {
    format!(
        r#"
    thread_pool_process_by_lua slow_pool "{process}";
    server {{
        listen 127.0.0.1:$PORT;
        location = /slow {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local gate = ngx.var.arg_gate and ngx.config.prefix() .. "conf/gate"
                local res, err = tp.slow_pool:push_task(gate, ngx.var.arg_tag)
                ngx.say(ngx.worker.pid(), " ", res or err)
            }}
        }}
    }}
"#
    )
}

/// Returns "done TAG"; given a gate file, first waits until the test
/// creates it (polling without CPU), so the test decides when tasks end.
const HANDLER: &str = r#"
        local ffi = require 'ffi'
        ffi.cdef 'int poll(void *fds, unsigned long nfds, int timeout);'
        local C = ffi.C
        return function(gate, tag)
            ngx.log(ngx.INFO, 'TASK-START ', tag)
            while gate do
                local f = io.open(gate)
                if f then
                    f:close()
                    break
                end
                C.poll(nil, 0, 10)
            end
            return 'done ' .. tag
        end
"#;

/// The same handler, answering differently: proves a reload took effect.
const HANDLER_V2: &str = r#"
        return function(gate, tag)
            return 'v2 ' .. tag
        end
"#;

/// Starts nginx and waits for all its workers and their threads.
fn start(slow_threads: usize) -> (Nginx, BTreeSet<u32>) {
    let n = Case::new(&main_conf(slow_threads))
        .http(&http_conf(HANDLER))
        .workers(WORKERS)
        .start();
    let ok = eventually(Duration::from_secs(10), || workers(&n).len() == WORKERS);
    assert!(ok, "workers: {:?}", workers(&n));
    let pids = workers(&n);
    assert_threads(&pids, slow_threads);
    (n, pids)
}

/// Replaces nginx.conf (same port) for the next reload.
fn rewrite(n: &Nginx, main: &str, http: &str) {
    Case::new(main).http(http).workers(WORKERS).rewrite(n);
}

/// Threads of `pid` whose name is `name`.
fn named_threads(pid: u32, name: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Waits until every worker in `pids` has its full set of threads: nginx
/// starts them in init_process, after the worker is visible.
fn assert_threads(pids: &BTreeSet<u32>, slow_threads: usize) {
    // the event loop, the pools' threads, the slow-task watchdog and the
    // update thread
    let want = 1 + slow_threads + IO_THREADS + 1 + 1;
    for &pid in pids {
        let ok = eventually(Duration::from_secs(10), || {
            thread_count(pid) == want && named_threads(pid, "tp slow_pool") == slow_threads
        });
        assert!(
            ok,
            "worker {pid}: {} threads ({} of our pool), expected {want} ({slow_threads})",
            thread_count(pid),
            named_threads(pid, "tp slow_pool")
        );
    }
}

fn workers(n: &Nginx) -> BTreeSet<u32> {
    n.workers().into_iter().collect()
}

/// Waits for WORKERS workers none of which is in `old`.
fn wait_new_workers(n: &Nginx, old: &BTreeSet<u32>) -> BTreeSet<u32> {
    let mut new = BTreeSet::new();
    let ok = eventually(Duration::from_secs(10), || {
        new = workers(n).difference(old).copied().collect();
        new.len() == WORKERS
    });
    assert!(
        ok,
        "new workers did not start: {:?}\n{}",
        workers(n),
        n.error_log()
    );
    new
}

/// Starts `count` /slow requests in threads, each waiting for the gate,
/// and waits until all their tasks run in pool threads.
fn start_slow(n: &Nginx, count: usize) -> Vec<std::thread::JoinHandle<(u32, String)>> {
    let started = n.error_log().matches("TASK-START").count();
    let clients = (0..count)
        .map(|i| {
            let port = n.port;
            std::thread::spawn(move || {
                let r = request(port, "GET", &format!("/slow?gate=1&tag=t{i}"), &[], b"");
                assert_eq!(r.status, 200);
                let text = r.text();
                let (pid, rest) = text.trim_end().split_once(' ').unwrap();
                (pid.parse().unwrap(), rest.to_string())
            })
        })
        .collect();
    let ok = eventually(Duration::from_secs(10), || {
        n.error_log().matches("TASK-START").count() == started + count
    });
    assert!(ok, "the tasks did not start:\n{}", n.error_log());
    clients
}

/// The workers that have started a task (from the pid in the log lines
/// "... [info] PID#TID: ... TASK-START ...").
fn busy_workers(n: &Nginx) -> BTreeSet<u32> {
    n.error_log()
        .lines()
        .filter(|l| l.contains("TASK-START"))
        .filter_map(|l| l.split_whitespace().nth(3)?.split('#').next()?.parse().ok())
        .collect()
}

/// Lets every task waiting for the gate finish.
fn open_gate(n: &Nginx) {
    std::fs::write(n.dir.join("conf/gate"), "").unwrap();
}

/// Waits until each of `pids` has logged that it quits: from then on it
/// accepts no connections (after a reload the master signals the old
/// workers 100 ms after starting the new ones).
fn wait_shutting_down(n: &Nginx, pids: &BTreeSet<u32>) {
    let ok = eventually(Duration::from_secs(10), || {
        let log = n.error_log();
        pids.iter()
            .all(|pid| log.contains(&format!("{pid}#{pid}: gracefully shutting down")))
    });
    assert!(
        ok,
        "workers {pids:?} were not told to quit:\n{}",
        n.error_log()
    );
}

/// Asserts every in-flight request got its own result from a worker in
/// `served_by`.
fn assert_finished(
    clients: Vec<std::thread::JoinHandle<(u32, String)>>,
    served_by: &BTreeSet<u32>,
) {
    for (i, c) in clients.into_iter().enumerate() {
        let (pid, body) = c.join().expect("an in-flight request failed");
        assert_eq!(body, format!("done t{i}"));
        assert!(
            served_by.contains(&pid),
            "served by {pid}, not one of {served_by:?}"
        );
    }
}

/// The pid that answered a quick request, and its body.
fn quick(n: &Nginx, tag: &str) -> (u32, String) {
    let r = n.get(&format!("/slow?tag={tag}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let (pid, rest) = text.trim_end().split_once(' ').unwrap();
    (pid.parse().unwrap(), rest.to_string())
}

fn assert_exited(n: &Nginx, pids: &BTreeSet<u32>) {
    let ok = eventually(EXIT_BOUND, || workers(n).is_disjoint(pids));
    assert!(
        ok,
        "old workers still running: {:?}",
        workers(n).intersection(pids)
    );
    // The master logs a worker's exit when it reaps it, which may come
    // after the worker is gone from its children.
    let logged = |log: &str, pid: &u32| log.contains(&format!("worker process {pid} exited"));
    eventually(EXIT_BOUND, || {
        let log = n.error_log();
        pids.iter().all(|pid| logged(&log, pid))
    });
    let log = n.error_log();
    for pid in pids {
        assert!(
            log.contains(&format!("worker process {pid} exited with code 0")),
            "worker {pid} did not exit cleanly:\n{log}"
        );
    }
    assert!(!log.contains("still running at exit"), "{log}");
}

#[test]
fn reload_with_tasks_in_flight() {
    let (n, old) = start(4);
    let clients = start_slow(&n, 4);

    rewrite(&n, &main_conf(4), &http_conf(HANDLER_V2));
    n.signal("HUP");
    let new = wait_new_workers(&n, &old);
    assert_threads(&new, 4);
    wait_shutting_down(&n, &old);
    // The old workers still run the tasks; new requests go to new workers
    // and their new handler.
    for i in 0..8 {
        let (pid, body) = quick(&n, &format!("q{i}"));
        assert!(
            new.contains(&pid),
            "served by {pid}, not a new worker {new:?}"
        );
        assert_eq!(body, format!("v2 q{i}"));
    }
    // The old workers wait for their tasks, threads and all (one that got
    // no task may be gone already).
    assert!(clients.iter().all(|c| !c.is_finished()));
    assert_threads(&busy_workers(&n), 4);
    open_gate(&n);
    assert_finished(clients, &old);
    assert_exited(&n, &old);
    assert_eq!(workers(&n), new);
    n.assert_clean_log();
}

#[test]
fn quit_with_tasks_in_flight() {
    let (mut n, old) = start(4);
    let clients = start_slow(&n, 4);
    n.signal("QUIT");
    wait_shutting_down(&n, &old);
    assert!(clients.iter().all(|c| !c.is_finished()));
    assert!(
        !n.wait_exit(Duration::ZERO),
        "nginx exited with tasks in flight"
    );
    assert!(busy_workers(&n).is_subset(&workers(&n)));
    open_gate(&n);
    assert_finished(clients, &old);
    assert!(n.wait_exit(EXIT_BOUND), "nginx did not exit after QUIT");
    let log = n.error_log();
    for pid in &old {
        assert!(
            log.contains(&format!("worker process {pid} exited with code 0")),
            "worker {pid} did not exit cleanly:\n{log}"
        );
    }
    n.assert_clean_log();
}

#[test]
fn reload_changes_thread_count() {
    let (n, old) = start(1);
    rewrite(&n, &main_conf(3), &http_conf(HANDLER));
    n.signal("HUP");
    let new = wait_new_workers(&n, &old);
    assert_threads(&new, 3);
    assert_exited(&n, &old);
    let (pid, body) = quick(&n, "after");
    assert!(new.contains(&pid));
    assert_eq!(body, "done after");
    n.assert_clean_log();
}

/// A reload whose configuration does not load keeps the old workers, which
/// go on serving; `expect` is the error the master logs.
fn failed_reload_keeps_workers(main: &str, http: &str, expect: &str) {
    let (n, old) = start(2);
    rewrite(&n, main, http);
    n.signal("HUP");
    let ok = eventually(Duration::from_secs(10), || n.error_log().contains(expect));
    assert!(ok, "no {expect:?} in the log:\n{}", n.error_log());
    // The master has given up on the new configuration: the same workers
    // serve, with the old handler.
    assert_eq!(workers(&n), old);
    assert_threads(&old, 2);
    for i in 0..4 {
        let (pid, body) = quick(&n, &format!("k{i}"));
        assert!(old.contains(&pid));
        assert_eq!(body, format!("done k{i}"));
    }
    assert_eq!(workers(&n), old);
    let log = n.error_log();
    for bad in ["[alert]", "signal 11", "exited on signal"] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
}

#[test]
fn reload_with_nginx_syntax_error_keeps_old_workers() {
    let http = format!("{}\n    no_such_directive on;", http_conf(HANDLER));
    failed_reload_keeps_workers(
        &main_conf(3),
        &http,
        "unknown directive \"no_such_directive\"",
    );
}

#[test]
fn reload_with_lua_syntax_error_keeps_old_workers() {
    // Our directive compiles the chunk at configuration time.
    let http = http_conf("return function( end");
    failed_reload_keeps_workers(&main_conf(3), &http, "failed to compile");
}
