//! Native handlers (`thread_pool_process_by_rust POOL PATH [CONFIG]`): a C
//! library built from tests/fixtures/native_handler.c serves push_task,
//! push_tasks and post_task like a Lua pool; `nginx -t` names a library
//! that cannot be loaded and why; init failures, error results, garbage
//! and oversized results reach the caller as errors; a reload loads a
//! library renamed over the old path; a spinning handler sees its caller's
//! timeout; a worker quits while a native task runs.

mod common;

use common::handlers::*;
use common::*;
use std::path::Path;
use std::time::Duration;

/// A location /t that runs the Lua in `?code=` style snippets below.
const LOCATIONS: &str = r##"
    server {
        listen 127.0.0.1:$PORT;
        location /echo {
            content_by_lua_block {
                local cjson = require "cjson"
                local tp = require "resty.threadpool"
                local function pack(...) return { n = select("#", ...), ... } end
                local r = pack(tp.c:push_task("echo", 42, 1.5, true, { a = { 1, 2 } }, nil, "x"))
                ngx.print(r.n, " ", cjson.encode({ r[1], r[2], r[3], r[4], r[5], r[6], r[7] }))
            }
        }
        location /batch {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local res = assert(tp.c:push_tasks({ { "echo", 1 }, { "garbage" },
                                                     { "tag" }, { "error" } }))
                local out = {}
                for i, r in ipairs(res) do
                    out[i] = tostring(r[1]) .. ":" .. tostring(r[2]) .. ":"
                             .. tostring(r[3]) .. ":" .. r.n
                end
                ngx.print(table.concat(out, " "))
            }
        }
        location /post {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                assert(tp.c:post_task("error"))
                assert(tp.c:post_task("tag"))
                ngx.print("posted")
            }
        }
        location /call {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local pool = tp[ngx.var.arg_pool or "c"]
                local arg = ngx.var.arg_big and string.rep("z", tonumber(ngx.var.arg_big))
                local res, err = pool:push_task(ngx.var.arg_cmd, arg)
                ngx.print(tostring(res), "|", tostring(err))
            }
        }
        location /stats {
            content_by_lua_block {
                local s = require("resty.threadpool")[ngx.var.arg_pool or "c"]:stats()
                ngx.print(s.pushed, " ", s.completed, " ", s.errors)
            }
        }
    }
"##;

fn http(lib: &Path, extra: &str) -> String {
    format!(
        "thread_pool_process_by_rust c {} \"conf one\";\n{extra}\n{LOCATIONS}",
        lib.display()
    )
}

#[test]
fn a_c_library_serves_push_task_push_tasks_and_post_task() {
    let libs = Libs::new();
    let lib = libs.build("echo", &[]);
    let ngx = Case::new("thread_pool c threads=2;")
        .http(&http(&lib, "thread_pool_zero_copy c 1k;"))
        .start();
    assert_eq!(
        ngx.get("/echo").text(),
        r#"7 ["echo",42,1.5,true,{"a":[1,2]},null,"x"]"#,
        "{}",
        ngx.error_log()
    );
    assert_eq!(
        ngx.get("/batch").text(),
        "true:echo:1:3 false:bad payload: reserved msgpack marker:nil:2 \
         true:v1:nil:2 false:handler error:nil:2"
    );
    assert_eq!(ngx.get("/call?cmd=config").text(), "conf one|nil");
    // a string of the zero-copy size arrives as a span
    assert_eq!(ngx.get("/call?cmd=spans&big=2000").text(), "1 2000|nil");
    assert_eq!(ngx.get("/call?cmd=spans&big=20").text(), "0 0|nil");
    assert_eq!(ngx.get("/post").text(), "posted");
    assert!(eventually(Duration::from_secs(5), || ngx
        .error_log()
        .contains("posted task failed: handler error")));
    // pushed: 1 + 4 + 3 + 2; errors: the batch's and the post's (the
    // garbage is the handler's success, found bad by the event loop)
    assert!(eventually(Duration::from_secs(5), || ngx
        .get("/stats")
        .text()
        == "10 8 2"));
    let log = ngx.error_log();
    for thread in 0..2 {
        let line = format!("[native] init thread {thread} of pool c, thread pool: c");
        assert!(log.contains(&line), "{line} missing:\n{log}");
    }
    ngx.assert_clean_log();
}

