//! `Case`, the one way a test starts nginx: its configuration, how nginx
//! runs, the requests and the log lines it expects.

use super::conf::harness_conf;
use super::env::{nginx, nginx_env, repo};
use super::http::request;
use super::log::{matches, matches_whole};
use super::scratch::{free_port, prefix};
use super::server::Nginx;
use super::wait::eventually;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

/// One request of a Case and the response it expects.
struct Exchange {
    method: &'static str,
    path: String,
    body: Vec<u8>,
    status: u16,
    /// The whole response body, `*` standing for any run of characters.
    want: String,
}

/// Where a Case's nginx.conf comes from.
enum Conf {
    /// The harness's (conf.rs) around `main`, `http` and `server`.
    Harness {
        main: String,
        http: String,
        server: String,
    },
    /// A whole nginx.conf of the test's.
    Whole(String),
    /// A prefix the test laid out, its conf/nginx.conf written.
    LaidOut(PathBuf),
}

/// A test's nginx, in the shape of lua-nginx-module's Test::Nginx blocks:
/// the configuration (thread_pool declarations, http-level directives,
/// locations served by the harness's `server { listen 127.0.0.1:$PORT;
/// ... }`, files in conf/), how nginx runs (workers, one process, under
/// valgrind, extra arguments), the requests and the responses they
/// expect, and the log lines it expects. `$PORT` in the configuration
/// stands for the port nginx listens on, a free one (`free_port`) unless
/// `port` sets it. `run` starts nginx, checks every exchange and log
/// line, and fails on any line at level error or above that the case does
/// not expect (`error_line`); `start` only starts it, for a test that
/// speaks to it itself and checks its log with `Nginx::assert_clean_log`;
/// `nginx_t` checks the configuration with `nginx -t`.
///
/// ```ignore
/// Case::new("thread_pool p threads=1;")
///     .http(r#"thread_pool_process_by_lua p "return (...):upper()";"#)
///     .lua("/", r#"ngx.say(tp.p:push_task("foo"))"#)
///     .get("/", 200, "FOO\n")
///     .run();
/// ```
#[must_use = "a Case does nothing until run, start or nginx_t"]
pub struct Case {
    conf: Conf,
    files: Vec<(String, String)>,
    workers: usize,
    master: bool,
    valgrind: bool,
    wrapper: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ready: Duration,
    port: Option<u16>,
    exchanges: Vec<Exchange>,
    log_lines: Vec<String>,
    error_lines: Vec<String>,
}

impl Case {
    /// A case in the harness's nginx.conf (the module lines, one worker,
    /// the error log at info, `lua_package_path` naming the repo's lua/),
    /// whose top level (thread_pool declarations) is `main`.
    pub fn new(main: &str) -> Case {
        Case::with(Conf::Harness {
            main: main.to_string(),
            http: String::new(),
            server: String::new(),
        })
    }

    /// A case whose nginx.conf is `conf`, whole (README's synopsis, a
    /// configuration whose module lines a test reorders).
    pub fn conf(conf: &str) -> Case {
        Case::with(Conf::Whole(conf.to_string()))
    }

    /// nginx on the prefix `dir` that the test laid out, conf/nginx.conf
    /// written and listening on `port` (the stock layout of Debian's
    /// package). Dropping the nginx removes `dir`.
    pub fn laid_out(dir: PathBuf, port: u16) -> Case {
        Case::with(Conf::LaidOut(dir)).port(port)
    }

    fn with(conf: Conf) -> Case {
        Case {
            conf,
            files: Vec::new(),
            workers: 1,
            master: true,
            valgrind: false,
            wrapper: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            ready: Duration::from_secs(10),
            port: None,
            exchanges: Vec::new(),
            log_lines: Vec::new(),
            error_lines: Vec::new(),
        }
    }

    /// The harness's parts of the configuration, which a whole one lacks.
    fn parts(&mut self) -> (&mut String, &mut String) {
        match &mut self.conf {
            Conf::Harness { http, server, .. } => (http, server),
            _ => panic!("http, server and lua add to the harness's nginx.conf (Case::new)"),
        }
    }

    /// Directives of the http block, as written: pools' handlers,
    /// `lua_package_path` (which replaces the harness's: it must then list
    /// the repo's lua/ dir itself), servers of the test's own (`listen
    /// 127.0.0.1:$PORT` for the one the harness talks to).
    pub fn http(mut self, directives: &str) -> Case {
        let http = self.parts().0;
        http.push_str(directives);
        http.push('\n');
        self
    }

