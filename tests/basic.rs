//! The module's user-facing basics: directives and chunk styles, the
//! threads' Lua environment, configuration errors, one pool per worker,
//! and pools left to nginx.

mod common;

use common::{Case, Nginx};
use std::time::Duration;

/// The example configuration of the brief.
const UPPER_MAIN: &str = "thread_pool upper_pool threads=1;";
const UPPER_HTTP: &str = r#"
    thread_pool_init_by_lua upper_pool "ngx.log(ngx.INFO, 'thread up')";
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
"#;

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// The names (comm) of a process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let comm = std::fs::read_to_string(entry.unwrap().path().join("comm")).unwrap();
        names.push(comm.trim_end().to_string());
    }
    names
}

/// The only worker of a one-worker nginx.
fn worker(n: &Nginx) -> u32 {
    let w = n.workers();
    assert_eq!(w.len(), 1, "workers: {w:?}");
    w[0]
}

/// 1-based line of the first line of `text` containing `marker`.
fn line_of(text: &str, marker: &str) -> usize {
    text.lines()
        .position(|l| l.contains(marker))
        .expect("marker")
        + 1
}

#[test]
fn brief_example_answers_foo() {
    Case::new(UPPER_MAIN)
        .http(UPPER_HTTP)
        .lua("/", r#"ngx.say(assert(tp.upper_pool:push_task("foo")))"#)
        .get("/", 200, "FOO\n")
        .log_line("[info]*thread up, thread pool: upper_pool")
        .run();
}

/// The factory style from a file: its top level runs once per thread and
/// its locals persist across that thread's tasks.
#[test]
fn factory_file_runs_once_per_thread_and_keeps_locals() {
    let chunk = r#"
local ffi = require "ffi"
ffi.cdef "long syscall(long number, ...);"
local SYS_gettid = 186 -- x86_64
local tid = tonumber(ffi.C.syscall(SYS_gettid))
ngx.log(ngx.NOTICE, "factory top level ran")
local count = 0
return function(path)
    count = count + 1
    return tid, count, path
end
"#;
    let code = r#"
        local threads = {}
        for i = 1, 8 do
            threads[i] = ngx.thread.spawn(function()
                return tp.fpool:push_task(ngx.var.uri .. i)
            end)
        end
        for i = 1, 8 do
            local _, tid, count, path = ngx.thread.wait(threads[i])
            ngx.say(tid, " ", count, " ", path)
        end
"#;
    let n = Case::new("thread_pool fpool threads=2;")
        .http("thread_pool_process_by_lua_file fpool conf/factory.lua;")
        .file("factory.lua", chunk)
        .lua("/", code)
        .start();
    let pid = worker(&n);
    let mut per_thread: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for round in 0..3 {
        let r = n.get("/t");
        assert_eq!(r.status, 200, "{}", r.text());
        for (i, line) in r.text().lines().enumerate() {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 3, "round {round}: {line}");
            assert_eq!(f[2], format!("/t{}", i + 1), "arguments reach the handler");
            let tid: u32 = f[0].parse().unwrap();
            assert_ne!(tid, pid, "the handler ran on the event loop");
            per_thread
                .entry(tid)
                .or_default()
                .push(f[1].parse().unwrap());
        }
    }
    assert!(per_thread.len() <= 2, "{per_thread:?}");
    let mut total = 0;
    for (tid, mut counts) in per_thread {
        // Tasks of one thread may be reported out of order within a round,
        // but the counter must have taken each value 1..k exactly once.
        counts.sort_unstable();
        let k = counts.len() as u32;
        assert_eq!(counts, (1..=k).collect::<Vec<_>>(), "thread {tid}");
        total += k;
    }
    assert_eq!(total, 24);
    // Each thread runs the top level as it starts, maybe after the tasks.
    let line = "factory top level ran, thread pool: fpool";
    assert!(common::eventually(Duration::from_secs(5), || count(
        &n.error_log(),
        line
    ) >= 2));
    let log = n.error_log();
    assert_eq!(
        count(&log, line),
        2,
        "once in each of the 2 threads:\n{log}"
    );
    n.assert_clean_log();
}

