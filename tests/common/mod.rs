//! Starts Debian's real nginx with lua-nginx-module and this module under a
//! temporary prefix on loopback, and speaks HTTP/1.1 to it.
#![allow(dead_code)] // each test binary uses its own part of this file

pub mod handlers;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const MODULES: &str = "/usr/lib/nginx/modules";

/// The nginx under test: `NGX_TP_NGINX` when set (`make test-openresty`
/// points it at OpenResty's nginx, the lua module compiled in), else Debian's.
pub fn nginx() -> &'static str {
    static NGINX: OnceLock<String> = OnceLock::new();
    NGINX.get_or_init(|| std::env::var("NGX_TP_NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".into()))
}

/// Whether lua-nginx-module is compiled into that nginx (OpenResty's
/// shape: its `-V` lists it among `--add-module`, as the release's source
/// directory, `lua-nginx-module-*` or, in OpenResty's own bundle,
/// `ngx_lua-*`), so that no `load_module` line loads it or ngx_devel_kit.
/// The Makefile's `make run` decides the same way (RUN_LUA_MODULES).
pub fn lua_built_in() -> bool {
    static BUILT_IN: OnceLock<bool> = OnceLock::new();
    *BUILT_IN.get_or_init(|| {
        let out = Command::new(nginx()).arg("-V").output().expect("nginx -V");
        String::from_utf8_lossy(&out.stderr)
            .split_whitespace()
            .filter_map(|flag| flag.strip_prefix("--add-module="))
            .any(|dir| dir.contains("lua-nginx-module") || dir.contains("ngx_lua-"))
    })
}

/// The dynamic lua module under test: `NGX_TP_LUA_MODULE` when set (`make
/// test-lua-releases` points it at a release that matrix/lua-module.sh
/// built for this nginx), else Debian's.
pub fn lua_module_path() -> &'static str {
    static LUA: OnceLock<String> = OnceLock::new();
    LUA.get_or_init(|| {
        std::env::var("NGX_TP_LUA_MODULE")
            .unwrap_or_else(|_| format!("{MODULES}/ngx_http_lua_module.so"))
    })
}

/// The lines that load ngx_devel_kit and lua-nginx-module before this
/// module: none when the lua module is built in. ngx_devel_kit is always
/// Debian's: matrix/lua-module.sh builds each release against its headers
/// (libnginx-mod-http-ndk-dev), as Debian builds its own lua module.
pub fn lua_module_lines() -> String {
    if lua_built_in() {
        String::new()
    } else {
        format!(
            "load_module {MODULES}/ndk_http_module.so;\nload_module {};\n",
            lua_module_path()
        )
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The module that `cargo test` built for this very test binary: the
/// cdylib beside it in target/<profile>/deps/. (target/release/ holds what
/// the last `cargo build` left, which `cargo test` does not refresh.)
pub fn module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let p = exe.with_file_name("libngx_threadpool.so");
    assert!(p.exists(), "{} missing", p.display());
    p
}

/// A fresh prefix directory with conf/ and logs/.
pub fn prefix(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ngx_threadpool-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    dir
}

/// Where free_port looks: below Linux's ephemeral ports (32768 and up by
/// default), which the kernel hands to client sockets. A port taken from
/// those (bind to port 0) could be a test client's local port by the time
/// nginx binds it, beside another test: "Address already in use".
const PORTS: std::ops::Range<usize> = 20000..32000;

/// A free loopback port (bound and released), each test process walking
/// the range from a place of its own.
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let start = std::process::id() as usize * 97;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (PORTS.start + (start + n) % PORTS.len()) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A whole nginx.conf: the module lines, `main` at top level (thread_pool
/// declarations), and `http` inside the http block, where `$PORT` stands
/// for the server's port. An `http` that sets its own `lua_package_path`
/// replaces the harness's (it must then list the repo's lua/ dir itself).
/// As root, nginx switches its workers to `nobody`, who may not read a
/// checkout in a private directory (mktemp -d makes it 0700): the workers
/// then keep the tests' user.
pub fn user_line() -> &'static str {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self") {
        Ok(m) if m.uid() == 0 => "user root;",
        _ => "",
    }
}