    /// Anything inside the harness's server block, `server { listen
    /// 127.0.0.1:$PORT; ... }`: locations of any kind. The block is
    /// written when a case adds to it, or when nginx starts and no server
    /// of `http` listens on `$PORT`.
    pub fn server(mut self, text: &str) -> Case {
        let server = self.parts().1;
        server.push_str(text);
        server.push('\n');
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

    /// `worker_processes` (1 by default).
    pub fn workers(mut self, n: usize) -> Case {
        self.workers = n;
        self
    }

    /// nginx as a single process (`master_process off`: it serves and runs
    /// the pools itself).
    pub fn single_process(mut self) -> Case {
        self.master = false;
        self
    }

    /// Starts nginx through `command` (a program and its arguments put
    /// before nginx's, e.g. `prlimit --as=...`).
    pub fn wrapper(mut self, command: &[&str]) -> Case {
        self.wrapper = command.iter().map(|w| w.to_string()).collect();
        self
    }

    /// A single process under valgrind's memcheck (`make valgrind`), where
    /// a definite leak is an error unless tests/valgrind.supp names it
    /// (nginx's own); quit it with `Nginx::quit_under_valgrind`.
    pub fn under_valgrind(mut self) -> Case {
        self.valgrind = true;
        self.ready_within(Duration::from_secs(120)).single_process()
    }

    /// How long nginx may take to listen (10 s by default).
    pub fn ready_within(mut self, limit: Duration) -> Case {
        self.ready = limit;
        self
    }

    /// Arguments after nginx's own `-p` and `-c` (e.g. `-g "daemon off;"`
    /// for a configuration that does not say it).
    pub fn args(mut self, args: &[&str]) -> Case {
        self.args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// An environment variable of nginx's (the master's: workers inherit
    /// what glibc and the loader read at start, e.g. `MALLOC_PERTURB_`).
    pub fn env(mut self, name: &str, value: &str) -> Case {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// The port that `$PORT` stands for, rather than a free one.
    pub fn port(mut self, port: u16) -> Case {
        self.port = Some(port);
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

    /// The nginx.conf that `nginx_t` writes: `$PORT` stands for the port
    /// unless `port` set it. A test finds a directive's line in it.
    pub fn conf_text(&self) -> String {
        self.text(false)
    }

    /// The nginx.conf; `listening` adds the harness's server when nothing
    /// else listens on `$PORT`, for nginx to be reached.
    fn text(&self, listening: bool) -> String {
        let text = match &self.conf {
            Conf::Harness { main, http, server } => {
                let listen = !server.is_empty() || (listening && !http.contains("$PORT"));
                let http = if listen {
                    format!("{http}\n    server {{\n        listen 127.0.0.1:$PORT;\n{server}\n    }}\n")
                } else {
                    http.clone()
                };
                harness_conf(self.workers, self.master, main, &http)
            }
            Conf::Whole(conf) => conf.clone(),
            Conf::LaidOut(dir) => std::fs::read_to_string(dir.join("conf/nginx.conf")).unwrap(),
        };
        match self.port {
            Some(port) => text.replace("$PORT", &port.to_string()),
            None => text,
        }
    }

    /// A prefix with conf/nginx.conf (`listening`, see `text`) and the
    /// case's files, and the port nginx is to listen on; whether the prefix
    /// is the case's own (laid out by the test).
    fn lay_out(&self, tag: &str, listening: bool) -> (PathBuf, u16, bool) {
        let port = self.port.unwrap_or_else(free_port);
        if let Conf::LaidOut(dir) = &self.conf {
            return (dir.clone(), port, true);
        }
        let dir = prefix(tag);
        for (name, body) in &self.files {
            std::fs::write(dir.join("conf").join(name), body).unwrap();
        }
        let conf = self.text(listening).replace("$PORT", &port.to_string());
        std::fs::write(dir.join("conf/nginx.conf"), conf).unwrap();
        (dir, port, false)
    }

    /// Starts nginx with the case's configuration, expecting its error
    /// lines; sends nothing. Waits until it listens (and, with a master,
    /// has a worker).
    pub fn start(&self) -> Nginx {
        let (dir, port, _) = self.lay_out(if self.master { "run" } else { "single" }, true);
        let wrapper = if self.valgrind {
            let supp = repo().join("tests/valgrind.supp");
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
        } else {
            self.wrapper.clone()
        };
        let mut n = Nginx::spawn(
            dir,
            port,
            &wrapper,
            &self.args,
            &self.env,
            self.ready,
            self.master,
        );
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

    /// Writes the case's nginx.conf over that of the running `n` (same
    /// prefix and port), for the reload that follows.
    pub fn rewrite(&self, n: &Nginx) {
        let conf = self.text(true).replace("$PORT", &n.port.to_string());
        std::fs::write(n.dir.join("conf/nginx.conf"), conf).unwrap();
    }

    /// Runs `nginx -t` on the case's configuration; returns its output.
    pub fn nginx_t(&self) -> Output {
        self.nginx_once(&["-t"])
    }

    /// Runs nginx once with `args` (`-t`, `-T`) on the case's
    /// configuration, in a prefix of its own, and returns its output.
    pub fn nginx_once(&self, args: &[&str]) -> Output {
        let (dir, _, laid_out) = self.lay_out("t", false);
        let out = Command::new(nginx())
            .args(args)
            .envs(nginx_env())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg("conf/nginx.conf")
            .output()
            .unwrap();
        if !laid_out {
            let _ = std::fs::remove_dir_all(&dir);
        }
        out
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