#[test]
fn init_chunk_runs_once_per_thread() {
    let http = r#"
    thread_pool_init_by_lua ipool "ngx.log(ngx.NOTICE, 'init chunk ran') initialized = 'yes'";
    thread_pool_process_by_lua ipool "local _ = ... return initialized";
"#;
    // the init chunk runs before the handler
    let n = Case::new("thread_pool ipool threads=3;")
        .http(http)
        .lua("/", "for i = 1, 6 do ngx.say(tp.ipool:push_task()) end")
        .get("/", 200, &"yes\n".repeat(6))
        .run();
    let line = "init chunk ran, thread pool: ipool";
    assert!(common::eventually(Duration::from_secs(5), || count(
        &n.error_log(),
        line
    ) >= 3));
    n.get("/");
    assert_eq!(count(&n.error_log(), line), 3, "{}", n.error_log());
    n.assert_clean_log();
}

#[test]
fn nginx_t_reports_syntax_error_in_inline_chunk() {
    let main = "thread_pool p threads=1;";
    let http = "    thread_pool_process_by_lua p \"local x = ... return x +\"; # bad chunk\n";
    let case = Case::new(main).http(http);
    let line = line_of(&case.conf_text(), "# bad chunk");
    let out = case.nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("\"thread_pool_process_by_lua\" directive failed to compile"),
        "{err}"
    );
    assert!(
        err.contains(&format!("thread_pool_process_by_lua(nginx.conf:{line}):1:")),
        "the Lua message names the directive's position and the chunk's line:\n{err}"
    );
    assert!(err.contains(&format!("conf/nginx.conf:{line}")), "{err}");
    assert!(err.contains("test failed"), "{err}");
}

#[test]
fn nginx_t_reports_syntax_error_in_file_chunk() {
    let main = "thread_pool p threads=1;";
    let bad = "local a = 1\nlocal b = 2\nlocal c = = 3\nreturn a\n";
    for (directive, other) in [
        (
            "thread_pool_init_by_lua_file",
            "thread_pool_process_by_lua p \"return ...\";",
        ),
        ("thread_pool_process_by_lua_file", ""),
    ] {
        let http = format!("    {directive} p conf/bad.lua;\n    {other}\n");
        let out = Case::new(main).http(&http).file("bad.lua", bad).nginx_t();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("\"{directive}\" directive failed to compile")),
            "{err}"
        );
        assert!(
            err.contains("conf/bad.lua:3:"),
            "file and line of the Lua error:\n{err}"
        );
        assert!(err.contains("test failed"), "{err}");
    }
}

#[test]
fn runtime_error_in_init_chunk_is_logged_and_tasks_fail() {
    let http = r#"
    thread_pool_init_by_lua badinit "error('init exploded')";
    thread_pool_process_by_lua badinit "return ...";
"#;
    const LOGGED: &str = "[error]*thread pool \"badinit\"*init exploded";
    let case = Case::new("thread_pool badinit threads=1;")
        .http(http)
        .lua(
            "/",
            r#"local res, err = tp.badinit:push_task("x")
               ngx.say(tostring(res), " | ", tostring(err))"#,
        )
        .error_line(LOGGED);
    let n = case.start();
    let pid = worker(&n);
    // Logged when the thread starts, before any task.
    assert!(common::eventually(Duration::from_secs(5), || {
        let log = n.error_log();
        log.lines().any(|l| common::matches(l, LOGGED))
    }));
    case.get("/", 200, "nil | *badinit*init exploded*")
        .get("/", 200, "nil | *badinit*init exploded*")
        .check(&n);
    assert_eq!(n.workers(), vec![pid]);
}

