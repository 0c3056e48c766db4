//! `require` of OpenResty's own modules in pool threads: lua-resty-core's
//! modules would rebind the thread's ngx.* to lua-nginx-module's C
//! functions, which are not thread-safe. Threads get their own `ngx.re`
//! (split, opt) and API tables, and an error for the request-bound modules;
//! regex-heavy code that requires them runs in two threads and the event
//! loop at once without a crash or a wrong result. os.exit raises.

mod common;

use common::{Case, Nginx};
use std::time::Duration;

/// Regex work whose result depends only on `n`: fresh patterns (never
/// cached, so each iteration compiles and frees one) through ngx.re.match,
/// gsub and the `ngx.re` module's split.
const WORK: &str = r#"
local re = require "ngx.re"
local function work(n, salt)
    local total = 0
    for i = 1, n do
        local s = "item-" .. i .. " qty=" .. (i % 97) .. ",a,b,,c"
        local m = ngx.re.match(s, "item-(" .. i .. ") qty=(\\d+)" .. ("x?"):rep(i % 7), "")
        if not m then
            return "no match at " .. i
        end
        total = total + tonumber(m[1]) + tonumber(m[2])
        local r, count = ngx.re.gsub(s, "(\\d)" .. ("y?"):rep(i % 5), "<$1>")
        total = total + #r + count
        local parts = re.split(s, ",+" .. ("z?"):rep(i % 3))
        total = total + #parts
    end
    return tostring(total)
end
"#;

/// Loads lua-resty-core's modules by their usual names, as real libraries
/// do at load time, then does the work per task.
const POOL: &str = r#"
require "resty.core.regex"
local re_mod = require "ngx.re"
assert(re_mod.split and re_mod.opt)
return function(op, n)
    if op == "work" then
        return work(n)
    elseif op == "require" then
        local ok, v = pcall(require, n)
        if ok then
            return "ok " .. type(v)
        end
        return "error " .. tostring(v)
    elseif op == "api" then
        -- the thread's own request-free API, still in place after the
        -- requires
        require "resty.core"
        return ngx.md5("a"), ngx.encode_base64("hi"), ngx.re.match("ab", "b")[0],
            type(ngx.time()), require("resty.core.time").monotonic_msec() > 0
    elseif op == "exit" then
        os.exit(2)
    end
end
"#;

