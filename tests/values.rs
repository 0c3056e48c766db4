//! What crosses between the event loop and a pool thread: every Lua type the
//! codec carries arrives intact both ways; what it cannot carry is refused
//! with `nil, err` naming the value, and never crashes or hangs a worker.
//! The comparisons run in tests/fixtures/values.lua; a page says "ok" or
//! lists the failing cases.

mod common;

use common::{Case, Nginx};

const MAIN: &str = "thread_pool inspect threads=1;\n\
                    thread_pool echo threads=1;\n\
                    thread_pool ret threads=1;";

/// The `ret` pool's handler: returns values that cannot cross back.
const RET: &str = r#"
local ffi = require "ffi"

local function nest(depth)
    local t = { 1 }
    for _ = 2, depth do
        t = { t }
    end
    return t
end

local results = {
    ["function"] = function() return print end,
    ["second function"] = function() return 1, print end,
    ["nested function"] = function() return { f = { print } } end,
    coroutine = function() return coroutine.create(print) end,
    userdata = function() return newproxy() end,
    cdata = function() return ffi.new("int[1]") end,
    cyclic = function() local t = {} t.self = t return t end,
    deep = function() return nest(101) end,
    big = function() return string.rep("x", 16 * 1024 * 1024 + 1) end,
    plain = function() return "plain" end,
}

return function(op)
    return results[op]()
end
"#;

fn start() -> Nginx {
    let http = format!(
        r#"
    lua_package_path "$prefix/conf/?.lua;{repo}/lua/?.lua;;";
    thread_pool_process_by_lua inspect "return require('describe')(...)";
    thread_pool_process_by_lua echo "return ...";
    thread_pool_process_by_lua_file ret conf/ret.lua;
"#,
        repo = common::repo().display()
    );
    Case::new(MAIN)
        .http(&http)
        .server("location / { content_by_lua_file conf/values.lua; }")
        .file("describe.lua", include_str!("fixtures/describe.lua"))
        .file("values.lua", include_str!("fixtures/values.lua"))
        .file("ret.lua", RET)
        .start()
}

/// Runs one page of checks and asserts it said "ok"; the worker must be the
/// same process afterwards and the log clean.
fn check(page: &str) {
    let n = start();
    let pid = n.workers();
    let r = n.get(page);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), n.error_log());
    assert_eq!(r.text(), "ok\n", "{page}");
    assert_eq!(n.workers(), pid, "the worker was replaced");
    n.assert_clean_log();
}

#[test]
fn every_type_crosses_intact_both_ways() {
    check("/values");
}

#[test]
fn arguments_that_cannot_cross_are_refused() {
    check("/arg_errors");
}

#[test]
fn return_values_that_cannot_cross_are_refused() {
    check("/ret_errors");
}
