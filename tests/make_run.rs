//! The README's first command, `make run`, as a newcomer runs it from the
//! checkout: the Makefile builds what is missing, writes the demo's
//! nginx.conf and starts nginx in the foreground; every page the demo
//! announces must answer, and Ctrl-C (SIGINT to make's process group, as a
//! terminal sends it) must stop it cleanly. The demo's live WAF rules
//! (docs/demo.md): a rule added at /admin/waf/rules blocks on both WAFs in
//! both workers without a reload. Only the prefix and the port are the
//! test's (RUN_DIR, RUN_PORT), so that it leaves nothing in the checkout
//! and does not need port 8080 free.

mod common;

use common::{free_port, prefix, repo, try_request, Response};
use std::collections::BTreeSet;
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

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
        try_request(
            self.port,
            method,
            path,
            headers,
            body.as_bytes(),
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.error_log()))
    }

    /// Sends `method path` until both of the demo's workers answered
    /// (demo.conf's X-Worker header), each answer checked by `check`.
    fn in_every_worker(&self, method: &str, path: &str, check: impl Fn(&Response)) {
        let mut workers = BTreeSet::new();
        for _ in 0..400 {
            let r = self.request(method, path, &[], "");
            check(&r);
            let pid = r.header("x-worker").expect("no X-Worker header");
            workers.insert(pid.to_string());
            if workers.len() == 2 {
                return;
            }
        }
        panic!("{method} {path}: 400 answers, all from worker {workers:?}");
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

/// Whether the demo's WAF at `waf` passes or blocks `?q=ngxtp-live-canary`
/// in every worker: `blocked` the rule ids it must name, empty for passed.
fn canary(demo: &Demo, waf: &str, blocked: &str) {
    let path = format!("{waf}?q=ngxtp-live-canary");
    let want = match blocked {
        "" => (200, "passed\n".to_string()),
        ids => (403, format!("blocked by rules {ids}\n")),
    };
    demo.in_every_worker("GET", &path, |r| {
        assert_eq!((r.status, r.text()), want, "GET {path}");
    });
}

#[test]
fn a_waf_rule_added_live_blocks_on_both_wafs_in_every_worker() {
    let mut demo = Demo::start();
    demo.wait_ready();
    const JSON: (&str, &str) = ("Content-Type", "application/json");
    const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");
    let admin = |method: &str, headers: &[(&str, &str)], body: &str| {
        let r = demo.request(method, "/admin/waf/rules", headers, body);
        (r.status, r.text())
    };
    let no_rules = |(status, text): (u16, String)| {
        assert!(text.contains(r#""rules":[]"#), "{status} {text}");
        status
    };

    // before: the canary passes both WAFs, and the list is empty in both
    // workers' admins
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "");
    }
    demo.in_every_worker("GET", "/admin/waf/rules", |r| {
        assert_eq!(r.status, 200);
        no_rules((r.status, r.text()));
    });

    // refused, and nothing changes: a pattern PCRE cannot compile (the
    // check before any update), one the Rust WAF refuses (a lookahead,
    // which PCRE takes: its update fails, and the former list is sent
    // again), a rule without targets. Each of them would match the canary.
    let bad = [
        (
            r#"{"id":90002,"pattern":"ngxtp-(live","targets":["args"],"msg":"bad"}"#,
            &["waf rule 90002: "][..],
        ),
        (
            r#"{"id":90003,"pattern":"(?=ngxtp)ngxtp-live","targets":["args"],"msg":"bad"}"#,
            &["waf_rust: update ", " failed in ", "waf rule 90003: "],
        ),
        (
            r#"{"id":90004,"pattern":"ngxtp-live","msg":"bad"}"#,
            &["waf rule 90004: no targets"],
        ),
    ];
    for (rule, errors) in bad {
        let (status, text) = admin("POST", &[JSON], rule);
        assert!(
            status == 400 && errors.iter().all(|e| text.contains(e)),
            "{rule}: {status} {text}"
        );
        no_rules((status, text));
    }
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "");
    }

    // a rule as form fields, then one as JSON: the canary is blocked by
    // both, in list order after the file's rules, on both WAFs in both
    // workers; the event loop's WAF has no extras
    let (status, text) = admin(
        "POST",
        &[FORM],
        "id=90001&pattern=ngxtp-live&targets=args&msg=canary",
    );
    assert!(
        status == 200 && text.contains(r#""waf":"#) && text.contains(r#""waf_rust":"#),
        "{status} {text}"
    );
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "90001");
    }
    let (status, text) = admin(
        "POST",
        &[JSON],
        r#"{"id":90005,"pattern":"(?i)\\bNGXTP-LIVE-\\w+","targets":["args","headers"],"msg":"canary"}"#,
    );
    assert_eq!(status, 200, "{text}");
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "90001 90005");
    }
    canary(&demo, "/waf-inline/", "");
    demo.in_every_worker("GET", "/admin/waf/rules", |r| {
        let text = r.text();
        assert!(
            r.status == 200 && text.contains("90001") && text.contains("90005"),
            "{text}"
        );
    });

    // 90001 again, in its place, matching no longer; 90005 removed, then
    // all: the former verdicts again
    let (status, text) = admin(
        "POST",
        &[FORM],
        "id=90001&pattern=ngxtp-none&targets=args&msg=canary",
    );
    let at = |id: &str| text.find(id).unwrap_or_else(|| panic!("{text}"));
    assert!(status == 200 && at("90001") < at("90005"), "{text}");
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "90005");
    }
    let r = demo.request("DELETE", "/admin/waf/rules?id=90005", &[], "");
    let text = r.text();
    assert!(
        r.status == 200 && text.contains("90001") && !text.contains("90005"),
        "{text}"
    );
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "");
    }
    assert_eq!(no_rules(admin("DELETE", &[], "")), 200);
    for waf in ["/waf/", "/waf-rust/"] {
        canary(&demo, waf, "");
    }

    demo.interrupt();
    let log = demo.error_log();
    for bad in ["[emerg]", "[alert]", "[crit]", "exited on signal"] {
        assert!(!log.contains(bad), "{bad} in the demo's error.log:\n{log}");
    }
}
