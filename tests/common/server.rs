//! A running nginx (`Nginx`): started by `Case`, signalled, quit, stopped
//! and its prefix removed when dropped; its error log's check.

use super::env::{nginx, nginx_env};
use super::http::{request, Response};
use super::log::assert_clean_but;
use super::procs::children_of;
use super::wait::eventually;
use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
    /// Starts nginx on the prefix `dir`, whose conf/nginx.conf is written
    /// and listens on `port`, with `args` after nginx's own and `wrapper`
    /// (a command and its arguments, e.g. valgrind's) before it, `env` and
    /// the harness's (env::nginx_env) in its environment, and waits
    /// up to `ready` for it to listen and, if `has_workers`, for a worker.
    /// Case::start's implementation: tests start nginx through a Case.
    pub(super) fn spawn(
        dir: PathBuf,
        port: u16,
        wrapper: &[String],
        args: &[String],
        env: &[(String, String)],
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
            .envs(nginx_env())
            .envs(env.iter().map(|(k, v)| (k, v)))
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

    /// Quits nginx started under valgrind (Case::under_valgrind), once its
    /// last responses are written, and asserts that valgrind found no error.
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

    pub fn master_pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// The worker processes of this nginx (children of the master).
    pub fn workers(&self) -> Vec<u32> {
        children_of(self.master_pid())
    }

    pub fn signal(&self, sig: &str) {
        super::procs::kill(self.master_pid(), sig);
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