#[test]
fn nginx_t_names_the_library_and_what_is_wrong() {
    let libs = Libs::new();
    let good = libs.build("good", &[]);
    let cases = [
        (
            libs.dir.join("absent.so"),
            format!(
                "\"thread_pool_process_by_rust\" directive cannot load \"{}\": No such file or directory",
                libs.dir.join("absent.so").display()
            ),
        ),
        (
            libs.build("no_free", &["-DNO_FREE"]),
            format!(
                "cannot load \"{}\": it has no symbol \"ngx_threadpool_free\"",
                libs.dir.join("no_free.so").display()
            ),
        ),
        (
            libs.build("abi3", &["-DABI=3"]),
            format!(
                "cannot load \"{}\": it is built for handler ABI version 3, this module runs versions 1 to 2",
                libs.dir.join("abi3.so").display()
            ),
        ),
    ];
    // not a shared object: dlopen's own text, naming the file
    let text = libs.dir.join("text.so");
    std::fs::write(&text, "not a library").unwrap();
    for (lib, want) in cases {
        let out = Case::new("thread_pool c threads=1;")
            .http(&http(&lib, ""))
            .nginx_t();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains(&want), "want {want:?} in:\n{err}");
        assert!(err.contains("nginx.conf:"), "{err}");
    }
    let out = Case::new("thread_pool c threads=1;")
        .http(&http(&text, ""))
        .nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "cannot load \"{}\": {}",
            text.display(),
            text.display()
        )),
        "{err}"
    );
    // a pool runs one kind: each order names both directives
    for (extra, want) in [
        (
            "thread_pool_process_by_lua c \"return function() end\";",
            "\"thread_pool_process_by_lua\" directive cannot be used with \"thread_pool_process_by_rust\" for pool \"c\"",
        ),
        (
            "thread_pool_init_by_lua c \"x = 1\";",
            "\"thread_pool_init_by_lua\" directive cannot be used with \"thread_pool_process_by_rust\" for pool \"c\"",
        ),
    ] {
        let out = Case::new("thread_pool c threads=1;").http(&http(&good, extra)).nginx_t();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
    let lua_first = format!(
        "thread_pool_init_by_lua c \"x = 1\";\nthread_pool_process_by_rust c {};",
        good.display()
    );
    let out = Case::new("thread_pool c threads=1;")
        .http(&lua_first)
        .nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"thread_pool_process_by_rust\" directive cannot be used with \"thread_pool_init_by_lua\" for pool \"c\""),
        "{err}"
    );
    // the pool is the module's, as a Lua one is
    let aio = format!(
        "thread_pool_process_by_rust c {};\nserver {{ listen 127.0.0.1:$PORT; location /f {{ aio threads=c; }} }}",
        good.display()
    );
    let out = Case::new("thread_pool c threads=1;").http(&aio).nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("thread pool \"c\" has a thread_pool_process_by_rust handler and cannot also serve \"aio threads\""),
        "{err}"
    );
    // a relative path is the prefix's: nginx -t's prefix is a sibling of
    // the libraries' directory under the temp dir
    let relative = format!(
        "thread_pool_process_by_rust c ../{}/good.so;",
        libs.dir.file_name().unwrap().to_string_lossy()
    );
    let out = Case::new("thread_pool c threads=1;")
        .http(&relative)
        .nginx_t();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn init_failure_makes_the_pool_unusable() {
    let libs = Libs::new();
    let lib = libs.build("init_fail", &["-DINIT_FAIL"]);
    let ngx = Case::new("thread_pool c threads=1;")
        .http(&http(&lib, ""))
        .start();
    assert_eq!(
        ngx.get("/call?cmd=tag").text(),
        "nil|thread pool \"c\" is not usable: init refused by the fixture"
    );
    assert!(ngx
        .error_log()
        .contains("thread pool \"c\" thread #0: init refused by the fixture"));
}

#[test]
fn error_garbage_and_oversized_results_reach_the_caller_as_errors() {
    let libs = Libs::new();
    let lib = libs.build("results", &[]);
    let ngx = Case::new("thread_pool c threads=1;")
        .http(&http(&lib, ""))
        .start();
    assert_eq!(ngx.get("/call?cmd=error").text(), "nil|handler error");
    let garbage = ngx.get("/call?cmd=garbage").text();
    assert!(garbage.starts_with("nil|bad payload: "), "{garbage}");
    assert_eq!(
        ngx.get("/call?cmd=big").text(),
        "nil|return values exceed 16777216 bytes"
    );
    // the worker is still there and serves
    assert_eq!(ngx.get("/call?cmd=tag").text(), "v1|nil");
    ngx.assert_clean_log();
}

