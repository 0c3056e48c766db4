//! Memory exhaustion never aborts the process: a task whose Lua state runs
//! out of memory, by many small allocations (a growing table, strings made
//! by concatenation, growing `string.buffer`s: kept in lists, so that no
//! large block is the one that fails and the memory is spent to its last
//! bytes) or one huge one (refused whole), or that
//! catches its memory error and goes on, gets `nil, "not enough memory"`;
//! the thread says so in a warn line and rebuilds its state, and the same
//! process serves on: the pool, a Rust pool beside it, the event loop.
//! Each kind runs several times in one nginx, as one process under an
//! address-space limit (`prlimit --as`), so that the memory that runs out
//! is the whole process's. On the event loop, the same Lua fails with
//! lua-nginx-module's own "not enough memory" error.

mod common;

use common::handlers::rust_fixture;
use common::{Case, Nginx};
use std::time::Duration;

/// The handler, run in pool `lua` and, for comparison, on the event loop.
const HANDLER: &str = r#"
local buffer = require "string.buffer"

local function table_of_tables()
    local t = {}
    local i = 0
    while true do
        i = i + 1
        t[i] = { i, i, i, i, i, i, i, i }
    end
end

-- Interpreted: a memory error raised in a compiled trace of these puts
-- crashes LuaJIT 2.1-20230119, on the event loop too (docs/isolation.md).
local function buffers()
    local list
    while true do
        local b = buffer.new()
        for _ = 1, 4096 do
            b:put("0123456789abcdef")
        end
        list = { b, list }
    end
end
jit.off(buffers, true)

return function(op)
    if op == "table" then
        table_of_tables()
    elseif op == "concat" then
        local line = ("x"):rep(1000)
        local list
        local i = 0
        while true do
            i = i + 1
            list = { line .. i, list }
        end
    elseif op == "buffer" then
        buffers()
    elseif op == "huge" then
        return #("x"):rep(1.5 * 2 ^ 30)
    elseif op == "caught" then
        local ok, err = pcall(table_of_tables)
        return "caught: " .. tostring(ok) .. " " .. tostring(err)
    end
    return op
end
"#;

/// The process's address space: what nginx, its threads and their stacks
/// start in with room to spare, and a memory that runs out in seconds.
const LIMIT: u64 = 1 << 30;

/// How many times each kind runs in one process.
const ROUNDS: usize = 3;

/// How long a request may take, and nginx to start or quit. A round takes
/// seconds on an idle machine, but garbage collections over a full memory
/// and the close of the state that holds it slow down with the machine's
/// load: a round took over 60 s (push_task's default timeout) with
/// another test suite running beside it. The verdicts do not depend on
/// speed: a process that aborts fails at once.
const PATIENCE: Duration = Duration::from_secs(600);

fn start() -> Nginx {
    let http = format!(
        r#"
    lua_thread_pool r threads=1;
    thread_pool_process_by_rust r {lib};
    thread_pool_process_by_lua_block lua {{ {HANDLER} }}
    server {{
        listen 127.0.0.1:$PORT;
        location /pool {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                tp.lua:set_timeout({patience})
                local res, err = tp.lua:push_task(ngx.var.arg_op)
                ngx.print(tostring(res), " ", tostring(err))
            }}
        }}
        location /rust {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local res, n = tp.r:push_task("upper", "abc")
                ngx.print(tostring(res), " ", tostring(n))
            }}
        }}
        location /inline {{
            content_by_lua_block {{
                local handler = (function() {HANDLER} end)()
                local ok, res = pcall(handler, ngx.var.arg_op)
                if not ok then
                    -- the garbage stays in the VM until collected
                    collectgarbage()
                end
                ngx.print(tostring(ok), " ", tostring(res))
            }}
        }}
        location /pid {{ content_by_lua_block {{ ngx.print(ngx.worker.pid()) }} }}
    }}"#,
        lib = rust_fixture().v1.display(),
        patience = PATIENCE.as_secs()
    );
    Case::new("thread_pool lua threads=1;")
        .http(&http)
        .single_process()
        .wrapper(&["prlimit", &format!("--as={LIMIT}")])
        .ready_within(PATIENCE)
        .start()
}

