//! What the tests of native handlers share: the Rust fixture library
//! (tests/fixtures/rust_handler), the check that a spinning handler sees
//! its caller's timeout, and the abort scenarios under valgrind. The C fixture (tests/fixtures/native_handler.c) and the Rust
//! one answer the ops used here alike: "spin", "sleep", "error", "big".

use super::{eventually, prefix, repo, skipped_once_idle, Case, Nginx};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The Rust fixture's two libraries, built by cargo with this test
/// binary's profile.
pub struct RustFixture {
    /// Tagged "v1".
    pub v1: PathBuf,
    /// The same handler tagged "v2".
    pub v2: PathBuf,
}

/// Builds the Rust fixture once per test binary (cargo does nothing when
/// it is fresh): a nested cargo on this workspace's target directory,
/// whose dependencies the test build left there.
pub fn rust_fixture() -> &'static RustFixture {
    static BUILT: OnceLock<RustFixture> = OnceLock::new();
    BUILT.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/<test>-<hash>
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args([
                "build",
                "-p",
                "ngx_threadpool_fixture",
                "--lib",
                "--examples",
            ])
            .current_dir(repo());
        if profile_dir.ends_with("release") {
            cargo.arg("--release");
        }
        let out = cargo.output().expect("cargo runs");
        assert!(
            out.status.success(),
            "building the Rust fixture: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        RustFixture {
            v1: profile_dir.join("libngx_threadpool_fixture.so"),
            v2: profile_dir.join("examples/libfixture_v2.so"),
        }
    })
}

/// A pool handler for queues held on purpose: a task sleeps `arg`
/// seconds, holds its thread until the file `arg` exists (60 s at most),
/// or leaves the file `arg` behind ("sleep", "hold", "mark"); it returns
/// its op.
pub const SLEEP_HOLD_MARK: &str = r#"
    local ffi = require "ffi"
    ffi.cdef "int usleep(unsigned int usec);"
    return function(op, arg)
        if op == "sleep" then
            ffi.C.usleep(arg * 1e6)
        elseif op == "hold" then
            for _ = 1, 60000 do
                local f = io.open(arg)
                if f then f:close() break end
                ffi.C.usleep(1000)
            end
        elseif op == "mark" then
            assert(io.open(arg, "w")):close()
        end
        return op
    end
"#;

/// An `init_by_lua_block` body for tests that hold a pool's one thread:
/// `require "hold"` gives `hold(pool)` (its thread busy with a task until
/// the returned `release()`), `trace(name)` (a file a task of
/// SLEEP_HOLD_MARK's "mark" leaves behind) and `show(...)` (the values, by
/// commas).
pub const HOLD_LUA: &str = r##"
        local tp = require "resty.threadpool"
        local M = {}
        function M.hold(pool)
            local go = ngx.config.prefix() .. "go-" .. pool
            os.remove(go)
            local t = ngx.thread.spawn(function()
                return tp[pool]:push_task_timeout(60, "hold", go)
            end)
            for _ = 1, 10000 do
                if tp[pool]:stats().busy > 0 then break end
                ngx.sleep(0.001)
            end
            return function()
                assert(io.open(go, "w")):close()
                assert(ngx.thread.wait(t))
            end
        end
        function M.trace(name)
            return ngx.config.prefix() .. "trace-" .. name
        end
        function M.show(...)
            local out = { select("#", ...) > 0 and tostring((...)) or "none" }
            for i = 2, select("#", ...) do out[i] = tostring((select(i, ...))) end
            return table.concat(out, ",")
        end
        package.loaded.hold = M
"##;

/// A server whose /spin pushes "spin" to pool `?pool=` with a 50 ms
/// timeout; it prints the error and CLOCK_MONOTONIC in ns before the push
/// and after it returned. /idle prints the pool's tasks queued or running
/// and those skipped (their caller gave up before a thread took them).
pub const SPIN_SERVER: &str = r#"
    server {
        listen 127.0.0.1:$PORT;
        location /spin {
            content_by_lua_block {
                local ffi = require "ffi"
                ffi.cdef[[
                    typedef struct { long sec; long nsec; } tp_test_ts;
                    int tp_test_clock_gettime(int, tp_test_ts *) asm("clock_gettime");
                ]]
                local ts = ffi.new("tp_test_ts")
                local function now()
                    ffi.C.tp_test_clock_gettime(1, ts)
                    return tonumber(ts.sec) * 1e9 + tonumber(ts.nsec)
                end
                local tp = require "resty.threadpool"
                local t0 = now()
                local res, err = tp[ngx.var.arg_pool]:push_task_timeout(0.05, "spin")
                local t1 = now()
                ngx.print(tostring(err), " ", string.format("%.0f %.0f", t0, t1))
            }
        }
        location /idle {
            content_by_lua_block {
                local s = require("resty.threadpool")[ngx.var.arg_pool]:stats()
                ngx.print(s.busy + s.queued, " ", s.cancelled)
            }
        }
    }"#;

