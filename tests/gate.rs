//! `thread_pool_accept_gate`: with 2 workers, a worker whose pool holds
//! more tasks than the high mark stops accepting on the shared listening
//! socket (every new connection goes to the other worker, as the
//! per-worker accepted-connection counts show), resumes once the other
//! carries more or its own tasks are done, never leaves no worker
//! accepting, keeps accepting on `reuseport` sockets, counts streams as
//! it counts tasks, and is reloaded and stopped as usual while paused.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// How long a reload or a quit may take: far longer than on a quiet
/// machine, where it takes well under a second, since a wait that ends as
/// soon as it holds costs nothing when it passes.
const LIMIT: Duration = Duration::from_secs(60);

/// One thread per worker; a task waits until the file named by its
/// argument exists, a stream's after sending one chunk. `/block` pushes a
/// task, `/block_stream` a stream, `/who` names the worker.
const HTTP: &str = r#"
    thread_pool_accept_gate on high=3 low=1;
    thread_pool_process_by_lua_block work {
        local ffi = require "ffi"
        ffi.cdef "int usleep(unsigned int usec);"
        local tp = require "resty.threadpool"
        return function(flag, stream)
            if stream then
                tp.send("waiting ")
            end
            while true do
                local f = io.open(flag)
                if f then f:close() return "released" end
                ffi.C.usleep(5000)
            end
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        listen 127.0.0.1:$REUSEPORT reuseport;
        location = /block {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.print(tp.work:push_task(ngx.var.arg_flag))
            }
        }
        location = /block_stream {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local s = assert(tp.work:push_stream(ngx.var.arg_flag, true))
                repeat
                    ngx.print(assert(s:read()))
                until s.done
            }
        }
        location = /who { content_by_lua_block { ngx.print(ngx.worker.id()) } }
        location = /metrics { thread_pool_status; }
    }
"#;

struct Gated {
    ngx: Nginx,
    reuseport: u16,
    flag: PathBuf,
    /// What `block` requests: `/block` or `/block_stream`.
    path: &'static str,
    /// Connections waiting on a blocked task.
    blocked: Vec<TcpStream>,
    metrics: Poller,
}

/// `/metrics` over one keep-alive connection. A connection counts as load
/// on the worker that took it until its first request is done, so a new
/// connection for each poll would move the loads the tests watch: a
/// worker paused with a poll in its load may resume once the poll ends.
struct Poller {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
}

impl Poller {
    fn get(&mut self) -> String {
        // A reload closes the old workers' idle connections: reconnect once.
        for _ in 0..2 {
            if let Some(text) = self.try_get() {
                return text;
            }
            self.conn = None;
        }
        panic!("GET /metrics failed twice");
    }

    fn try_get(&mut self) -> Option<String> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut()?;
        conn.get_mut()
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut length = None;
        let mut line = String::new();
        loop {
            line.clear();
            if conn.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().ok();
            }
        }
        let mut body = vec![0; length?];
        conn.read_exact(&mut body).ok()?;
        String::from_utf8(body).ok()
    }
}

fn start() -> Gated {
    let reuseport = free_port();
    let http = HTTP.replace("$REUSEPORT", &reuseport.to_string());
    let ngx = Case::new("thread_pool work threads=1;")
        .http(&http)
        .workers(2)
        .start();
    let flag = ngx.dir.join("release");
    both_gated(&ngx);
    let mut metrics = Poller {
        port: ngx.port,
        conn: None,
    };
    // Its first request done, the connection is no worker's load.
    metrics.get();
    Gated {
        ngx,
        reuseport,
        flag,
        path: "/block",
        blocked: Vec::new(),
        metrics,
    }
}

/// Waits until both workers run the gate (the port answers once one of
/// them does).
fn both_gated(ngx: &Nginx) {
    assert!(eventually(Duration::from_secs(10), || {
        ngx.get("/metrics")
            .text()
            .matches("ngx_threadpool_accept_gate_paused{worker=")
            .count()
            == 2
    }));
}

/// The value of `name` for `worker` in thread_pool_status's text.
fn metric(text: &str, name: &str, worker: usize) -> f64 {
    let head = format!("{name}{{worker=\"{worker}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&head)?.parse().ok())
        .unwrap_or_else(|| panic!("no {head} in:\n{text}"))
}

fn paused_workers(text: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("ngx_threadpool_accept_gate_paused_workers ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no paused_workers in:\n{text}"))
}

