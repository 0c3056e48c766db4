//! What the module promises about its threads and records, read from the
//! outside: pool threads block asynchronous signals (so nginx's QUIT, HUP
//! and friends reach the event loop), run at nice +5 relative to the
//! worker or as `thread_pool_scheduling` says, and the records of abandoned
//! tasks are reclaimed.

mod common;

use common::*;
use std::time::Duration;

/// The /proc task directories of the worker's threads named `tp NAME`.
fn pool_threads(pid: u32, pool: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = entry.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == format!("tp {pool}") {
            out.push(dir);
        }
    }
    out
}

/// A hex mask line (`SigBlk:` ...) of a task's status.
fn mask(task: &std::path::Path, field: &str) -> u64 {
    let status = std::fs::read_to_string(task.join("status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
}

/// Field `n` (1-based, as proc(5) numbers them, n > 2) of /proc/.../stat,
/// counted after the `(comm)` field, which may contain spaces.
fn stat_field(task: &std::path::Path, n: usize) -> i64 {
    let stat = std::fs::read_to_string(task.join("stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after
        .split_whitespace()
        .nth(n - 3)
        .unwrap()
        .parse()
        .unwrap()
}

fn nice(task: &std::path::Path) -> i64 {
    stat_field(task, 19)
}

/// The scheduling policy (SCHED_OTHER 0, SCHED_BATCH 3, SCHED_IDLE 5).
fn policy(task: &std::path::Path) -> i64 {
    stat_field(task, 41)
}

fn bit(sig: u32) -> u64 {
    1 << (sig - 1)
}

#[test]
fn pool_threads_block_async_signals_and_run_at_lower_priority() {
    let ngx = Case::new("thread_pool sig threads=2;")
        .http(r#"thread_pool_process_by_lua sig "return ...";"#)
        .start();
    let worker = ngx.workers()[0];
    let main = std::path::PathBuf::from(format!("/proc/{worker}/task/{worker}"));
    let (hup, quit, usr1, term, chld, alrm, io) = (1, 3, 10, 15, 17, 14, 29);
    // A thread has its name as it starts, and then blocks the signals and
    // sets its nice: on a busy machine /proc may show it in between. And
    // while the event loop starts the next thread (the watchdog), glibc's
    // pthread_create blocks every signal in it for a moment. Wait for all
    // of that to be done (the assertions below say what is not).
    let nice_want = (nice(&main) + 5).min(19);
    eventually(Duration::from_secs(10), || {
        let threads = pool_threads(worker, "sig");
        threads.len() == 2
            && threads
                .iter()
                .all(|t| mask(t, "SigBlk:") & bit(quit) != 0 && nice(t) == nice_want)
            && mask(&main, "SigBlk:") & bit(quit) == 0
    });
    let threads = pool_threads(worker, "sig");
    assert_eq!(threads.len(), 2, "pool threads of worker {worker}");
    let (segv, bus, fpe, ill) = (11, 7, 8, 4);
    for t in &threads {
        let blocked = mask(t, "SigBlk:");
        for sig in [hup, quit, usr1, term, chld, alrm, io] {
            assert_ne!(blocked & bit(sig), 0, "signal {sig} not blocked in {t:?}");
        }
        // synchronous faults stay deliverable, to the thread that faults
        for sig in [segv, bus, fpe, ill] {
            assert_eq!(blocked & bit(sig), 0, "signal {sig} blocked in {t:?}");
        }
        // (19 is the highest; the tests may themselves run under nice)
        assert_eq!(nice(t), nice_want, "nice of {t:?}");
        assert_eq!(policy(t), 0, "policy of {t:?}");
    }
    // the event loop itself takes them
    assert_eq!(mask(&main, "SigBlk:") & bit(quit), 0);
}

#[test]
fn thread_pool_scheduling_sets_policy_and_nice() {
    let ngx =
        Case::new("thread_pool b threads=1;\nthread_pool i threads=1;\nthread_pool n threads=1;")
            .http(
                r#"thread_pool_process_by_lua b "return ...";
        thread_pool_process_by_lua i "return ...";
        thread_pool_process_by_lua n "return ...";
        thread_pool_scheduling b batch nice=2;
        thread_pool_scheduling i idle;
        thread_pool_scheduling n normal nice=0;"#,
            )
            .start();
    let worker = ngx.workers()[0];
    let main = std::path::PathBuf::from(format!("/proc/{worker}/task/{worker}"));
    let want = [("b", 3, 2), ("i", 5, 5), ("n", 0, 0)];
    // each thread sets its policy, then its nice, once it has started and
    // has its name: wait for it (the assertions below say what is not)
    eventually(Duration::from_secs(10), || {
        want.iter().all(|&(pool, want_policy, want_nice)| {
            let t = pool_threads(worker, pool);
            t.len() == 1
                && policy(&t[0]) == want_policy
                && nice(&t[0]) == (nice(&main) + want_nice).min(19)
        })
    });
    for (pool, want_policy, want_nice) in want {
        let t = &pool_threads(worker, pool)[0];
        assert_eq!(policy(t), want_policy, "policy of pool {pool}");
        assert_eq!(
            nice(t),
            (nice(&main) + want_nice).min(19),
            "nice of pool {pool}"
        );
    }
    assert!(ngx
        .error_log()
        .contains("thread pool \"b\": 1 threads, queue bound 65536, batch nice=2"));
    for (args, bad) in [
        ("fast", "fast"),
        ("batch nice=20", "nice=20"),
        ("idle 3", "3"),
    ] {
        let http = format!(
            "thread_pool_process_by_lua p \"return ...\";\nthread_pool_scheduling p {args};"
        );
        let out = Case::new("thread_pool p threads=1;").http(&http).nginx_t();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "\"thread_pool_scheduling\" directive takes normal | batch | idle [nice=0..19]: invalid \"{bad}\""
            )),
            "{args}: {err}"
        );
    }
}

#[test]
fn abandoned_task_records_are_reclaimed() {
    // Each request starts 500 tasks from light threads and ends at once:
    // every task is abandoned in flight and its completion frees it. If
    // completions did not free abandoned records, every task would keep a
    // record and a semaphore: ~100,000 records here, tens of MiB.
    let abandon = r#"
        for i = 1, 500 do
            ngx.thread.spawn(function() return tp.ab:push_task(i) end)
        end
        ngx.exit(200)
"#;
    let ngx = Case::new("thread_pool ab threads=1;")
        .http(r#"thread_pool_process_by_lua ab "return ...";"#)
        .lua("/abandon", abandon)
        .lua("/ping", r#"ngx.print(tp.ab:push_task("pong"))"#)
        .start();
    let worker = ngx.workers()[0];
    // The ping queues behind the abandoned tasks: once it answers, they
    // have all completed, so at most ~500 records are ever in use at once
    // and the slab stays that size.
    let round = |n: usize| {
        for _ in 0..n {
            assert_eq!(ngx.get("/abandon").status, 200);
            assert_eq!(ngx.get("/ping").text(), "pong");
        }
    };
    round(20);
    let before = rss_kib(worker);
    round(200);
    let after = rss_kib(worker);
    assert!(
        after < before + 8 * 1024,
        "worker RSS grew from {before} to {after} KiB over 100,000 abandoned tasks"
    );
    ngx.assert_clean_log();
}

#[test]
fn memory_goes_back_after_large_payloads() {
    let echo = r#"
        local s = string.rep("x", 15 * 1024 * 1024)
        local function echo() return tp.big:push_task(s) end
        local a = ngx.thread.spawn(echo)
        local b = ngx.thread.spawn(echo)
        local _, ra = ngx.thread.wait(a)
        local _, rb = ngx.thread.wait(b)
        ngx.print(#ra, " ", #rb)
        -- the event loop's own garbage is not the module's
        s, ra, rb = nil, nil, nil
        collectgarbage()
"#;
    let ngx = Case::new("thread_pool big threads=2;")
        .http(r#"thread_pool_process_by_lua big "return (...)";"#)
        .lua("/small", r#"ngx.print(tp.big:push_task("small"))"#)
        .lua("/echo", echo)
        .start();
    let worker = ngx.workers()[0];
    assert_eq!(ngx.get("/small").text(), "small");
    let before = rss_kib(worker);
    let mut peak = before;
    for _ in 0..5 {
        assert_eq!(ngx.get("/echo").text(), "15728640 15728640");
        peak = peak.max(rss_kib(worker));
    }
    let mut after = peak;
    let settled = eventually(Duration::from_secs(10), || {
        after = rss_kib(worker);
        after < before + 32 * 1024
    });
    eprintln!("RSS KiB before {before}, peak {peak}, after {after}");
    assert!(
        settled,
        "worker RSS {after} KiB 10 s after the burst (before {before}, peak {peak})"
    );
}
