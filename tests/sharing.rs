//! A pool with a Lua handler belongs to this module: nginx starts no thread
//! of its own for it. Other users of its queue are refused, never left
//! hanging: `aio threads=POOL` by `nginx -t` with the file and line,
//! `aio threads=$var` and `ngx.run_worker_thread("POOL", ...)` at once, and
//! reload and quit still complete.

mod common;

use common::*;
use std::time::{Duration, Instant};

const MAIN: &str = "thread_pool tp threads=1;";

const HANDLER: &str = r#"thread_pool_process_by_lua tp "return (...)";"#;

fn output_text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn nginx_t_refuses_aio_threads_on_a_lua_pool() {
    for (http, place) in [
        (
            "server { listen 127.0.0.1:$PORT; location /files { aio threads=tp; } }",
            "location \"/files\"",
        ),
        (
            "server { listen 127.0.0.1:$PORT; location ~ \\.txt$ { aio threads=tp; } }",
            "location \"\\.txt$\"",
        ),
        (
            "server { listen 127.0.0.1:$PORT; location @named { aio threads=tp; } }",
            "location \"@named\"",
        ),
        (
            "server { listen 127.0.0.1:$PORT; aio threads=tp; location / { } }",
            "",
        ),
        ("aio threads=tp; server { listen 127.0.0.1:$PORT; }", ""),
    ] {
        let out = Case::new(MAIN)
            .http(&format!("{HANDLER}\n{http}"))
            .nginx_t();
        let err = output_text(&out);
        assert!(!out.status.success(), "{http}: accepted\n{err}");
        assert!(
            err.contains(
                "thread pool \"tp\" has a thread_pool_process_by_lua handler and cannot also serve \"aio threads\""
            ) && err.contains(place)
                && err.contains("conf/nginx.conf:"),
            "{http}:\n{err}"
        );
        assert!(err.contains("[emerg]"), "{err}");
    }
    // another pool for aio is fine
    let out = Case::new("thread_pool tp threads=1; thread_pool io threads=1;")
        .http(&format!(
            "{HANDLER}\nserver {{ listen 127.0.0.1:$PORT; location / {{ aio threads=io; }} }}"
        ))
        .nginx_t();
    assert!(out.status.success(), "{}", output_text(&out));
}

#[test]
fn init_without_process_names_its_file_and_line() {
    let out = Case::new(MAIN)
        .http("\n\n    thread_pool_init_by_lua tp \"local x = 1\";")
        .nginx_t();
    let err = output_text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "thread pool \"tp\" has thread_pool_init_by_lua but no thread_pool_process_by_lua in "
        ) && err.contains("conf/nginx.conf:"),
        "{err}"
    );
}

const RWT_MOD: &str = "return { work = function(s) return s end }";

fn start() -> Nginx {
    let path = format!("{}/lua/?.lua;$prefix/conf/?.lua;;", repo().display());
    let aio = r#"
        location /aio {
            set $pool tp;
            alias conf/file.txt;
            aio threads=$pool;
            sendfile off;
        }
"#;
    let rwt = r#"
        local ok, res = ngx.run_worker_thread("tp", "rwt_mod", "work", "x")
        ngx.say(tostring(ok), " ", tostring(res))
"#;
    Case::new(MAIN)
        .http(&format!("lua_package_path \"{path}\";\n{HANDLER}"))
        .file("rwt_mod.lua", RWT_MOD)
        .file("file.txt", &"x".repeat(64 * 1024))
        .server(aio)
        .lua("/rwt", rwt)
        .lua("/tp", r#"ngx.say(tp.tp:push_task("ok"))"#)
        .start()
}

/// The raw bytes of a GET, read until nginx closes the connection.
fn raw_get(port: u16, path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(raw)
}

#[test]
fn run_time_users_fail_at_once_and_reload_and_quit_complete() {
    let mut ngx = start();
    let t0 = Instant::now();
    // nginx has sent nothing yet when the read fails: it closes the
    // connection (a 500 would do as well); what matters is that it ends.
    let aio = raw_get(ngx.port, "/aio").expect("aio threads=$var hung");
    assert!(
        !aio.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&aio)
    );
    let rwt = try_request(ngx.port, "GET", "/rwt", &[], b"", Duration::from_secs(10))
        .expect("run_worker_thread hung");
    assert_eq!(rwt.text(), "false thread pool tp not found\n");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(ngx.get("/tp").text(), "ok\n");
    let log = ngx.error_log();
    assert!(log.contains("thread pool \"tp\" not found"), "{log}");
    // nginx's own refusal of aio threads=$var on this module's pool
    ngx.expect_errors(&["[error]*thread pool \"tp\" not found while sending response"]);
    ngx.assert_clean_log();

    ngx.signal("HUP");
    let reloaded = eventually(Duration::from_secs(10), || {
        ngx.error_log().matches("gracefully shutting down").count() >= 1
            && ngx.error_log().contains("exit")
    });
    assert!(reloaded, "{}", ngx.error_log());
    assert_eq!(ngx.get("/tp").text(), "ok\n");
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
}

/// `lua_thread_pool` declares a pool from the http block, so that one
/// conf.d snippet holds the pool, its handler and its location.
#[test]
fn a_pool_declared_in_the_http_block() {
    let http = r#"
    lua_thread_pool up threads=2 max_queue=8;
    thread_pool_process_by_lua up "return (...):upper()";
"#;
    Case::new("")
        .http(http)
        .lua("/", r#"ngx.print(tp.up:push_task("snippet"))"#)
        .get("/", 200, "SNIPPET")
        .log_line("ngx_threadpool: thread pool \"up\": 2 threads, queue bound 8")
        .run();

    for (main, http, expected) in [
        (
            "thread_pool up threads=1;",
            "lua_thread_pool up threads=2;\nthread_pool_process_by_lua up \"return ...\";",
            "thread pool \"up\" is already declared",
        ),
        (
            "",
            "lua_thread_pool up max_queue=2;\nthread_pool_process_by_lua up \"return ...\";",
            "takes threads=N [max_queue=M]: invalid \"threads=N missing\"",
        ),
        (
            "",
            "lua_thread_pool up threads=two;\nthread_pool_process_by_lua up \"return ...\";",
            "takes threads=N [max_queue=M]: invalid \"threads=two\"",
        ),
    ] {
        let out = Case::new(main).http(http).nginx_t();
        let err = output_text(&out);
        assert!(!out.status.success() && err.contains(expected), "{err}");
    }
}
