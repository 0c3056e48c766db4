//! Recursion that would overflow a C stack, in a pool thread
//! (`thread_pool_stack_size`): each shape costs its task (`nil` and
//! LuaJIT's error), never the worker, and the stack pages a deep task
//! touched go back after it.

mod common;

use common::*;

/// A pool whose task recurses in the shape its argument names, and
/// answers what ended the recursion.
const POOL: &str = r#"
    thread_pool_process_by_lua_block deep {
        local ffi = require "ffi"
        ffi.cdef[[
            void qsort(void *base, size_t n, size_t size,
                       int (*cmp)(const void *, const void *));
        ]]
        local shapes = {}
        function shapes.gsub()
            local function f(s) return (s:gsub(".", f)) end
            return f("x")
        end
        function shapes.sort()
            local function f(a, b)
                table.sort({ 3, 2, 1 }, f)
                return a < b
            end
            table.sort({ 3, 2, 1 }, f)
        end
        function shapes.index()
            local t = setmetatable({}, {})
            getmetatable(t).__index = function(self, k) return self[k] end
            return t.x
        end
        function shapes.pcall()
            local function f() local ok, err = pcall(f) if not ok then error(err, 0) end end
            return f()
        end
        function shapes.ffi()
            local arr = ffi.new("int[3]", 3, 2, 1)
            local cb
            cb = ffi.cast("int (*)(const void *, const void *)", function()
                ffi.C.qsort(arr, 3, 4, cb)
                return 0
            end)
            ffi.C.qsort(arr, 3, 4, cb)
        end
        return function(shape)
            return shapes[shape]()
        end
    }
"#;

fn start() -> Nginx {
    Case::new("thread_pool deep threads=1;")
        .http(POOL)
        .lua(
            "/t",
            r#"local res, err = tp.deep:push_task(ngx.var.arg_shape)
               ngx.print(tostring(res), " ", tostring(err))"#,
        )
        .start()
}

#[test]
fn each_recursion_shape_costs_its_task_never_the_worker() {
    let n = start();
    let pid = n.workers();
    for (shape, error) in [
        ("gsub", "stack overflow"),
        ("sort", "stack overflow"),
        ("index", "stack overflow"),
        ("pcall", "stack overflow"),
        ("ffi", "stack overflow"),
    ] {
        let body = n.get(&format!("/t?shape={shape}")).text();
        assert!(
            body.starts_with("nil ") && body.contains(error),
            "{shape}: {body}\n{}",
            n.error_log()
        );
        assert_eq!(n.workers(), pid, "{shape}: the worker was replaced");
    }
    n.assert_clean_log();
}

#[test]
fn a_deep_task_gives_its_stack_pages_back() {
    let n = start();
    let pid = n.workers()[0];
    let before = rss_kib(pid);
    for _ in 0..3 {
        let body = n.get("/t?shape=gsub").text();
        assert!(body.contains("stack overflow"), "{body}");
    }
    // the recursion touched ~50 MiB of the thread's stack
    let after = rss_kib(pid);
    eprintln!("cstack: worker RSS {before} KiB before 3 deep tasks, {after} KiB after");
    assert!(
        after < before + 16 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
    n.assert_clean_log();
}

#[test]
fn nginx_t_refuses_a_stack_too_small() {
    let out = Case::new("thread_pool deep threads=1;")
        .http(&format!("{POOL}\nthread_pool_stack_size deep 64k;"))
        .nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "\"thread_pool_stack_size\" directive takes a size of at least 1024k: invalid \"64k\""
        ),
        "{err}"
    );
}