/// Which worker answers a request on a new connection to `port`, or None
/// if none does within 10 s (a paused worker that took it would not
/// answer until it resumes).
fn who(port: u16) -> Option<usize> {
    let r = try_request(port, "GET", "/who", &[], b"", Duration::from_secs(10)).ok()?;
    r.text().parse().ok()
}

impl Gated {
    fn metrics(&mut self) -> String {
        self.metrics.get()
    }

    /// Sends a request whose task blocks until `release`.
    fn block(&mut self) {
        let mut s = TcpStream::connect(("127.0.0.1", self.ngx.port)).unwrap();
        let req = format!(
            "GET {}?flag={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            self.path,
            self.flag.display()
        );
        s.write_all(req.as_bytes()).unwrap();
        self.blocked.push(s);
    }

    /// Blocks tasks until a worker pauses; returns it.
    fn pause_one(&mut self) -> usize {
        for _ in 0..20 {
            self.block();
            let mut paused = None;
            eventually(Duration::from_secs(2), || {
                let m = self.metrics();
                paused =
                    (0..2).find(|&w| metric(&m, "ngx_threadpool_accept_gate_paused", w) == 1.0);
                paused.is_some()
            });
            if let Some(w) = paused {
                return w;
            }
        }
        panic!("no worker paused:\n{}", self.metrics());
    }

    /// Lets every blocked task finish; each request got its task's result.
    fn release(&mut self) {
        std::fs::write(&self.flag, b"").unwrap();
        for mut s in self.blocked.drain(..) {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            assert!(out.contains("\r\nreleased\r\n"), "{out}");
        }
    }
}

#[test]
fn pauses_a_loaded_worker_resumes_it_and_never_pauses_the_last() {
    let mut g = start();
    let paused = g.pause_one();
    let other = 1 - paused;
    let m = g.metrics();
    assert_eq!(paused_workers(&m), 1.0, "{m}");
    let accepted = metric(&m, "ngx_threadpool_accepted_connections_total", paused);

    // While paused, the other worker takes every new connection.
    for _ in 0..30 {
        assert_eq!(who(g.ngx.port), Some(other));
    }
    let m = g.metrics();
    assert_eq!(
        metric(&m, "ngx_threadpool_accepted_connections_total", paused),
        accepted,
        "the paused worker accepted:\n{m}"
    );

    // Load the other worker: once it carries as much as the paused one
    // (whose blocked tasks stay), the paused one takes connections again.
    // A block the gate has not seen yet only adds to the other's load.
    let paused_load = metric(&m, "ngx_threadpool_accept_gate_load", paused);
    let is_resumed =
        |g: &mut Gated| metric(&g.metrics(), "ngx_threadpool_accept_gate_paused", paused) == 0.0;
    let resumed = (0..paused_load as usize + 5).any(|_| {
        g.block();
        eventually(Duration::from_millis(500), || is_resumed(&mut g))
    }) || eventually(Duration::from_secs(10), || is_resumed(&mut g));
    assert!(resumed, "never resumed:\n{}", g.metrics());
    // Both loaded: every connection is served, and at most one worker
    // stops accepting at a time.
    for _ in 0..20 {
        assert!(who(g.ngx.port).is_some(), "{}", g.metrics());
        assert!(paused_workers(&g.metrics()) <= 1.0);
    }

    // Done: the paused worker resumes, with its pause counted and timed,
    // and takes connections again.
    g.release();
    assert!(eventually(Duration::from_secs(5), || {
        let m = g.metrics();
        metric(&m, "ngx_threadpool_accept_gate_paused", paused) == 0.0 && paused_workers(&m) == 0.0
    }));
    let m = g.metrics();
    assert!(metric(&m, "ngx_threadpool_accept_gate_pauses_total", paused) >= 1.0);
    assert!(
        metric(
            &m,
            "ngx_threadpool_accept_gate_paused_seconds_total",
            paused
        ) > 0.0
    );
    assert!(
        (0..400).any(|_| who(g.ngx.port) == Some(paused)),
        "the resumed worker never accepted again"
    );
    // The format is Prometheus's.
    let parsed = prometheus(&g.metrics());
    assert!(parsed.contains_key(&format!(
        "ngx_threadpool_accept_gate_pauses_total{{worker={paused}}}"
    )));
    g.ngx.assert_clean_log();
}

