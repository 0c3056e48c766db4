//! Nothing a handler does takes the worker down: errors raised by
//! finalizers (during the task or during a later one) are logged and fail
//! no task, error objects whose `__tostring` fails and running out of
//! memory become `nil, err` for their caller, and the thread goes on
//! serving (its rebuilt state's time counted as the next task's wait).

mod common;

use common::{Case, Nginx};
use std::time::Duration;

const HANDLER: &str = r#"
local ffi = require "ffi"

local function bad_cdata()
    return ffi.gc(ffi.new("char[?]", 1024), function() error("finalizer boom") end)
end

local function bad_proxy()
    local p = newproxy(true)
    getmetatable(p).__gc = function() error("proxy boom") end
    return p
end

-- Allocates until the collector has run several full cycles.
local function churn()
    for _ = 1, 20 do
        local t = {}
        for i = 1, 20000 do t[i] = { i } end
    end
    collectgarbage()
end

return function(op)
    if op == "gc in task" then
        for _ = 1, 100 do bad_cdata() end
        churn()
        return "survived"
    elseif op == "proxy in task" then
        for _ = 1, 100 do bad_proxy() end
        churn()
        return "survived"
    elseif op == "leave garbage" then
        for _ = 1, 100 do bad_cdata() bad_proxy() end
        return "left"
    elseif op == "innocent" then
        churn()
        return "innocent"
    elseif op == "bad tostring" then
        -- cannot cross (a function inside), and has no text either
        error(setmetatable({ f = print }, { __tostring = function() error("no text") end }))
    elseif op == "oom" then
        local t = {}
        local i = 0
        while true do
            i = i + 1
            t[i] = ("x"):rep(1024 * 1024) .. i
        end
    end
    return op
end
"#;

const LOCATIONS: &str = r#"
    server {
        listen 127.0.0.1:$PORT;
        location / {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local res, err = tp.iso:push_task(ngx.unescape_uri(ngx.var.arg_op))
                ngx.print(tostring(res), " ", tostring(err))
            }
        }
        location /static { return 200 "static"; }
    }
"#;

fn http() -> String {
    format!("thread_pool_process_by_lua_block iso {{ {HANDLER} }}\n{LOCATIONS}")
}

fn start() -> Nginx {
    Case::new("thread_pool iso threads=1;")
        .http(&http())
        .start()
}

fn call(ngx: &Nginx, op: &str) -> String {
    let resp = common::try_request(
        ngx.port,
        "GET",
        &format!("/?op={}", op.replace(' ', "%20")),
        &[],
        b"",
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{op}: no response ({e})\nerror.log:\n{}", ngx.error_log()));
    resp.text()
}

/// The failing finalizers were logged, and the worker was not replaced.
fn assert_logged_and_alive(ngx: &Nginx, pid: Vec<u32>) {
    assert_eq!(ngx.workers(), pid, "the worker was replaced");
    assert!(
        ngx.error_log().contains("a finalizer failed ("),
        "{}",
        ngx.error_log()
    );
    ngx.assert_clean_log();
}

#[test]
fn finalizer_errors_during_the_task_fail_no_task() {
    let ngx = start();
    let pid = ngx.workers();
    // proxy first: on LuaJIT its error, raised from the task's
    // allocations, crashes the process (it does on the event loop too)
    for op in ["proxy in task", "gc in task"] {
        assert_eq!(call(&ngx, op), "survived nil", "{op}");
        assert_eq!(call(&ngx, "ping"), "ping nil", "after {op}");
    }
    assert_logged_and_alive(&ngx, pid);
}

#[test]
fn finalizer_errors_during_a_later_task_fail_no_task() {
    let ngx = start();
    let pid = ngx.workers();
    for _ in 0..3 {
        assert_eq!(call(&ngx, "leave garbage"), "left nil");
        assert_eq!(call(&ngx, "innocent"), "innocent nil");
    }
    assert_eq!(ngx.get("/static").text(), "static");
    assert_logged_and_alive(&ngx, pid);
}

#[test]
fn an_error_object_whose_tostring_fails_is_named_by_its_type() {
    let ngx = start();
    assert_eq!(call(&ngx, "bad tostring"), "nil error object is a table");
    assert_eq!(call(&ngx, "ping"), "ping nil");
    ngx.assert_clean_log();
}

/// One nginx process (so that the limit is the pool thread's process's)
/// with 1 GiB of address space, and pool iso of one thread.
fn start_with_1_gib(http: &str) -> Nginx {
    Case::new("thread_pool iso threads=1;")
        .http(http)
        .single_process()
        .wrapper(&["prlimit", &format!("--as={}", 1u64 << 30)])
        .start()
}

/// The state rebuilt after a task ran out of memory (1.5 s here: its init
/// chunk sleeps) counts in the wait of the task queued behind, not in its
/// run.
#[test]
fn a_rebuild_counts_in_the_next_tasks_wait() {
    let http = format!(
        r#"
    thread_pool_init_by_lua_block iso {{
        local ffi = require "ffi"
        ffi.cdef "int tp_test_poll(void *, unsigned long, int) asm(\"poll\");"
        ffi.C.tp_test_poll(nil, 0, 1500)
    }}
    thread_pool_process_by_lua_block iso {{ {HANDLER} }}
    server {{
        listen 127.0.0.1:$PORT;
        location / {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                if ngx.var.arg_warm then
                    return ngx.print(tp.iso:push_task("ping"))
                end
                local before = tp.iso:stats()
                local res = assert(tp.iso:push_tasks({{ {{ "oom" }}, {{ "ping" }} }}))
                local s = tp.iso:stats()
                -- the oom task waits for nothing and runs for T; ping
                -- waits T and the rebuild, and runs for next to nothing
                local waited = s.wait.sum - before.wait.sum
                local ran = s.run.sum - before.run.sum
                ngx.print(res[1][2], " ", res[2][2], " ", waited - ran > 1.2)
            }}
        }}
    }}"#
    );
    let mut ngx = start_with_1_gib(&http);
    // the thread's first state is built (1.5 s) before the batch
    assert_eq!(ngx.get("/?warm=1").text(), "ping");
    assert_eq!(ngx.get("/").text(), "not enough memory ping true");
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
}

#[test]
fn running_out_of_memory_is_an_error_and_the_thread_recovers() {
    let mut ngx = start_with_1_gib(&http());
    for _ in 0..2 {
        assert_eq!(call(&ngx, "oom"), "nil not enough memory");
        assert_eq!(call(&ngx, "ping"), "ping nil");
    }
    assert_eq!(ngx.get("/static").text(), "static");
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
    let log = ngx.error_log();
    assert!(log.contains("not enough memory"), "{log}");
    assert!(log.contains("rebuilding its Lua state"), "{log}");
    for bad in [
        "exited on signal",
        "signal 6",
        "panic",
        "[alert]",
        "[emerg]",
    ] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
}
