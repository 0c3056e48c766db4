//! Failures as push_task reports them: the handler's errors, a full queue,
//! timeouts, and misuse of the API. Each page prints what push_task
//! returned; the worker survives all of it.

mod common;

use common::{Case, Nginx};

/// A handler file whose errors carry its path and line numbers.
const ERR_HANDLER: &str = r#"local tasks = 0
return function(op)
    tasks = tasks + 1
    if op == "index nil" then
        local t = nil
        return t.field
    elseif op == "error string" then
        error("boom")
    elseif op == "error level 0" then
        error("plain boom", 0)
    elseif op == "error table" then
        error({ code = 7, msg = "seven" })
    elseif op == "error function" then
        error(print)
    elseif op == "error nil" then
        error(nil)
    end
    return tasks
end
"#;

/// Runs `ffi.C.usleep`: a task that occupies its thread without burning CPU.
const SLEEPY_HANDLER: &str = r#"local ffi = require "ffi"
ffi.cdef "int usleep(unsigned int usec);"

local function exists(path)
    local f = io.open(path)
    if f then
        f:close()
    end
    return f ~= nil
end

return function(op, arg)
    if op == "sleep" then
        ffi.C.usleep(arg * 1e6)
        return "slept"
    elseif op == "hold" then
        -- Announce that the task runs, then wait for the release file (10 s
        -- at most, so a broken test fails instead of hanging).
        assert(io.open(arg .. "/started", "w")):close()
        for _ = 1, 2000 do
            if exists(arg .. "/release") then
                return "held"
            end
            ffi.C.usleep(5000)
        end
        return "never released"
    end
    return op
end
"#;

/// The pools of these tests, with `code` the content of location /.
fn case(code: &str) -> Case {
    let http = r#"
    thread_pool_process_by_lua_file errpool conf/err.lua;
    thread_pool_process_by_lua_file slow conf/sleepy.lua;
    thread_pool_process_by_lua_file slow2 conf/sleepy.lua;
    thread_pool_process_by_lua_file qpool conf/sleepy.lua;
"#;
    Case::new(
        "thread_pool errpool threads=1;\nthread_pool slow threads=1;\n\
         thread_pool slow2 threads=1;\nthread_pool qpool threads=1 max_queue=1;",
    )
    .http(http)
    .file("err.lua", ERR_HANDLER)
    .file("sleepy.lua", SLEEPY_HANDLER)
    .lua("/", code)
}

fn start(code: &str) -> Nginx {
    case(code).start()
}

/// Lines of a page, asserting the response is a 200.
fn page(n: &Nginx, path: &str) -> Vec<String> {
    let r = n.get(path);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), n.error_log());
    r.text().lines().map(str::to_string).collect()
}

#[test]
fn handler_errors_come_back_as_nil_err_and_the_vm_goes_on() {
    let n = start(
        r#"
            local function show(op)
                local res, err = tp.errpool:push_task(op)
                if type(err) == "table" then
                    err = "table code=" .. tostring(err.code) .. " msg=" .. tostring(err.msg)
                end
                ngx.say(op, " -> ", tostring(res), " | ", type(err), " | ", tostring(err))
            end
            for _, op in ipairs({ "index nil", "error string", "error level 0",
                                  "error table", "error function", "error nil" }) do
                show(op)
            end
            ngx.say("tasks so far: ", tp.errpool:push_task("count"))
        "#,
    );
    let pid = n.workers();
    let file = lua_source_name(&format!("{}/conf/err.lua", n.dir.display()));
    let lines = page(&n, "/");
    assert_eq!(lines.len(), 7, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!(
            "index nil -> nil | string | {file}:6: attempt to index"
        )),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1],
        format!("error string -> nil | string | {file}:8: boom")
    );
    assert_eq!(lines[2], "error level 0 -> nil | string | plain boom");
    assert_eq!(
        lines[3],
        "error table -> nil | string | table code=7 msg=seven"
    );
    assert!(
        lines[4].starts_with("error function -> nil | string | function: "),
        "an error value that cannot cross comes back as its tostring: {}",
        lines[4]
    );
    // error() with nothing still gives the caller a message to log.
    assert_eq!(
        lines[5],
        "error nil -> nil | string | error raised with a nil value"
    );
    // threads=1: the same state ran all seven tasks, its upvalue counting.
    assert_eq!(lines[6], "tasks so far: 7");
    // A second request finds the same state.
    let again = page(&n, "/");
    assert_eq!(again[6], "tasks so far: 14");
    assert_eq!(n.workers(), pid);
    n.assert_clean_log();
}