#[test]
fn factory_chunk_returning_non_function_is_logged_and_tasks_fail() {
    Case::new("thread_pool nofunc threads=1;")
        .http(r#"thread_pool_process_by_lua nofunc "local t = {} return 42";"#)
        .lua(
            "/",
            r#"local res, err = tp.nofunc:push_task("x")
               ngx.say(tostring(res), " | ", tostring(err))"#,
        )
        .get("/", 200, "nil | *nofunc*returned number*")
        .error_line("thread pool \"nofunc\"*instead of a function")
        .run();
}

/// `require` in a thread finds Lua modules on lua_package_path and on
/// what init_by_lua added to package.path (which, with a shared dict, runs
/// after the configuration is read), and C modules on lua_package_cpath
/// (only there: cjson.so is linked into conf/lib/).
#[test]
fn require_finds_lua_and_c_modules() {
    let http = format!(
        r#"
    lua_package_path "$prefix/conf/?.lua;{repo}/lua/?.lua;;";
    lua_package_cpath "$prefix/conf/lib/?.so";
    lua_shared_dict d 64k;
    init_by_lua_block {{
        package.path = ngx.config.prefix() .. "conf/late/?.lua;" .. package.path
    }}
    thread_pool_process_by_lua rpool "
        local mine = require 'mymod'
        local cjson = require 'cjson'
        return mine.hello(...) .. require 'latemod', cjson.encode({{ a = {{ 1, 2 }} }})
    ";
"#,
        repo = common::repo().display()
    );
    let mymod = "return { hello = function(w) return 'hello ' .. w end }\n";
    let case = Case::new("thread_pool rpool threads=1;")
        .http(&http)
        .file("mymod.lua", mymod)
        .lua(
            "/",
            r#"local res, err = tp.rpool:push_task("you")
               ngx.say(res or err)
               ngx.say(select(2, tp.rpool:push_task("you")))"#,
        );
    let n = case.start();
    // found when the task requires them
    let conf = n.dir.join("conf");
    std::fs::create_dir(conf.join("lib")).unwrap();
    let cjson = std::fs::read_dir("/usr/lib")
        .unwrap()
        .map(|e| e.unwrap().path().join("lua/5.1/cjson.so"))
        .find(|p| p.exists())
        .expect("lua-cjson's cjson.so");
    std::os::unix::fs::symlink(cjson, conf.join("lib/cjson.so")).unwrap();
    std::fs::create_dir(conf.join("late")).unwrap();
    std::fs::write(conf.join("late/latemod.lua"), "return '!'\n").unwrap();
    case.get("/", 200, "hello you!\n{\"a\":[1,2]}\n").check(&n);
}

#[test]
fn luajit_extensions_exist_in_threads() {
    let http = r#"
    thread_pool_process_by_lua xpool "
        local _ = ...
        local buffer = require 'string.buffer'
        local new_tab = require 'table.new'
        local ffi = require 'ffi'
        local bit = require 'bit'
        local b = buffer.new():put('a', 1):tostring()
        local t = new_tab(4, 0)
        t[1] = 'x'
        return type(ffi.new), ffi.sizeof('int32_t'), bit.band(0xff, 0x0f),
               b, #t, type(jit), jit.version:match('^LuaJIT') or jit.version
    ";
"#;
    Case::new("thread_pool xpool threads=1;")
        .http(http)
        .lua(
            "/",
            r#"ngx.say(table.concat({ assert(tp.xpool:push_task()) }, " "))"#,
        )
        .get("/", 200, "function 4 15 a1 1 table LuaJIT\n")
        .run();
}

#[test]
fn ngx_log_levels_and_filtering() {
    let http = r#"
    thread_pool_process_by_lua logpool "
        local _ = ...
        for _, l in ipairs({ 'STDERR', 'EMERG', 'ALERT', 'CRIT', 'ERR', 'WARN',
                             'NOTICE', 'INFO', 'DEBUG' }) do
            ngx.log(ngx[l], 'level-', l, '-line ', 42, ' ', true, ' ', nil)
        end
        print('printed ', 1.5)
        return 'logged'
    ";
"#;
    // The error lines at each level are what the test is about: the log is
    // read below, not checked clean.
    let n = Case::new("thread_pool logpool threads=1;")
        .http(http)
        .lua("/", "ngx.say(assert(tp.logpool:push_task()))")
        .start();
    assert_eq!(n.get("/").text(), "logged\n");
    let log = n.error_log();
    for (level, tag) in [
        ("STDERR", "[]"),
        ("EMERG", "[emerg]"),
        ("ALERT", "[alert]"),
        ("CRIT", "[crit]"),
        ("ERR", "[error]"),
        ("WARN", "[warn]"),
        ("NOTICE", "[notice]"),
        ("INFO", "[info]"),
    ] {
        let msg = format!("level-{level}-line 42 true nil, thread pool: logpool");
        let line = log.lines().find(|l| l.contains(&msg));
        let line = line.unwrap_or_else(|| panic!("no {level} line:\n{log}"));
        assert!(line.contains(tag), "{line}");
        assert!(
            line.contains("[lua] thread_pool_process_by_lua(nginx.conf:"),
            "{line}"
        );
    }
    assert!(
        !log.contains("level-DEBUG"),
        "error_log info must drop DEBUG lines:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("[notice]") && l.contains("printed 1.5, thread pool: logpool")),
        "{log}"
    );
}

#[test]
fn unknown_pool_is_an_error_naming_it() {
    let code = r#"
        local ok, err = pcall(function() return tp.NOSUCH end)
        ngx.say(tostring(ok), " ", err)
        ngx.say(assert(tp.upper_pool:push_task("still works")))
"#;
    Case::new(UPPER_MAIN)
        .http(r#"thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";"#)
        .lua("/", code)
        .get("/", 200, "false *\"NOSUCH\"*STILL WORKS\n")
        .run();
}

/// Each worker has its own pool: 1 event-loop thread + N pool threads, and
/// nginx starts none of its own threads for the pool.
#[test]
fn each_worker_has_its_own_pool() {
    let http = r#"
    thread_pool_process_by_lua wpool "return (...):upper()";
    server { listen 127.0.0.1:$PORT reuseport; location / { content_by_lua_block {
        local tp = require "resty.threadpool"
        ngx.say(ngx.worker.pid(), " ", assert(tp.wpool:push_task("w")))
    } } }
"#;
    let n = Case::new("thread_pool wpool threads=3;")
        .http(http)
        .workers(2)
        .start();
    // nginx is ready once one worker listens; the second may still fork.
    let both_forked = || n.workers().len() == 2;
    assert!(common::eventually(Duration::from_secs(5), both_forked));
    let workers = n.workers();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        let t = n.get("/").text();
        let (pid, res) = t.trim_end().split_once(' ').unwrap();
        assert_eq!(res, "W");
        seen.insert(pid.parse::<u32>().unwrap());
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(
        seen,
        workers.iter().copied().collect(),
        "both workers answer with their pool"
    );
    for pid in workers {
        // the event loop, the pool's threads, the slow-task watchdog and
        // the update thread; a thread takes its name once it runs, which
        // on a busy machine may be after the worker answered with another
        // thread
        common::eventually(Duration::from_secs(10), || {
            let names = thread_names(pid);
            names.len() == 6 && names.iter().filter(|n| *n == "tp wpool").count() == 3
        });
        let names = thread_names(pid);
        assert_eq!(names.len(), 6, "worker {pid}: {names:?}");
        assert_eq!(
            names.iter().filter(|n| *n == "tp wpool").count(),
            3,
            "worker {pid}: {names:?}"
        );
    }
    n.assert_clean_log();
}

/// A thread_pool without a process handler stays nginx's: `aio threads`
/// reads files through it while a Lua pool works beside it.
#[test]
fn pool_without_handler_stays_nginx_own() {
    let data: String = (0..40_000).map(|i| format!("{i:07}\n")).collect(); // 320 KB
    let files = r#"
        location /files/ {
            alias conf/;
            aio threads=io_pool;
            sendfile off;
            output_buffers 2 32k;
        }
"#;
    let n = Case::new("thread_pool io_pool threads=2;\nthread_pool lua_pool threads=1;")
        .http(r#"thread_pool_process_by_lua lua_pool "return (...):upper()";"#)
        .server(files)
        .lua("/lua", r#"ngx.say(assert(tp.lua_pool:push_task("lua")))"#)
        .file("data.txt", &data)
        .start();
    for _ in 0..3 {
        let r = n.get("/files/data.txt");
        assert_eq!(r.status, 200);
        assert!(
            r.body == data.as_bytes(),
            "file served intact ({} bytes)",
            r.body.len()
        );
        assert_eq!(n.get("/lua").text(), "LUA\n");
    }
    let names = thread_names(worker(&n));
    assert_eq!(
        names.len(),
        6,
        "event loop + 2 io_pool + 1 lua_pool + the watchdog + the update thread: {names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| *n == "tp lua_pool").count(),
        1,
        "{names:?}"
    );
    n.assert_clean_log();
}
