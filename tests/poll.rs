//! The event loop's poll for completions (src/ngx/notify.rs): a caller
//! pushing one task after another gets most completions without the
//! event loop sleeping in epoll_wait. Alone in its test binary: a test
//! loading the cores beside it would slow the pool thread past the poll.

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
#[test]
fn the_event_loop_polls_for_a_sequential_callers_completions() {
    const TASKS: usize = 2000;
    let n = Nginx::start_with(
        1,
        "thread_pool seq threads=1;",
        r#"
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
"#,
        &[],
    );
    let r = n.get(&format!("/seq?n={TASKS}"));
    let sleeps: usize = r
        .text()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}", r.text()));
    assert!(
        sleeps < TASKS * 9 / 10,
        "the event loop slept {sleeps} times for {TASKS} tasks"
    );
    n.assert_clean_log();
}