fn get(ngx: &Nginx, path: &str) -> String {
    let resp = common::try_request(ngx.port, "GET", path, &[], b"", PATIENCE)
        .unwrap_or_else(|e| panic!("{path}: no response ({e})\nerror.log:\n{}", ngx.error_log()));
    resp.text()
}

/// Runs `op` in the pool ROUNDS times: each time the task gets the memory
/// error, and the same process then answers a plain task, the Rust pool
/// and the event loop; it logs one warn line per rebuild, no failed
/// build, and quits cleanly.
fn exhaust_in_the_pool(op: &str) {
    let mut ngx = start();
    let pid = get(&ngx, "/pid");
    for round in 1..=ROUNDS {
        let what = format!("{op}, round {round}");
        assert_eq!(
            get(&ngx, &format!("/pool?op={op}")),
            "nil not enough memory",
            "{what}"
        );
        assert_eq!(get(&ngx, "/pool?op=ping"), "ping nil", "{what}");
        assert_eq!(get(&ngx, "/rust"), "ABC 3", "{what}");
        assert_eq!(get(&ngx, "/pid"), pid, "{what}");
    }
    assert!(ngx.quit(PATIENCE), "nginx did not quit");
    assert!(ngx.status.is_some_and(|s| s.success()), "{:?}", ngx.status);
    let log = ngx.error_log();
    let warned = log
        .lines()
        .filter(|l| {
            l.contains("[warn]") && l.contains("not enough memory; rebuilding its Lua state")
        })
        .count();
    assert_eq!(warned, ROUNDS, "{log}");
    // each new state was built at once (a build that fails logs why)
    assert!(!log.contains("[error]"), "{log}");
    common::assert_clean(&log);
    assert!(!log.contains("memory allocation of"), "{log}");
}

#[test]
fn a_growing_table_runs_out_of_memory_and_the_process_serves_on() {
    exhaust_in_the_pool("table");
}

#[test]
fn concatenated_strings_run_out_of_memory_and_the_process_serves_on() {
    exhaust_in_the_pool("concat");
}

#[test]
fn a_growing_string_buffer_runs_out_of_memory_and_the_process_serves_on() {
    exhaust_in_the_pool("buffer");
}

#[test]
fn one_huge_allocation_runs_out_of_memory_and_the_process_serves_on() {
    exhaust_in_the_pool("huge");
}

/// A handler that catches its memory error cannot go on in the state that
/// holds the memory: its task fails as any other that ran out.
#[test]
fn a_caught_memory_error_still_fails_the_task_and_rebuilds_the_state() {
    exhaust_in_the_pool("caught");
}

/// For comparison, the same Lua on the event loop: LuaJIT raises its
/// memory error in the request's Lua, which catches it here and collects
/// the garbage that fills the memory (until then, lua-nginx-module's own
/// allocations for other requests fail: docs/isolation.md), and the
/// process serves on.
#[test]
fn on_the_event_loop_lua_gets_its_memory_error() {
    let mut ngx = start();
    let pid = get(&ngx, "/pid");
    for round in 1..=ROUNDS {
        let what = format!("round {round}");
        assert_eq!(
            get(&ngx, "/inline?op=table"),
            "false not enough memory",
            "{what}"
        );
        assert_eq!(get(&ngx, "/inline?op=ping"), "true ping", "{what}");
        assert_eq!(get(&ngx, "/pool?op=ping"), "ping nil", "{what}");
        assert_eq!(get(&ngx, "/pid"), pid, "{what}");
    }
    assert!(ngx.quit(PATIENCE), "nginx did not quit");
    common::assert_clean(&ngx.error_log());
}