/// A stream holds its pool thread as a task does: a worker whose pool is
/// held by streams pauses, and resumes once they end.
#[test]
fn streams_count_as_load() {
    let mut g = start();
    g.path = "/block_stream";
    let paused = g.pause_one();
    for _ in 0..10 {
        assert_eq!(who(g.ngx.port), Some(1 - paused));
    }
    g.release();
    assert!(eventually(Duration::from_secs(5), || {
        let m = g.metrics();
        metric(&m, "ngx_threadpool_accept_gate_paused", paused) == 0.0 && paused_workers(&m) == 0.0
    }));
    g.ngx.assert_clean_log();
}

#[test]
fn reuseport_sockets_keep_accepting() {
    let mut g = start();
    let paused = g.pause_one();
    // The kernel spreads reuseport connections over both workers' sockets;
    // the paused worker still takes its share.
    let seen: Vec<_> = (0..40).map(|_| who(g.reuseport)).collect();
    assert!(seen.iter().all(Option::is_some), "{seen:?}");
    assert!(seen.contains(&Some(paused)), "{seen:?}");
    g.release();
    g.ngx.assert_clean_log();
}

#[test]
fn reload_and_quit_while_paused() {
    let mut g = start();
    g.pause_one();
    let old = g.ngx.workers();
    g.ngx.signal("HUP");
    assert!(eventually(LIMIT, || {
        let now = g.ngx.workers();
        now.iter().filter(|p| !old.contains(p)).count() == 2
    }));
    // The new workers serve; the old ones still hold the blocked tasks.
    for _ in 0..10 {
        assert!(who(g.ngx.port).is_some());
    }
    g.release();
    assert!(
        eventually(LIMIT, || g.ngx.workers().iter().all(|p| !old.contains(p))),
        "old workers did not exit"
    );

    // Paused again in the new generation, then quit.
    both_gated(&g.ngx);
    g.flag = g.ngx.dir.join("release2");
    g.pause_one();
    g.ngx.signal("QUIT");
    std::thread::sleep(Duration::from_millis(200));
    g.release();
    assert!(g.ngx.wait_exit(LIMIT), "nginx did not quit");
    g.ngx.assert_clean_log();
}

#[test]
fn marks_are_checked_by_nginx_t() {
    let pool = "thread_pool p threads=1;";
    let handler = "thread_pool_process_by_lua p \"return ...\";";
    for (gate, expect) in [
        ("on high=3 low=3", "invalid \"low=3 is not below high=3\""),
        ("on high=0", "invalid \"high=0\""),
        ("maybe", "invalid \"maybe\""),
    ] {
        let http = format!("thread_pool_accept_gate {gate};\n{handler}");
        let out = Case::new(pool).http(&http).nginx_t();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("\"thread_pool_accept_gate\" directive takes on | off [high=N] [low=M]")
                && err.contains(expect),
            "{gate}: {err}"
        );
    }
    for gate in ["off", "on", "on high=20 low=5"] {
        let http = format!("thread_pool_accept_gate {gate};\n{handler}");
        assert!(
            Case::new(pool).http(&http).nginx_t().status.success(),
            "{gate}"
        );
    }
}

#[test]
fn nothing_to_pause_with_reuseport_sockets_only() {
    let ngx = Case::new("thread_pool work threads=1;")
        .http(
            r#"thread_pool_accept_gate on;
        thread_pool_process_by_lua work "return ...";
        server {
            listen 127.0.0.1:$PORT reuseport;
            location = /metrics { thread_pool_status; }
        }"#,
        )
        .workers(2)
        .start();
    assert!(eventually(Duration::from_secs(5), || ngx
        .error_log()
        .matches("accept gate: no shared http listening socket")
        .count()
        == 2));
    let m = ngx.get("/metrics").text();
    assert_eq!(paused_workers(&m), 0.0);
    assert!(!m.contains("ngx_threadpool_accept_gate_paused{"), "{m}");
    ngx.assert_clean_log();
}
