//! The event loop's poll for completions (src/ngx/notify.rs): a caller
//! pushing one task after another gets most completions without the
//! event loop sleeping in epoll_wait, and without the pool thread writing
//! the eventfd. Alone in its test binary: a test loading the cores beside
//! it would slow the pool thread past the poll.

mod common;

use common::*;

/// A caller pushing one task after another: the event loop polls for each
/// completion before it sleeps (src/ngx/notify.rs), so most of them reach
/// it without the eventfd's wake-up, and its thread sleeps (a voluntary
/// context switch, /proc/self/status of the worker's main thread) far less
/// than once per task. Without the poll it sleeps in epoll_wait once per
/// task, each completion waking it: the count is TASKS (measured: 2000 of
/// 2000; with the poll 1-3 on a quiet machine). The bound leaves room for
/// a busy one.
///
/// While the event loop polls, the pool thread's wake-up is the flag
/// alone: it writes the eventfd (a write system call, counted in
/// /proc/PID/task/TID/io) for few of the tasks. Writing it whatever the
/// poll, it makes a write per task (measured: 2,100 for the 2,100 with the
/// warm-up; 0-2 without). A run that misses either bound is tried again,
/// up to ATTEMPTS runs.
#[test]
fn the_event_loop_polls_for_a_sequential_callers_completions() {
    const TASKS: usize = 2000;
    const HTTP: &str = r#"
    thread_pool_process_by_lua seq "return (...) + 1";
    server {
        listen 127.0.0.1:$PORT;
        location = /seq {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local function sleeps()
                    local f = assert(io.open("/proc/self/status"))
                    local s = f:read("*a")
                    f:close()
                    return tonumber(s:match("\nvoluntary_ctxt_switches:%s*(%d+)"))
                end
                local n = tonumber(ngx.var.arg_n)
                -- the poll adapts to how soon completions come: warm it
                for i = 1, 100 do
                    assert(tp.seq:push_task(i) == i + 1)
                end
                local before = sleeps()
                for i = 1, n do
                    local res, err = tp.seq:push_task(i)
                    if res ~= i + 1 then
                        ngx.say("task ", i, ": ", tostring(res), " ", tostring(err))
                        return
                    end
                end
                ngx.say(sleeps() - before)
            }
        }
    }
"#;
    // The poll stops while completions come late (a pool thread the host
    // set aside), and on a busy host the wake-ups that replace it keep them
    // late: each run has an nginx of its own, whose poll starts afresh.
    // Without the poll every run shows a sleep and a write per task.
    let mut runs = Vec::new();
    for _ in 0..ATTEMPTS {
        let n = Nginx::start_with(1, "thread_pool seq threads=1;", HTTP, &[]);
        let worker = n.workers()[0];
        let writes_before = pool_thread_writes(worker);
        let r = n.get(&format!("/seq?n={TASKS}"));
        let writes = pool_thread_writes(worker) - writes_before;
        let sleeps: usize = r
            .text()
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{}", r.text()));
        runs.push((sleeps, writes));
        if sleeps < TASKS * 9 / 10 && writes < TASKS as u64 / 2 {
            n.assert_clean_log();
            return;
        }
    }
    panic!("for {TASKS} tasks, each run's event-loop sleeps and pool-thread write calls: {runs:?}");
}

/// Runs of the sequential caller before the poll is taken to be missing.
const ATTEMPTS: usize = 3;

/// Write system calls made so far by the threads of pool "seq" in process
/// `pid` (their /proc io counters).
fn pool_thread_writes(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the worker's threads");
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "tp seq")
        })
        .map(|t| {
            let io = std::fs::read_to_string(t.path().join("io")).expect("the thread's io");
            io.lines()
                .find_map(|l| l.strip_prefix("syscw:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("syscw")
        })
        .sum()
}