pub fn config(port: u16, workers: usize, main: &str, http: &str) -> String {
    let path_line = if http.contains("lua_package_path") {
        String::new()
    } else {
        format!("lua_package_path \"{}/lua/?.lua;;\";", repo().display())
    };
    format!(
        r#"{lua_modules}load_module {module};
{user}
daemon off;
master_process on;
worker_processes {workers};
error_log logs/error.log info;
pid logs/nginx.pid;
events {{ worker_connections 1024; }}
{main}
http {{
    access_log off;
    {path_line}
{http}
}}
"#,
        lua_modules = lua_module_lines(),
        module = module_path().display(),
        user = user_line(),
        http = http.replace("$PORT", &port.to_string()),
    )
}

pub struct Nginx {
    pub dir: PathBuf,
    pub port: u16,
    child: Option<Child>,
    /// How the master (or single process) exited, once it has.
    pub status: Option<ExitStatus>,
    /// Patterns (see `matches`) of the error lines this nginx's test
    /// expects: assert_clean_log lets them through.
    pub expected_errors: Vec<String>,
}

impl Nginx {
    /// Starts nginx with `main` and `http` (see `config`) and one worker.
    pub fn start(main: &str, http: &str) -> Nginx {
        Nginx::start_with(1, main, http, &[])
    }

    /// As `start`, with `workers` workers and extra files in conf/.
    pub fn start_with(workers: usize, main: &str, http: &str, files: &[(&str, &str)]) -> Nginx {
        let dir = prefix("run");
        let port = free_port();
        for (name, body) in files {
            std::fs::write(dir.join("conf").join(name), body).unwrap();
        }
        std::fs::write(
            dir.join("conf/nginx.conf"),
            config(port, workers, main, http),
        )
        .unwrap();
        Nginx::spawn(dir, port, Vec::new(), &[], Duration::from_secs(10), true)
    }

    /// Starts nginx on a prefix directory whose conf/nginx.conf is
    /// already written and listens on `port`, with extra command-line
    /// arguments (e.g. `-g "daemon off;"` for a configuration that does
    /// not say it).
    pub fn start_prefix(dir: PathBuf, port: u16, args: &[&str]) -> Nginx {
        Nginx::spawn(dir, port, Vec::new(), args, Duration::from_secs(10), true)
    }

    /// nginx as a single process (`master_process off`: it serves and runs
    /// the pools itself), started through `wrapper`, which gets the prefix
    /// directory and returns a command and its arguments to put before
    /// nginx's (e.g. valgrind and its options). Waits up to `ready` for it
    /// to listen.
    pub fn start_single(
        wrapper: impl FnOnce(&Path) -> Vec<String>,
        ready: Duration,
        main: &str,
        http: &str,
    ) -> Nginx {
        let dir = prefix("single");
        let port = free_port();
        let conf = config(port, 1, main, http).replace("master_process on;", "master_process off;");
        std::fs::write(dir.join("conf/nginx.conf"), conf).unwrap();
        let wrapper = wrapper(&dir);
        Nginx::spawn(dir, port, wrapper, &[], ready, false)
    }

    /// A single process (start_single) under valgrind's memcheck (`make
    /// valgrind`), where a definite leak is an error unless
    /// tests/valgrind.supp names it (nginx's own).
    pub fn start_under_valgrind(main: &str, http: &str) -> Nginx {
        let supp = repo().join("tests/valgrind.supp");
        let wrapper = |dir: &Path| {
            vec![
                "valgrind".into(),
                "--tool=memcheck".into(),
                "--leak-check=full".into(),
                "--errors-for-leak-kinds=definite".into(),
                "--error-exitcode=99".into(),
                "--num-callers=40".into(),
                format!("--suppressions={}", supp.display()),
                format!("--log-file={}", dir.join("logs/valgrind.log").display()),
            ]
        };
        Nginx::start_single(wrapper, Duration::from_secs(120), main, http)
    }

    /// Quits nginx started under valgrind, once its last responses are
    /// written, and asserts that valgrind found no error.
    pub fn quit_under_valgrind(&mut self) {
        std::thread::sleep(Duration::from_millis(500));
        self.signal("QUIT");
        assert!(
            self.wait_exit(Duration::from_secs(120)),
            "nginx did not exit under valgrind"
        );
        let report = std::fs::read_to_string(self.dir.join("logs/valgrind.log")).unwrap();
        let summary = report
            .lines()
            .rev()
            .find(|l| l.contains("ERROR SUMMARY"))
            .unwrap_or_default();
        eprintln!("valgrind: {summary}");
        assert!(
            self.status.is_some_and(|s| s.success()) && summary.contains("ERROR SUMMARY: 0 errors"),
            "valgrind found errors (exit {:?}):\n{report}",
            self.status
        );
    }

