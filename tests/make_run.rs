//! The README's first command, `make run`, as a newcomer runs it from the
//! checkout: the Makefile builds what is missing, writes the demo's
//! nginx.conf and starts nginx in the foreground; every page the demo
//! announces must answer, and Ctrl-C (SIGINT to make's process group, as a
//! terminal sends it) must stop it cleanly. Only the prefix and the port are
//! the test's (RUN_DIR, RUN_PORT), so that it leaves nothing in the
//! checkout and does not need port 8080 free.

mod common;

use common::{free_port, prefix, repo, try_request, Response};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `make run` in its own process group, stopped with SIGINT and removed
/// with its prefix when dropped.
struct Demo {
    make: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Demo {
    fn start() -> Demo {
        let dir = prefix("make-run");
        let port = free_port();
        let log = std::fs::File::create(dir.join("make.log")).unwrap();
        let make = Command::new("make")
            .arg("--no-print-directory")
            .arg("run")
            .arg(format!("RUN_DIR={}", dir.display()))
            .arg(format!("RUN_PORT={port}"))
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("make run");
        Demo { make, dir, port }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.dir.join("make.log")).unwrap_or_default()
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }

    /// Waits for the demo's first page: make run may build the Rust WAF and
    /// make the images first.
    fn wait_ready(&mut self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(600) {
            if let Some(status) = self.make.try_wait().unwrap() {
                panic!(
                    "make run ended ({status}) before serving:\n{}\n{}",
                    self.output(),
                    self.error_log()
                );
            }
            if self.try_get("/static").is_ok_and(|r| r.status == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("make run did not serve within 600 s:\n{}", self.output());
    }

    fn try_get(&self, path: &str) -> std::io::Result<Response> {
        try_request(self.port, "GET", path, &[], b"", Duration::from_secs(60))
    }

    fn get(&self, path: &str) -> Response {
        self.try_get(path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.error_log()))
    }

    /// Sends `signal` to every process of make's group.
    fn signal_group(&self, signal: &str) {
        let group = format!("-{}", self.make.id());
        let _ = Command::new("kill").args([signal, "--", &group]).status();
    }

    /// Ctrl-C: SIGINT to every process of make's group (make and nginx's
    /// master, which stops its workers), then waits for make to end.
    fn interrupt(&mut self) {
        self.signal_group("-INT");
        let started = Instant::now();
        while self.make.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "make run still runs 60 s after Ctrl-C"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if self.make.try_wait().ok().flatten().is_none() {
            self.signal_group("-KILL");
            let _ = self.make.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The body of a gzip response, inflated by gzip(1).
fn gunzip(body: &[u8], dir: &Path) -> Vec<u8> {
    let mut gz = Command::new("gzip")
        .arg("-dc")
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    gz.stdin.take().unwrap().write_all(body).unwrap();
    let out = gz.wait_with_output().unwrap();
    assert!(out.status.success(), "not a gzip stream");
    out.stdout
}

#[test]
fn make_run_serves_every_page_it_announces_and_stops_on_ctrl_c() {
    let mut demo = Demo::start();
    demo.wait_ready();

    let text = |path: &str| {
        let r = demo.get(path);
        (r.status, r.text())
    };
    assert_eq!(text("/static"), (200, "static\n".into()));
    assert_eq!(text("/upper?s=foo"), (200, "FOO\n".into()));
    let (status, sorted) = text("/sort?n=20000");
    assert!(
        status == 200 && sorted.starts_with("sorted 20000 numbers in a pool thread: "),
        "{status} {sorted}"
    );
    let (status, sorted) = text("/sort-inline?n=20000");
    assert!(
        status == 200 && sorted.starts_with("sorted 20000 numbers on the event loop: "),
        "{status} {sorted}"
    );
    // both WAFs: an attack is refused, a plain query passes
    for waf in ["/waf/", "/waf-rust/", "/waf-inline/"] {
        assert_eq!(
            demo.get(&format!("{waf}?q=1'%20OR%20'1'='1")).status,
            403,
            "{waf}"
        );
        assert_eq!(
            demo.get(&format!("{waf}?q=%3Cscript%3E")).status,
            403,
            "{waf}"
        );
        assert_eq!(
            text(&format!("{waf}?q=hello")),
            (200, "passed\n".into()),
            "{waf}"
        );
    }
    // a thumbnail made by ImageMagick in a pool thread, and the page
    let thumb = demo.get("/thumb/photo1.jpg");
    assert_eq!(thumb.status, 200);
    assert!(thumb.body.starts_with(&[0xff, 0xd8]), "not a JPEG");
    assert_eq!(demo.get("/thumb-inline/photo1.jpg").status, 200);
    assert_eq!(demo.get("/thumbs.html").status, 200);
    // the gzip stream and the whole body: 1 MiB each once inflated
    for path in ["/gzip?mb=1", "/gzip-whole?mb=1"] {
        let r = demo.get(path);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(gunzip(&r.body, &demo.dir).len(), 1 << 20, "{path}");
    }
    // the metrics count what ran, the shadow's comparisons included
    let (status, metrics) = text("/metrics");
    assert_eq!(status, 200);
    for name in [
        "ngx_threadpool_tasks_pushed_total",
        "ngx_threadpool_accept_gate_",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    assert!(
        metrics.contains("pool=\"waf_rust\""),
        "the Rust WAF's pool is missing:\n{metrics}"
    );

    demo.interrupt();
    assert!(
        !demo.dir.join("logs/nginx.pid").exists(),
        "nginx left its pid file: it did not exit"
    );
    let log = demo.error_log();
    for bad in ["[emerg]", "[alert]", "[crit]", "exited on signal"] {
        assert!(!log.contains(bad), "{bad} in the demo's error.log:\n{log}");
    }
}