fn case() -> Case {
    let stress = format!(
        r#"{WORK}
local tp = require "resty.threadpool"
local n = tonumber(ngx.var.arg_n)
local function in_pool() return tp.req_pool:push_task("work", n) end
local t1 = ngx.thread.spawn(in_pool)
local t2 = ngx.thread.spawn(in_pool)
local here = work(n)
local _, r1, e1 = ngx.thread.wait(t1)
local _, r2, e2 = ngx.thread.wait(t2)
ngx.print(here, " ", tostring(r1 or e1), " ", tostring(r2 or e2))
"#
    );
    let api = r#"
        local out = { tp.req_pool:push_task("api") }
        for i = 1, #out do out[i] = tostring(out[i]) end
        ngx.print(table.concat(out, " "))
"#;
    Case::new("thread_pool req_pool threads=2;")
        .http("thread_pool_process_by_lua_file req_pool conf/pool.lua;")
        .file("pool.lua", &format!("{WORK}\n{POOL}"))
        .file("stress.lua", &stress)
        .server("location /stress { content_by_lua_file conf/stress.lua; }")
        .server(r#"location /static { return 200 "static"; }"#)
        .lua(
            "/require",
            r#"ngx.print(tp.req_pool:push_task("require", ngx.var.arg_name))"#,
        )
        .lua("/api", api)
        .lua(
            "/exit",
            r#"ngx.print(tostring(select(2, tp.req_pool:push_task("exit"))))"#,
        )
}

fn start() -> Nginx {
    case().start()
}

#[test]
fn regex_after_requiring_resty_core_in_two_threads_and_the_event_loop() {
    let mut ngx = start();
    let pid = ngx.workers();
    // Without the protection the worker dies or a result goes wrong in
    // most rounds, not in every one: ten rounds make a miss unlikely.
    for _ in 0..10 {
        let out = ngx.get("/stress?n=3000").text();
        let parts: Vec<&str> = out.split(' ').collect();
        assert_eq!(parts.len(), 3, "{out}\n{}", ngx.error_log());
        assert!(parts[0].parse::<u64>().is_ok(), "{out}");
        assert_eq!(parts[1], parts[0], "{out}");
        assert_eq!(parts[2], parts[0], "{out}");
    }
    assert_eq!(ngx.workers(), pid, "the worker was replaced");
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
    ngx.assert_clean_log();
    let log = ngx.error_log();
    assert!(!log.contains("pcre"), "{log}");
}

#[test]
fn openresty_modules_are_the_threads_own_or_refused() {
    let mut case = case();
    for (name, want) in [
        ("ngx.re", "ok table"),
        ("resty.core", "ok table"),
        ("resty.core.base", "ok table"),
        ("resty.core.regex", "ok table"),
        ("resty.core.shdict", "ok table"),
        ("resty.core.time", "ok table"),
        ("resty.core.hash", "ok table"),
        ("resty.core.base64", "ok table"),
        ("resty.core.uri", "ok table"),
        ("resty.core.worker", "ok table"),
        ("ngx.base64", "ok table"),
        ("cjson", "ok table"),
        (
            "ngx.semaphore",
            "module 'ngx.semaphore' is not available in thread pools",
        ),
        (
            "ngx.ssl",
            "module 'ngx.ssl' is not available in thread pools",
        ),
        (
            "ngx.req",
            "module 'ngx.req' is not available in thread pools",
        ),
        (
            "ngx.balancer",
            "module 'ngx.balancer' is not available in thread pools",
        ),
        (
            "resty.core.socket",
            "module 'resty.core.socket' is not available in thread pools",
        ),
        (
            "resty.core.request",
            "module 'resty.core.request' is not available in thread pools",
        ),
        (
            "resty.core.ctx",
            "module 'resty.core.ctx' is not available in thread pools",
        ),
    ] {
        case = case.get(&format!("/require?name={name}"), 200, &format!("*{want}"));
    }
    case.get(
        "/api",
        200,
        "0cc175b9c0f1b6a831c399e269772661 aGk= b number true",
    )
    .run();
}

#[test]
fn os_exit_raises_and_the_worker_keeps_serving() {
    let case = case()
        .get("/exit", 200, "*os.exit is not available in thread pools")
        .get("/static", 200, "static");
    let ngx = case.start();
    let pid = ngx.workers();
    case.check(&ngx);
    assert_eq!(ngx.workers(), pid, "the worker was replaced");
}

/// One LuaJIT in a worker, and the event loop's lua-resty-core is the one
/// of the lua module loaded. The module's Rust side links
/// libluajit-5.1.so.2 by its soname (Debian's, through pkg-config); an
/// nginx with the lua module compiled in and an rpath to its own LuaJIT
/// (OpenResty's, make test-openresty) makes the loader resolve that soname
/// to its copy, so its LuaJIT alone is mapped. The harness's
/// `lua_package_path "<repo>/lua/?.lua;;"` expands `;;` to the lua module's
/// default path: OpenResty's compiled-in lualib, whose resty.core accepts
/// its lua module, not /usr/share/lua/5.1's.
#[test]
fn one_luajit_per_worker_and_the_lua_modules_own_resty_core() {
    let http = r#"
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
    server {
        listen 127.0.0.1:$PORT;
        location /core {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local core = require "resty.core"
                ngx.say(assert(tp.upper_pool:push_task("ok")), " ", core.version, " ",
                    package.searchpath("resty.core", package.path))
            }
        }
    }
"#;
    let n = Case::new("thread_pool upper_pool threads=1;")
        .http(http)
        .start();
    let text = n.get("/core").text();
    assert!(text.starts_with("OK "), "{text}");
    let core = text.split_whitespace().nth(2).unwrap_or_default();
    if common::lua_built_in() {
        assert!(!core.starts_with("/usr/share/lua/"), "{text}");
    }
    let worker = n.workers()[0];
    let maps = std::fs::read_to_string(format!("/proc/{worker}/maps")).unwrap();
    let luajits: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|path| path.contains("libluajit"))
        .collect();
    assert_eq!(luajits.len(), 1, "{luajits:?}");
    eprintln!("{}: resty.core {core}, LuaJIT {luajits:?}", common::nginx());
    n.assert_clean_log();
}