/// The handler of `pool` spins until `cancelled()`; its caller's timeout
/// is 50 ms. Both sides read CLOCK_MONOTONIC: the caller when its
/// push_task returned (the timeout set the flag before that), the handler
/// its last poll that said "not cancelled" and its first that said
/// "cancelled" (its "cancel seen at NS after NS" line). Every poll after
/// the caller's return must see the flag (a module that sets it late, or
/// never, fails here: the fixture then spins its 5 s), whatever the load
/// of the machine. Tries until three handlers ran: under load the thread
/// may take a task only after its caller gave up, and then skips it (as
/// the pool's count of cancelled tasks must show). How soon the flag is
/// seen is printed, not judged (`make bench` measures it).
pub fn assert_spinning_handler_sees_timeout(ngx: &Nginx, pool: &str) {
    let idle = format!("/idle?pool={pool}");
    let mut ran = 0;
    for _ in 0..50 {
        let skipped = skipped_once_idle(ngx, &idle);
        let body = ngx.get(&format!("/spin?pool={pool}")).text();
        let parts: Vec<&str> = body.split(' ').collect();
        assert_eq!(parts[0], "timeout", "{body}");
        let (t0, t1): (i64, i64) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
        if skipped_once_idle(ngx, &idle) > skipped {
            continue;
        }
        let seen = ngx
            .error_log()
            .lines()
            .filter_map(|l| l.split("cancel seen at ").nth(1))
            .filter_map(|rest| {
                let mut words = rest.split([' ', ',']);
                let first_yes = words.next()?.parse::<i64>().ok()?;
                let last_no = words.nth(1)?.parse::<i64>().ok()?;
                Some((first_yes, last_no))
            })
            .find(|&(first_yes, _)| first_yes > t0);
        let (first_yes, last_no) = seen.unwrap_or_else(|| {
            panic!(
                "the task ran and logged no \"cancel seen\":\n{}",
                ngx.error_log()
            )
        });
        // Not before the timeout: nginx counts its timers from the time it
        // cached at the start of the event loop's turn, in whole
        // milliseconds, so the timeout may fire a little before 50 ms of
        // the real clock have passed since t0 (49 ms seen on a busy host).
        assert!(
            first_yes >= t0 + 45_000_000,
            "seen {} ms after the push",
            (first_yes - t0) / 1_000_000
        );
        assert!(
            last_no < t1,
            "a poll {} µs after the caller's timeout returned said not cancelled",
            (last_no - t1) / 1000
        );
        eprintln!(
            "cancel seen {} µs after the caller's timeout",
            (first_yes - t1) / 1000
        );
        ran += 1;
        if ran == 3 {
            return;
        }
    }
    panic!("only {ran} of the spinning tasks ran");
}

/// A native pool's abort paths once in nginx run by valgrind's memcheck
/// (`make valgrind`, beside the Lua scenarios of tests/lifetime.rs): a
/// client that closes while its task runs, a timeout whose request ends
/// before the result, a batch's timeout, a spinning task cancelled by its
/// timeout, then each of `results` — an op and the start of the error it
/// gives (its first `want.len()` bytes); then quit, freeing every
/// thread's state. Fails on any memory error or definite leak that
/// tests/valgrind.supp does not name; returns the error log, for the
/// caller to check.
pub fn abort_scenarios_under_valgrind(lib: &std::path::Path, results: &[(&str, &str)]) -> String {
    const COUNT: usize = 10;
    let http = format!(
        r#"thread_pool_process_by_rust c {};
    server {{
        listen 127.0.0.1:$PORT;
        lua_check_client_abort on;
        location /abort {{
            content_by_lua_block {{
                ngx.print("pushed")
                ngx.flush(true)
                require("resty.threadpool").c:push_task("sleep")
            }}
        }}
        location /timeout {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                -- plain timeouts, not deadlines: admission could refuse
                -- these pushes while the threads still end the last
                -- request's sleeps (these requests come one by one)
                tp.c:set_timeout(0.005)
                local _, err = tp.c:push_task("sleep")
                local _, berr = tp.c:push_tasks({{ {{ "sleep" }}, {{ "sleep" }} }})
                tp.c:set_timeout(0.05)
                local _, serr = tp.c:push_task("spin")
                tp.c:set_timeout(60)
                ngx.print(err, " ", berr, " ", serr)
            }}
        }}
        location /result {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local _, err = tp.c:push_task(ngx.var.arg_op)
                ngx.print(err:sub(1, tonumber(ngx.var.arg_len)))
            }}
        }}
        location /idle {{
            content_by_lua_block {{
                local s = require("resty.threadpool").c:stats()
                ngx.print(s.busy + s.queued)
            }}
        }}
    }}"#,
        lib.display()
    );
    let mut n = Case::new("thread_pool c threads=2;")
        .http(&http)
        .under_valgrind()
        .start();
    for _ in 0..COUNT {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", n.port)).unwrap();
        use std::io::{Read, Write};
        write!(s, "GET /abort HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
    }
    for _ in 0..COUNT {
        assert_eq!(n.get("/timeout").text(), "timeout timeout timeout");
    }
    for (op, want) in results {
        let path = format!("/result?op={op}&len={}", want.len());
        assert_eq!(n.get(&path).text(), *want, "{op}");
    }
    // Quit only when idle: a single process exits at once on QUIT.
    assert!(eventually(Duration::from_secs(120), || n
        .get("/idle")
        .text()
        == "0"));
    n.quit_under_valgrind();
    n.error_log()
}

/// Handler libraries compiled for one test, removed with it.
pub struct Libs {
    pub dir: PathBuf,
}

impl Libs {
    pub fn new() -> Libs {
        Libs { dir: prefix("lib") }
    }

    /// Compiles the fixture with `flags` into `name`.so.
    pub fn build(&self, name: &str, flags: &[&str]) -> PathBuf {
        let out = self.dir.join(format!("{name}.so"));
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-I"])
            .arg(repo().join("handler/include"))
            .arg("-o")
            .arg(&out)
            .arg(repo().join("tests/fixtures/native_handler.c"))
            .args(flags)
            .status()
            .expect("cc");
        assert!(status.success(), "cc {flags:?} failed");
        out
    }
}

impl Drop for Libs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