/// The master's descriptors open on `path`.
fn open_on(pid: u32, path: &Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l == path)
                .count()
        })
        .unwrap_or(0)
}

/// Sends HUP and waits for a new generation of workers.
fn reload(ngx: &Nginx) {
    let before = ngx.workers();
    ngx.signal("HUP");
    assert!(eventually(Duration::from_secs(10), || {
        let now = ngx.workers();
        !now.is_empty() && now.iter().all(|w| !before.contains(w))
    }));
}

/// A reload without a new file first: the master frees the old cycle at
/// once, closing that cycle's descriptor of the library, whose number the
/// next open gets again. Then a new file renamed over the path and a
/// reload: the workers run the new library.
#[test]
fn reload_loads_a_library_renamed_over_the_old_one() {
    let libs = Libs::new();
    let path = libs.dir.join("handler.so");
    std::fs::rename(libs.build("v1", &[]), &path).unwrap();
    let ngx = Case::new("thread_pool c threads=1;")
        .http(&http(&path, ""))
        .start();
    assert_eq!(ngx.get("/call?cmd=tag").text(), "v1|nil");
    for _ in 0..3 {
        reload(&ngx);
        assert_eq!(ngx.get("/call?cmd=tag").text(), "v1|nil");
    }
    // the old cycles' library is closed
    assert_eq!(open_on(ngx.master_pid(), &path), 1);
    std::fs::rename(libs.build("v2", &["-DTAG=\"v2\""]), &path).unwrap();
    reload(&ngx);
    assert!(
        eventually(Duration::from_secs(5), || ngx.get("/call?cmd=tag").text()
            == "v2|nil"),
        "{}",
        ngx.get("/call?cmd=tag").text()
    );
    ngx.assert_clean_log();
}

/// The fixture spins until `cancelled()` (see
/// `assert_spinning_handler_sees_timeout`).
#[test]
fn a_spinning_handler_sees_its_callers_timeout() {
    let libs = Libs::new();
    let lib = libs.build("spin", &[]);
    let http = format!(
        "thread_pool_process_by_rust c {};\n{SPIN_SERVER}",
        lib.display()
    );
    let ngx = Case::new("thread_pool c threads=1;").http(&http).start();
    assert_spinning_handler_sees_timeout(&ngx, "c");
    ngx.assert_clean_log();
}

#[test]
fn a_worker_quits_while_a_native_task_runs() {
    let libs = Libs::new();
    let lib = libs.build("sleep", &[]);
    let http = format!(
        "thread_pool_process_by_rust c {} {};\n{LOCATIONS}",
        lib.display(),
        libs.dir.display()
    );
    let mut ngx = Case::new("thread_pool c threads=1;").http(&http).start();
    let port = ngx.port;
    let caller =
        std::thread::spawn(move || request(port, "GET", "/call?cmd=sleep", &[], b"").text());
    // the task is pushed (its 300 ms run may be over on a busy machine)
    assert!(eventually(Duration::from_secs(10), || ngx
        .get("/stats")
        .text()
        .starts_with("1 ")));
    ngx.signal("QUIT");
    assert!(ngx.wait_exit(Duration::from_secs(10)), "nginx did not quit");
    assert_eq!(caller.join().unwrap(), "slept|nil");
    // the thread's state was freed at exit
    assert!(libs.dir.join("freed.0").exists());
    let log = ngx.error_log();
    assert!(log.contains("thread pool \"c\": stopped"), "{log}");
    ngx.assert_clean_log();
}

/// `abort_scenarios_under_valgrind` with the C fixture, whose results
/// include a payload that is not one.
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn native_abort_scenarios_under_valgrind() {
    let libs = Libs::new();
    let lib = libs.build("valgrind", &[]);
    let log = abort_scenarios_under_valgrind(
        &lib,
        &[
            ("error", "handler error"),
            ("garbage", "bad payload"),
            ("big", "return values exceed 16777216 bytes"),
        ],
    );
    assert_clean(&log);
}
