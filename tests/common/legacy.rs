//! The former ways to start nginx, kept over Case while the test files
//! move to it, and removed once none uses them.

use super::case::Case;
use super::server::Nginx;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

impl Nginx {
    pub fn start(main: &str, http: &str) -> Nginx {
        Case::new(main).http(http).start()
    }

    pub fn start_with(workers: usize, main: &str, http: &str, files: &[(&str, &str)]) -> Nginx {
        files
            .iter()
            .fold(Case::new(main).http(http).workers(workers), |c, (n, b)| {
                c.file(n, b)
            })
            .start()
    }

    pub fn start_prefix(dir: PathBuf, port: u16, args: &[&str]) -> Nginx {
        Case::laid_out(dir, port).args(args).start()
    }

    pub fn start_single(
        wrapper: impl FnOnce(&Path) -> Vec<String>,
        ready: Duration,
        main: &str,
        http: &str,
    ) -> Nginx {
        let words = wrapper(Path::new(""));
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        Case::new(main)
            .http(http)
            .single_process()
            .wrapper(&words)
            .ready_within(ready)
            .start()
    }

    pub fn start_under_valgrind(main: &str, http: &str) -> Nginx {
        Case::new(main).http(http).under_valgrind().start()
    }
}

pub fn config(port: u16, workers: usize, main: &str, http: &str) -> String {
    Case::new(main)
        .http(http)
        .workers(workers)
        .port(port)
        .conf_text()
}

pub fn nginx_test(main: &str, http: &str, files: &[(&str, &str)]) -> Output {
    files
        .iter()
        .fold(Case::new(main).http(http), |c, (n, b)| c.file(n, b))
        .nginx_t()
}

pub fn nginx_test_conf(conf: &str, files: &[(&str, &str)]) -> Output {
    files
        .iter()
        .fold(Case::conf(conf), |c, (n, b)| c.file(n, b))
        .nginx_t()
}