    fn spawn(
        dir: PathBuf,
        port: u16,
        wrapper: Vec<String>,
        args: &[&str],
        ready: Duration,
        has_workers: bool,
    ) -> Nginx {
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(nginx());
                cmd
            }
            None => Command::new(nginx()),
        };
        let child = cmd
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg("conf/nginx.conf")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start nginx");
        let mut n = Nginx {
            dir,
            port,
            child: Some(child),
            status: None,
            expected_errors: Vec::new(),
        };
        n.wait_ready(ready, has_workers);
        n
    }

    fn wait_ready(&mut self, limit: Duration, has_workers: bool) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && (!has_workers || !self.workers().is_empty())
            {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let mut err = String::new();
                self.child
                    .as_mut()
                    .unwrap()
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!(
                    "nginx exited with {status}: {err}\nerror.log:\n{}",
                    self.error_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "nginx did not start listening\nerror.log:\n{}",
            self.error_log()
        );
    }

    pub fn master_pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// The worker processes of this nginx (children of the master).
    pub fn workers(&self) -> Vec<u32> {
        children_of(self.master_pid())
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.master_pid().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Sends QUIT and waits for the master to exit; returns whether it did
    /// within `limit`.
    pub fn quit(&mut self, limit: Duration) -> bool {
        self.signal("QUIT");
        self.wait_exit(limit)
    }

    /// Waits for the master to exit (then `status` is set); returns whether
    /// it did within `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let child = self.child.as_mut().unwrap();
        let mut status = None;
        eventually(limit, || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        if status.is_some() {
            self.child = None;
            self.status = status;
        }
        status.is_some()
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.port, "GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> Response {
        request(self.port, "POST", path, &[], body)
    }

    /// Fails the test if the error log shows a crash, a panic or a line
    /// at level error or above that its test does not expect
    /// (`expected_errors`).
    pub fn assert_clean_log(&self) {
        let expected: Vec<&str> = self.expected_errors.iter().map(String::as_str).collect();
        assert_clean_but(&self.error_log(), &expected);
    }

    /// Declares error lines this test expects (patterns, see `matches`):
    /// assert_clean_log lets them through.
    pub fn expect_errors(&mut self, patterns: &[&str]) {
        self.expected_errors
            .extend(patterns.iter().map(|p| p.to_string()));
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The levels at which a line in the error log is a failure unless its
/// test expects it (lua-nginx-module's tests: `--- no_error_log [error]`).
const ERROR_LEVELS: [&str; 4] = ["[error]", "[crit]", "[alert]", "[emerg]"];

/// Fails the test if `log` (an error log) shows a crash, a panic or any
/// line at level error or above.
pub fn assert_clean(log: &str) {
    assert_clean_but(log, &[]);
}

/// As assert_clean, letting through the error lines that match one of
/// `expected` (patterns, see `matches`): those the test provokes. A crash
/// fails it whatever it expects.
pub fn assert_clean_but(log: &str, expected: &[&str]) {
    for bad in ["signal 11", "signal 6", "signal 7", "exited on signal"] {
        assert!(!log.contains(bad), "error.log contains {bad:?}:\n{log}");
    }
    for line in log.lines() {
        let expected = expected.iter().any(|p| matches(line, p));
        let level = ERROR_LEVELS.iter().find(|l| line.contains(*l));
        if let Some(level) = level.filter(|_| !expected) {
            panic!("error.log has an unexpected {level} line:\n{line}\n\nerror.log:\n{log}");
        }
        assert!(
            expected || !line.contains("panic"),
            "error.log has an unexpected panic:\n{line}\n\nerror.log:\n{log}"
        );
    }
}

/// Whether `text` contains `pattern`, where a `*` in the pattern stands
/// for any run of characters: "init exploded" or "thread pool *: busy".
pub fn matches(text: &str, pattern: &str) -> bool {
    let mut rest = text;
    for piece in pattern.split('*') {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `text` is `pattern` whole, a `*` standing for any run of
/// characters.
pub fn matches_whole(text: &str, pattern: &str) -> bool {
    let pieces: Vec<&str> = pattern.split('*').collect();
    if pieces.len() == 1 {
        return text == pattern;
    }
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    text.len() >= first.len() + last.len()
        && text.starts_with(first)
        && text.ends_with(last)
        && matches(
            &text[first.len()..text.len() - last.len()],
            &pieces[1..pieces.len() - 1].join("*"),
        )
}

/// One request of a Case and the response it expects.
struct Exchange {
    method: &'static str,
    path: String,
    body: Vec<u8>,
    status: u16,
    /// The whole response body, `*` standing for any run of characters.
    want: String,
}

/// A declarative test, in the shape of lua-nginx-module's Test::Nginx
/// blocks: the configuration (thread_pool declarations, http-level
/// directives, locations served by the harness's `server { listen
/// 127.0.0.1:$PORT; ... }`, files in conf/), the requests and the
/// responses they expect, and the log lines it expects. `run` starts
/// nginx, checks every exchange and log line, and fails on any line at
/// level error or above that the case does not expect (`error_line`).
///
/// ```ignore
/// Case::new("thread_pool p threads=1;")
///     .http(r#"thread_pool_process_by_lua p "return (...):upper()";"#)
///     .lua("/", r#"ngx.say(tp.p:push_task("foo"))"#)
///     .get("/", 200, "FOO\n")
///     .run();
/// ```
#[must_use = "a Case does nothing until run or start"]
pub struct Case {
    main: String,
    http: String,
    server: String,
    files: Vec<(String, String)>,
    workers: usize,
    exchanges: Vec<Exchange>,
    log_lines: Vec<String>,
    error_lines: Vec<String>,
}

impl Case {
    /// A case whose top level (thread_pool declarations) is `main`.
    pub fn new(main: &str) -> Case {
        Case {
            main: main.to_string(),
            http: String::new(),
            server: String::new(),
            files: Vec::new(),
            workers: 1,
            exchanges: Vec::new(),
            log_lines: Vec::new(),
            error_lines: Vec::new(),
        }
    }

    /// Directives of the http block, outside the server (pools' handlers,
    /// `lua_package_path`, ...).
    pub fn http(mut self, directives: &str) -> Case {
        self.http.push_str(directives);
        self.http.push('\n');
        self
    }

    /// Anything inside the server block: locations of any kind.
    pub fn server(mut self, text: &str) -> Case {
        self.server.push_str(text);
        self.server.push('\n');
        self
    }

    /// `location PATH` whose content is the Lua `code`, with `tp` bound
    /// to `require "resty.threadpool"`.
    pub fn lua(self, path: &str, code: &str) -> Case {
        self.server(&format!(
            "location {path} {{ content_by_lua_block {{\n\
             local tp = require \"resty.threadpool\"\n{code}\n}} }}"
        ))
    }

    /// A file in conf/.
    pub fn file(mut self, name: &str, body: &str) -> Case {
        self.files.push((name.to_string(), body.to_string()));
        self
    }

    pub fn workers(mut self, n: usize) -> Case {
        self.workers = n;
        self
    }

    /// GET `path` answers `status` with the body `want` (whole; a `*`
    /// stands for any run of characters).
    pub fn get(self, path: &str, status: u16, want: &str) -> Case {
        self.request("GET", path, b"", status, want)
    }

    /// POST `body` to `path`, as `get`.
    pub fn post(self, path: &str, body: &[u8], status: u16, want: &str) -> Case {
        self.request("POST", path, body, status, want)
    }

    fn request(
        mut self,
        method: &'static str,
        path: &str,
        body: &[u8],
        status: u16,
        want: &str,
    ) -> Case {
        self.exchanges.push(Exchange {
            method,
            path: path.to_string(),
            body: body.to_vec(),
            status,
            want: want.to_string(),
        });
        self
    }

    /// A line matching `pattern` (see `matches`) shows in the error log
    /// (within 5 s of the last response).
    pub fn log_line(mut self, pattern: &str) -> Case {
        self.log_lines.push(pattern.to_string());
        self
    }

    /// A line at level error or above matching `pattern` shows in the
    /// error log, and is let through: the case provokes it.
    pub fn error_line(mut self, pattern: &str) -> Case {
        self.error_lines.push(pattern.to_string());
        self
    }

    /// The whole http block: the directives and the server.
    pub fn http_block(&self) -> String {
        format!(
            "{}\n    server {{\n        listen 127.0.0.1:$PORT;\n{}\n    }}\n",
            self.http, self.server
        )
    }

    /// Starts nginx with the case's configuration, expecting its error
    /// lines; sends nothing.
    pub fn start(&self) -> Nginx {
        let files: Vec<(&str, &str)> = self
            .files
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_str()))
            .collect();
        let mut n = Nginx::start_with(self.workers, &self.main, &self.http_block(), &files);
        n.expected_errors = self.error_lines.clone();
        n
    }

    /// Starts nginx, makes each request in turn and checks its response,
    /// then the log: every expected line is there, and no other line at
    /// level error or above. Returns nginx for more checks.
    pub fn run(self) -> Nginx {
        let n = self.start();
        self.check(&n);
        n
    }

    /// The case's exchanges and log checks against a running `n`.
    pub fn check(&self, n: &Nginx) {
        for e in &self.exchanges {
            let r = request(n.port, e.method, &e.path, &[], &e.body);
            assert!(
                r.status == e.status && matches_whole(&r.text(), &e.want),
                "{} {}: got {} {:?}, want {} {:?}\nerror.log:\n{}",
                e.method,
                e.path,
                r.status,
                r.text(),
                e.status,
                e.want,
                n.error_log()
            );
        }
        for p in self.log_lines.iter().chain(&self.error_lines) {
            let seen = eventually(Duration::from_secs(5), || {
                n.error_log().lines().any(|l| matches(l, p))
            });
            assert!(
                seen,
                "no line matching {p:?} in error.log:\n{}",
                n.error_log()
            );
        }
        n.assert_clean_log();
    }
}

pub fn children_of(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Threads of a process, from /proc.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The number in environment variable `name`, or `default` when it is not
/// set (a test's count or seed).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// Resident set size of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A size in KiB from /proc/PID/status (`field` with its colon: "VmHWM:",
/// the peak RSS); 0 when absent.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `nginx -t` on a configuration; returns its output.
pub fn nginx_test(main: &str, http: &str, files: &[(&str, &str)]) -> Output {
    nginx_test_conf(&config(free_port(), 1, main, http), files)
}

/// Runs `nginx -t` on a whole nginx.conf; returns its output.
pub fn nginx_test_conf(conf: &str, files: &[(&str, &str)]) -> Output {
    let dir = prefix("t");
    for (name, body) in files {
        std::fs::write(dir.join("conf").join(name), body).unwrap();
    }
    std::fs::write(dir.join("conf/nginx.conf"), conf).unwrap();
    let out = Command::new(nginx())
        .arg("-t")
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg("conf/nginx.conf")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request on a new connection (Connection: close).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    try_request(port, method, path, headers, body, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// As `request`, with a read timeout: an error if nginx does not answer
/// within `timeout`.
pub fn try_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(parse_response(&raw))
}

fn parse_response(raw: &[u8]) -> Response {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no header end")
        + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = raw[head_end..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Response { status, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16)
                .unwrap();
        data = &data[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// The tasks of a pool skipped so far (their caller gave up before a
/// thread took them), once none is queued or running: `path` answers
/// "QUEUED_OR_RUNNING SKIPPED" (its stats()' busy + queued, cancelled).
pub fn skipped_once_idle(n: &Nginx, path: &str) -> u64 {
    let mut skipped = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            skipped = match n.get(path).text().split_once(' ') {
                Some(("0", s)) => s.parse().ok(),
                _ => None,
            };
            skipped.is_some()
        }),
        "{path}: the pool never went idle"
    );
    skipped.unwrap()
}

/// Waits until `f` holds, polling, for at most `limit`.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// Prometheus's parser over `text`: "name{labels} value" lines, sorted.
pub fn prometheus(text: &str) -> BTreeMap<String, f64> {
    let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print(f"{s.name}{{{labels}}} {s.value}")
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with prometheus_client (make deps)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the parser refused:\n{text}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}
