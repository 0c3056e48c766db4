//! Resource exhaustion and faults around the pools (docs/isolation.md,
//! "Faults and exhaustion"): the worker's file descriptors exhausted, a
//! pool thread blocked forever at reload and quit, the error log's disk
//! full, a worker killed mid-stream and mid-batch; and what `make
//! test-perturb` and `make test-luajit-assert` rely on, glibc's
//! `MALLOC_PERTURB_` and another LuaJIT reaching the workers. Each fault
//! costs requests at most, never the worker, and each bound is nginx's or
//! the callers'.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long a client may wait for an answer, or for its connection to
/// close, before the test calls it a hang: many times any step here.
const HANG: Duration = Duration::from_secs(30);

/// One pool, `work`: its handler's ops, and locations that push them.
/// Waits are on files the test creates (`gate` paths), checked with
/// access(2), which needs no file descriptor.
const HTTP: &str = r#"
    thread_pool_process_by_lua_block work {
        local ffi = require "ffi"
        local tp = require "resty.threadpool"
        ffi.cdef [[
            int poll(void *fds, unsigned long nfds, int timeout);
            int access(const char *path, int mode);
            void *malloc(size_t size);
            void free(void *p);
        ]]
        local C = ffi.C
        local function wait_for(gate)
            while C.access(gate, 0) ~= 0 do
                C.poll(nil, 0, 10)
            end
        end
        local ops = {}
        function ops.echo(x) return x end
        -- never returns: poll(2) with no descriptor and no timeout
        function ops.block(tag)
            ngx.log(ngx.NOTICE, "BLOCKED ", tag)
            C.poll(nil, 0, -1)
        end
        function ops.wait(tag, gate)
            ngx.log(ngx.NOTICE, "WAITING ", tag)
            wait_for(gate)
            return tag
        end
        function ops.chunks(n)
            for i = 1, n do assert(tp.send(i)) end
            return "end"
        end
        function ops.stream(tag, gate)
            assert(tp.send("first " .. tag))
            ngx.log(ngx.NOTICE, "WAITING ", tag)
            wait_for(gate)
            assert(tp.send("second " .. tag))
            return "end"
        end
        -- a file of the handler's own: a clean error when none is left
        function ops.open(path)
            local f, err = io.open(path)
            if not f then return nil, err end
            f:close()
            return "opened"
        end
        function ops.log(n)
            n = tonumber(n)
            for i = 1, n do
                ngx.log(ngx.NOTICE, "THREAD-LOG ", i, " ", string.rep("x", 200))
            end
            return n
        end
        -- a byte of a fresh malloc block, as glibc left it (64 KiB: past
        -- the thread cache, which glibc does not perturb)
        function ops.fresh()
            local p = C.malloc(65536)
            local b = ffi.cast("unsigned char *", p)[1000]
            C.free(p)
            return b
        end
        return function(op, ...) return ops[op](...) end
    }
    # the tests' clients speak HTTP/1.0, to read lines as they come
    lua_http10_buffering off;
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;
        location = /metrics { thread_pool_status; }
        location = /pid {
            content_by_lua_block { ngx.say(ngx.worker.pid(), " ", ngx.worker.id()) }
        }
        location = /echo {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.say(ngx.worker.pid(), " ", tp.work:push_task("echo", ngx.var.arg_x))
            }
        }
        location = /push {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local res, err = tp.work:push_task_timeout(tonumber(ngx.var.arg_timeout),
                                                           ngx.var.arg_op, ngx.var.arg_tag)
                ngx.say(tostring(res), " ", tostring(err))
            }
        }
        location = /post {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.say(tp.work:post_task(ngx.var.arg_op, ngx.var.arg_tag))
            }
        }
        location = /stats {
            content_by_lua_block {
                local s = require("resty.threadpool").work:stats()
                ngx.say(s.in_flight, " ", s.pushed, " ", s.completed, " ", s.errors)
            }
        }
        location = /fresh {
            content_by_lua_block {
                local ffi = require "ffi"
                local tp = require "resty.threadpool"
                pcall(ffi.cdef, [[
                    void *faults_malloc(size_t size) asm("malloc");
                    void faults_free(void *p) asm("free");
                ]])
                local p = ffi.C.faults_malloc(65536)
                local b = ffi.cast("unsigned char *", p)[1000]
                ffi.C.faults_free(p)
                ngx.say(b, " ", tp.work:push_task("fresh"))
            }
        }
        # Its pid, then a stream and, in a light thread (unless batch=0),
        # a batch, both waiting for the gate conf/gate-TAG: the stream's
        # first chunk is out when the batch's two waiting tasks have
        # started.
        location = /both {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local tag = ngx.var.arg_tag
                local gate = ngx.config.prefix() .. "conf/gate-" .. tag
                ngx.say(ngx.worker.pid())
                ngx.flush(true)
                local batch = ngx.var.arg_batch ~= "0" and ngx.thread.spawn(function()
                    return tp.work:push_tasks_timeout(3600, {
                        { "wait", tag .. "-b1", gate }, { "echo", "e" }, { "wait", tag .. "-b2", gate },
                    })
                end)
                local s = assert(tp.work:push_stream_opts({ timeout = 3600 }, "stream", tag, gate))
                while true do
                    local v, err = s:read()
                    if s.done then
                        ngx.say("stream ", tostring(v), " ", tostring(err))
                        break
                    end
                    ngx.say(v)
                    ngx.flush(true)
                end
                if not batch then
                    return
                end
                local _, res, err = ngx.thread.wait(batch)
                if not res then
                    ngx.say("batch ", err)
                    return
                end
                ngx.say("batch ", res[1][2], " ", res[2][2], " ", res[3][2])
            }
        }
        # With the worker's descriptors all taken by the event loop's Lua
        # (open files kept until the end): a task, a batch, a stream, a
        # posted task, a handler's own open, then a task that waits for
        # conf/gate-fds while the test connects (an accept that fails).
        location = /exhaust {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local hog = {}
                while true do
                    local f = io.open("/dev/null")
                    if not f then break end
                    hog[#hog + 1] = f
                end
                local out = { "held " .. tostring(#hog > 0) }
                out[#out + 1] = "open " .. tostring(io.open("/dev/null"))
                out[#out + 1] = "task " .. tostring(tp.work:push_task("echo", "a"))
                local res, err = tp.work:push_tasks({ { "echo", "b" }, { "echo", "c" } })
                out[#out + 1] = "batch " .. (res and res[1][2] .. res[2][2] or err)
                local s = assert(tp.work:push_stream("chunks", 3))
                local got = {}
                while true do
                    local v = s:read()
                    if s.done then got[#got + 1] = v break end
                    got[#got + 1] = v
                end
                out[#out + 1] = "stream " .. table.concat(got, ",")
                out[#out + 1] = "post " .. tostring(tp.work:post_task("echo", "p"))
                res, err = tp.work:push_task("open", "/dev/null")
                out[#out + 1] = "own " .. tostring(res) .. " " .. tostring(err)
                ngx.log(ngx.NOTICE, "FDS EXHAUSTED")
                out[#out + 1] = "wait " .. tostring(tp.work:push_task(
                    "wait", "fds", ngx.config.prefix() .. "conf/gate-fds"))
                for _, f in ipairs(hog) do f:close() end
                ngx.say(table.concat(out, "; "))
            }
        }
    }
"#;

fn case(main: &str, workers: usize) -> Case {
    Case::new(&format!("thread_pool work threads=4;\n{main}"))
        .http(HTTP)
        .workers(workers)
}

/// Starts nginx and waits for all its workers.
fn start(case: Case, workers: usize) -> Nginx {
    let n = case.start();
    assert!(
        eventually(HANG, || n.workers().len() == workers),
        "workers: {:?}",
        n.workers()
    );
    n
}

fn pids(n: &Nginx) -> BTreeSet<u32> {
    n.workers().into_iter().collect()
}

/// Open descriptors of a process, from /proc.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Lets the tasks waiting for gate `tag` go on.
fn open_gate(n: &Nginx, tag: &str) {
    std::fs::write(n.dir.join(format!("conf/gate-{tag}")), "").unwrap();
}

/// Waits until the error log has `count` lines containing `what`.
fn wait_log(n: &Nginx, what: &str, count: usize) {
    assert!(
        eventually(HANG, || n.error_log().matches(what).count() >= count),
        "no {count} lines {what:?} in error.log:\n{}",
        n.error_log()
    );
}

/// A request whose answer the test reads as it comes: GET `path` on a
/// new connection.
struct Client {
    lines: BufReader<TcpStream>,
}

impl Client {
    fn get(port: u16, path: &str) -> Client {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(HANG)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        Client {
            lines: BufReader::new(s),
        }
    }

    /// The next line of the body (the header skipped), trimmed.
    fn line(&mut self) -> String {
        loop {
            let mut line = String::new();
            let n = self.lines.read_line(&mut line).expect("a line in time");
            assert!(n > 0, "the connection closed");
            let line = line.trim_end().to_string();
            if !line.is_empty() && !line.starts_with("HTTP/") && !line.contains(": ") {
                return line;
            }
        }
    }

    /// The rest of the answer, until the connection closes or is reset;
    /// fails the test on a hang (nothing within HANG).
    fn rest(mut self) -> String {
        let mut rest = Vec::new();
        match self.lines.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("no end of the answer within {HANG:?}: {e}"),
        }
        String::from_utf8_lossy(&rest).into_owned()
    }
}

/// A worker's file descriptors exhausted (`worker_rlimit_nofile`, taken
/// by the event loop's own Lua): tasks, batches, streams and posts go on,
/// since none of them needs a descriptor; a handler's own `io.open` gets
/// its clean error; nginx fails the accepts meanwhile ([crit], its own
/// pause of accept) and serves the waiting client once descriptors are
/// free; the worker lives and holds as many descriptors as before.
#[test]
fn exhausted_descriptors_cost_no_task_and_come_back() {
    let mut n = start(case("worker_rlimit_nofile 128;", 1), 1);
    let pid = n.workers()[0];
    assert!(n.get("/echo?x=warm").text().ends_with(" warm\n"));
    let before = fd_count(pid);
    let exhaust = Client::get(n.port, "/exhaust");
    wait_log(&n, "FDS EXHAUSTED", 1);
    // a client now waits: the worker cannot accept it
    let port = n.port;
    let late = std::thread::spawn(move || Client::get(port, "/echo?x=late").rest());
    wait_log(&n, "Too many open files", 1);
    open_gate(&n, "fds");
    let body = exhaust.rest();
    assert!(
        body.ends_with(
            "held true; open nil; task a; batch bc; stream 1,2,3,end; post true; \
             own nil /dev/null: Too many open files; wait fds\n"
        ),
        "{body}\n{}",
        n.error_log()
    );
    let late = late.join().unwrap();
    assert!(late.ends_with(&format!("{pid} late\n")), "{late}");
    assert_eq!(n.workers(), vec![pid], "the worker was replaced");
    assert!(
        eventually(HANG, || fd_count(pid) == before),
        "{} descriptors, {before} before",
        fd_count(pid)
    );
    // every task came back, the posted one included (9: the warm-up,
    // 1 + 2 + 1 + 1 + 1 + 1 exhausted, the late one)
    assert_eq!(n.get("/stats").text(), "0 9 9 0\n");
    n.expect_errors(&["accept4() failed (24: Too many open files)"]);
    n.assert_clean_log();
}

/// Requests on a worker killed by SIGKILL: a stream and a batch (one
/// request), while its accept gate is paused. Their connection closes (no hang), the
/// master starts a worker in its place, which serves; the gate's count of
/// paused workers forgets the dead one (were it still counted, no worker
/// could pause again with two, and the count would not match the
/// workers' own); the other worker's requests, counters and descriptors
/// are untouched by it.
#[test]
fn a_worker_killed_mid_stream_and_mid_batch() {
    let mut n = start(
        case("", 2).http("thread_pool_accept_gate on high=2 low=1;"),
        2,
    );
    let metrics = || prometheus(&n.get("/metrics").text());
    let gate = |m: &BTreeMap<String, f64>, worker: &str| {
        m[&format!("ngx_threadpool_accept_gate_{worker}")]
    };
    // Paused workers, as counted and as the workers' slots say.
    let paused = |m: &BTreeMap<String, f64>| {
        let slots: f64 = m
            .iter()
            .filter(|(k, _)| k.starts_with("ngx_threadpool_accept_gate_paused{"))
            .map(|(_, v)| v)
            .sum();
        (gate(m, "paused_workers{}"), slots)
    };
    // the first client loads its worker (stream + batch: 4 tasks) over
    // the other's by more than the gate's slack: it pauses
    let mut a = Client::get(n.port, "/both?tag=a");
    let victim: u32 = a.line().parse().unwrap();
    assert_eq!(a.line(), "first a");
    wait_log(&n, "WAITING a-b", 2);
    let mut m = metrics();
    assert!(
        eventually(HANG, || {
            m = metrics();
            paused(&m) == (1.0, 1.0)
        }),
        "the loaded worker did not pause: {m:?}"
    );
    // the second, a stream only, goes to the other worker, the only one
    // accepting, which carries less: the first stays paused
    let mut b = Client::get(n.port, "/both?tag=b&batch=0");
    let other: u32 = b.line().parse().unwrap();
    assert_ne!(other, victim);
    assert_eq!(b.line(), "first b");
    // b's connection is one of them
    let (fds, threads) = (fd_count(other) - 1, thread_count(other));
    m = metrics();
    assert_eq!(paused(&m), (1.0, 1.0), "{m:?}");

    kill(victim, "KILL");
    let rest = a.rest();
    assert!(
        !rest.contains("stream") && !rest.contains("batch"),
        "{rest}"
    );
    assert!(
        eventually(HANG, || {
            let w = pids(&n);
            w.len() == 2 && !w.contains(&victim)
        }),
        "no worker in the killed one's place: {:?}",
        n.workers()
    );
    let new = *pids(&n).iter().find(|&&p| p != other).unwrap();
    // the new worker accepts and serves (the other, loaded, may pause)
    let mut id = String::new();
    assert!(
        eventually(HANG, || {
            let text = n.get("/pid").text();
            match text.trim_end().split_once(' ') {
                Some((pid, i)) if pid == new.to_string() => id = i.to_string(),
                _ => {}
            }
            !id.is_empty()
        }),
        "the new worker {new} does not serve"
    );
    assert!(
        eventually(HANG, || n.get("/echo?x=new").text()
            == format!("{new} new\n")),
        "the new worker {new} runs no task"
    );
    // the gate counts the workers paused now, the dead one not among them
    assert!(
        eventually(HANG, || {
            m = metrics();
            let (counted, slots) = paused(&m);
            counted == slots && gate(&m, &format!("paused{{worker={id}}}")) == 0.0
        }),
        "the dead worker still counts as paused: {m:?}"
    );
    // the other worker's requests finish as if nothing happened
    open_gate(&n, "b");
    assert_eq!(b.rest(), "second b\nstream end nil\n", "{}", n.error_log());
    // and its counters add up: its stream and the echoes it took
    // completed, nothing left; nobody paused
    let other_id = if id == "0" { "1" } else { "0" };
    let row = |m: &BTreeMap<String, f64>, name: &str| {
        m[&format!("ngx_threadpool_{name}{{pool=work,worker={other_id}}}")]
    };
    assert!(
        eventually(HANG, || {
            m = metrics();
            row(&m, "tasks_pushed_total") >= 1.0
                && row(&m, "tasks_completed_total") == row(&m, "tasks_pushed_total")
                && row(&m, "busy_threads") + row(&m, "queued_tasks") == 0.0
                && paused(&m) == (0.0, 0.0)
        }),
        "{m:?}"
    );
    assert!(
        eventually(HANG, || fd_count(other) == fds),
        "the other worker's descriptors: {}, {fds} before",
        fd_count(other)
    );
    assert_eq!(thread_count(other), threads, "the other worker's threads");
    n.expect_errors(&[&format!("worker process {victim} exited on signal 9")]);
    n.assert_clean_log();
}

/// The error log on a full disk (a second `error_log` on /dev/full, whose
/// every write fails with ENOSPC) while pool threads and the event loop
/// log: every task succeeds, nothing blocks, the worker lives, and the
/// other log gets every line.
#[test]
fn a_full_error_log_costs_no_task() {
    let n = start(case("error_log /dev/full notice;", 1), 1);
    let pid = n.workers()[0];
    for i in 0..10 {
        assert_eq!(
            n.get("/push?timeout=30&op=log&tag=100").text(),
            "100 nil\n",
            "push {i}"
        );
        assert_eq!(n.get("/post?op=log&tag=100").text(), "true\n");
    }
    assert!(
        eventually(HANG, || n.get("/stats").text() == "0 20 20 0\n"),
        "{}",
        n.get("/stats").text()
    );
    assert_eq!(n.workers(), vec![pid]);
    assert_eq!(n.error_log().matches("THREAD-LOG").count(), 20 * 100);
    n.assert_clean_log();
}

/// Starts a posted task and a pushed one (`timeout` seconds) that block
/// forever, and waits until both threads are in their poll(2); returns
/// the pushing client.
fn block_two(n: &Nginx, timeout: u32) -> Client {
    assert_eq!(n.get("/post?op=block&tag=posted").text(), "true\n");
    let client = Client::get(
        n.port,
        &format!("/push?timeout={timeout}&op=block&tag=pushed"),
    );
    wait_log(n, "BLOCKED ", 2);
    client
}

/// The old worker's lines once it is gone: it left both threads behind
/// and exited with code 0.
fn assert_left_behind(n: &Nginx, pid: u32) {
    assert!(
        eventually(HANG, || n
            .error_log()
            .contains(&format!("worker process {pid} exited"))),
        "{}",
        n.error_log()
    );
    let log = n.error_log();
    assert!(
        log.contains(&format!("worker process {pid} exited with code 0")),
        "{log}"
    );
    let left = format!(
        "{pid}#{pid}: ngx_threadpool: thread pool \"work\": a task is still running at exit"
    );
    assert_eq!(log.matches(&left).count(), 2, "{log}");
}

/// A pool thread blocked forever (poll(2) without a timeout) at a reload:
/// with `worker_shutdown_timeout`, nginx closes the old worker's
/// connections when it expires, the caller's among them; the worker then
/// leaves the blocked threads behind after the module's exit grace (5 s)
/// and exits; the new worker serves.
#[test]
fn a_thread_blocked_forever_at_reload() {
    let n = start(case("worker_shutdown_timeout 1s;", 1), 1);
    let old = n.workers()[0];
    let pushed = block_two(&n, 3600);
    n.signal("HUP");
    assert!(
        eventually(HANG, || {
            let w = n.workers();
            w.len() == 1 && w[0] != old
        }),
        "the old worker is still there: {:?}\n{}",
        n.workers(),
        n.error_log()
    );
    // the caller's connection closed without an answer
    let rest = pushed.rest();
    assert!(!rest.contains("200 OK"), "{rest}");
    assert_left_behind(&n, old);
    let new = n.workers()[0];
    assert_eq!(n.get("/echo?x=y").text(), format!("{new} y\n"));
    n.assert_clean_log();
}

/// The same at quit, without `worker_shutdown_timeout`: the caller's own
/// timeout bounds its request (`nil timeout`), then the worker leaves the
/// blocked threads behind after the exit grace, and nginx exits.
#[test]
fn a_thread_blocked_forever_at_quit() {
    let mut n = start(case("", 1), 1);
    let old = n.workers()[0];
    let pushed = block_two(&n, 1);
    n.signal("QUIT");
    assert!(pushed.rest().ends_with("nil timeout\n"));
    assert!(n.wait_exit(HANG), "nginx did not exit:\n{}", n.error_log());
    assert!(n.status.is_some_and(|s| s.success()), "{:?}", n.status);
    assert_left_behind(&n, old);
    n.assert_clean_log();
}

/// What `make test-perturb` and `make test-luajit-assert` rely on: glibc's
/// `MALLOC_PERTURB_` given to nginx reaches the event loop and the pool
/// threads of its workers (a fresh block is filled with the byte's
/// complement; the harness's own when NGX_TP_MALLOC_PERTURB is unset),
/// and with NGX_TP_LUAJIT the workers map that LuaJIT, not Debian's.
#[test]
fn the_harness_environment_reaches_the_workers() {
    let byte = std::env::var("NGX_TP_MALLOC_PERTURB").unwrap_or_default();
    let mut case = case("", 1);
    let byte: u8 = if byte.is_empty() {
        case = case.env("MALLOC_PERTURB_", "165");
        165
    } else {
        byte.parse().expect("NGX_TP_MALLOC_PERTURB: a byte")
    };
    let n = start(case, 1);
    let fill = byte ^ 0xff;
    assert_eq!(n.get("/fresh").text(), format!("{fill} {fill}\n"));
    if let Ok(dir) = std::env::var("NGX_TP_LUAJIT") {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", n.workers()[0])).unwrap();
        let luajits: BTreeSet<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|path| path.contains("libluajit"))
            .collect();
        assert!(
            !luajits.is_empty() && luajits.iter().all(|p| p.starts_with(&dir)),
            "{luajits:?}"
        );
    }
    n.assert_clean_log();
}