/// threads=1 max_queue=1: one task running, one queued, the next push
/// returns "queue full" at once, while the running task is still held.
#[test]
fn full_queue_refuses_at_once() {
    let n = start(
        r#"
            local function exists(path)
                local f = io.open(path)
                if f then f:close() end
                return f ~= nil
            end
            local dir = ngx.config.prefix() .. "gate"
            local held_done = false
            local hold = ngx.thread.spawn(function()
                local res, err = tp.qpool:push_task("hold", dir)
                held_done = true
                return res or err
            end)
            for _ = 1, 500 do
                if exists(dir .. "/started") then break end
                ngx.sleep(0.01)
            end
            ngx.say("started: ", tostring(exists(dir .. "/started")))
            local queued = ngx.thread.spawn(function()
                return tp.qpool:push_task("queued")
            end)
            local res, err = tp.qpool:push_task("overflow")
            ngx.say("overflow: ", tostring(res), " ", tostring(err))
            ngx.say("hold still running: ", tostring(not held_done))
            assert(io.open(dir .. "/release", "w")):close()
            ngx.say("hold: ", select(2, ngx.thread.wait(hold)))
            ngx.say("queued: ", select(2, ngx.thread.wait(queued)))
            ngx.say("after: ", tp.qpool:push_task("after"))
        "#,
    );
    // The worker runs as nobody: the gate files live in a directory it may
    // write to.
    let gate = n.dir.join("gate");
    std::fs::create_dir(&gate).unwrap();
    std::fs::set_permissions(&gate, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    assert_eq!(
        page(&n, "/"),
        [
            "started: true",
            "overflow: nil queue full",
            "hold still running: true",
            "hold: held",
            "queued: queued",
            "after: after",
        ]
    );
    n.assert_clean_log();
}

#[test]
fn timeout_returns_and_the_late_result_is_dropped_quietly() {
    let n = start(
        r#"
            local res, err = tp.slow:push_task_timeout(0.2, "sleep", 1)
            ngx.say("timed: ", tostring(res), " ", tostring(err))
            -- queued behind the abandoned task on the pool's one thread: it
            -- returns after the late result has arrived
            ngx.say("after: ", tp.slow:push_task("after"))
        "#,
    );
    let pid = n.workers();
    assert_eq!(page(&n, "/"), ["timed: nil timeout", "after: after"]);
    let log = n.error_log();
    assert!(!log.contains("[error]") && !log.contains("[warn]"), "{log}");
    assert_eq!(n.workers(), pid);
    n.assert_clean_log();
}

/// set_timeout changes the default of one pool, in this worker, for later
/// requests too; push_task_timeout overrides it per call.
#[test]
fn set_timeout_is_per_pool() {
    case(
        r#"
            if ngx.var.arg_set then
                tp.slow:set_timeout(0.2)
                ngx.say("set")
                return
            end
            local th = ngx.thread.spawn(function()
                return tp.slow2:push_task("sleep", 0.5)
            end)
            ngx.say("slow: ", select(2, tp.slow:push_task("sleep", 0.5)))
            ngx.say("slow2: ", select(2, ngx.thread.wait(th)))
            ngx.say("slow per call: ", tp.slow:push_task_timeout(5, "x"))
        "#,
    )
    .get("/?set=1", 200, "set\n")
    .get("/", 200, "slow: timeout\nslow2: slept\nslow per call: x\n")
    .run();
}

#[test]
fn bad_timeouts_and_dot_calls_raise_errors() {
    let n = start(
        r#"
            local pool = tp.slow
            local function try(what, f)
                local ok, err = pcall(f)
                ngx.say(what, ": ", tostring(ok), " ", tostring(err))
            end
            for _, v in ipairs({ 0, -1, "1", 0 / 0, {} }) do
                try("push_task_timeout " .. tostring(v), function()
                    local res = pool:push_task_timeout(v, "x")
                    return res
                end)
                try("set_timeout " .. tostring(v), function()
                    pool:set_timeout(v)
                end)
            end
            -- (no tail calls below: they would hide the caller's line)
            try("push_task_timeout nil", function()
                local res = pool:push_task_timeout()
                return res
            end)
            try("dot push_task", function()
                local res = tp.slow.push_task("x")
                return res
            end)
            try("dot push_task_timeout", function()
                local res = tp.slow.push_task_timeout(1, "x")
                return res
            end)
            try("dot set_timeout", function() tp.slow.set_timeout(1) end)
            ngx.say("still: ", pool:push_task("fine"))
        "#,
    );
    let lines = page(&n, "/");
    assert_eq!(lines.len(), 15, "{lines:?}");
    for line in &lines[..11] {
        assert!(
            line.contains(": false content_by_lua(nginx.conf:")
                && line.ends_with("bad timeout: expected a number of seconds > 0"),
            "the error blames the caller's line: {line}"
        );
    }
    for (line, method) in
        lines[11..14]
            .iter()
            .zip(["push_task", "push_task_timeout", "set_timeout"])
    {
        assert!(
            line.contains(": false content_by_lua(nginx.conf:")
                && line.ends_with(&format!("bad self: call it as pool:{method}(...)")),
            "{line}"
        );
    }
    assert_eq!(lines[14], "still: fine");
    n.assert_clean_log();
}

/// A file's name as LuaJIT writes it in an error message: a path of 60
/// bytes or more (LUA_IDSIZE) becomes "..." and its last 56 (the test's
/// prefix lives under TMPDIR, which may be long).
fn lua_source_name(path: &str) -> String {
    const LUA_IDSIZE: usize = 60;
    if path.len() >= LUA_IDSIZE {
        format!("...{}", &path[path.len() - (LUA_IDSIZE - 4)..])
    } else {
        path.to_string()
    }
}
