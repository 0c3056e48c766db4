//! The phases push_task works in: those where lua-nginx-module lets a
//! coroutine wait (rewrite, access, content, timers, server_rewrite_by_lua,
//! ssl_certificate_by_lua, and precontent_by_lua from 0.10.31 on;
//! run_worker_thread works there too), and an
//! error naming the phase everywhere else. ssl_client_hello_by_lua is
//! refused too: Debian's nginx cannot resume a handshake paused there.
//!
//! The TLS server's client is nginx itself: a plain location proxies to it
//! over TLS, so no TLS client is needed here.

mod common;

use common::{free_port, Case, Nginx};
use std::time::Duration;

const MAIN: &str = "thread_pool upper_pool threads=1;";

/// A self-signed P-256 certificate for localhost, valid until 2126, and
/// its key: made for this test only.
const CERT: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBfjCCASWgAwIBAgIUC77ZDEIoQxM5ykegy10EDZSPLeAwCgYIKoZIzj0EAwIw\n\
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyNTAwMjYwNloYDzIxMjYxMTAx\n\
MDAyNjA2WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO\n\
PQMBBwNCAATiVcQD12bKd5iOnxhFdM8LFrFUe73GfEGHF3/kvw4+zF40WzPdwXmR\n\
nAftnpnq7aIuYJzHey679257RyTM6tIdo1MwUTAdBgNVHQ4EFgQUQJyzNgwpgNmB\n\
Jg8lpWFVeA/SSWswHwYDVR0jBBgwFoAUQJyzNgwpgNmBJg8lpWFVeA/SSWswDwYD\n\
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiB1pUelpUO7BPPS+ambKSIT\n\
g2ahDapSq4sVbTqp5IQ79wIgalEuzT0vowblHFvKEYNBvC7e5tNjA1Nx1RTP1UtV\n\
XCM=\n\
-----END CERTIFICATE-----\n\
";
const KEY: &str = "\
-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgOxjhY9hb4+aCBuwg\n\
dhEDtcz4LmsV9P+sAnsTUGg8fXmhRANCAATiVcQD12bKd5iOnxhFdM8LFrFUe73G\n\
fEGHF3/kvw4+zF40WzPdwXmRnAftnpnq7aIuYJzHey679257RyTM6tId\n\
-----END PRIVATE KEY-----\n\
";

const HTTP: &str = r#"
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
    lua_shared_dict results 1m;
    server {
        listen 127.0.0.1:$TLS_PORT ssl;
        ssl_certificate cert.pem;
        ssl_certificate_key key.pem;
        ssl_client_hello_by_lua_block {
            local tp = require "resty.threadpool"
            local ok, err = pcall(tp.upper_pool.push_task, tp.upper_pool, "x")
            ngx.shared.results:set("client_hello", tostring(ok) .. " " .. err)
        }
        ssl_certificate_by_lua_block {
            local tp = require "resty.threadpool"
            ngx.shared.results:set("cert", assert(tp.upper_pool:push_task("certificate")))
        }
        server_rewrite_by_lua_block {
            local tp = require "resty.threadpool"
            ngx.ctx.server_rewrite = assert(tp.upper_pool:push_task("server rewrite"))
        }
        location /tls {
            content_by_lua_block {
                local d = ngx.shared.results
                ngx.say(d:get("cert"), ",", ngx.ctx.server_rewrite)
                ngx.say(d:get("client_hello"))
            }
        }
    }
    # ngx.sleep where the push waits: whether this nginx can resume a
    # certificate callback that paused at all
    server {
        listen 127.0.0.1:$SLEEP_PORT ssl;
        ssl_certificate cert.pem;
        ssl_certificate_key key.pem;
        ssl_certificate_by_lua_block { ngx.sleep(0.001) }
        location /sleep { return 200 "slept\n"; }
    }
    server {
        listen 127.0.0.1:$PORT;
        location /tls {
            proxy_pass https://127.0.0.1:$TLS_PORT;
        }
        location /sleep {
            proxy_pass https://127.0.0.1:$SLEEP_PORT;
        }
    }
"#;

#[test]
fn push_task_waits_in_server_rewrite_and_ssl_certificate() {
    let http = HTTP
        .replace("$TLS_PORT", &free_port().to_string())
        .replace("$SLEEP_PORT", &free_port().to_string());
    let n = Case::new(MAIN)
        .http(&http)
        .file("cert.pem", CERT)
        .file("key.pem", KEY)
        .start();
    if n.get("/sleep").status != 200 {
        // an nginx built from its own tarball lacks the patch Debian's
        // and OpenResty's nginx carry that lets a certificate callback
        // pause: the push fails the handshake as
        // ngx.sleep does, and nothing else
        eprintln!(
            "{}: ngx.sleep fails in ssl_certificate_by_lua",
            common::nginx()
        );
        assert_eq!(n.get("/tls").status, 502);
        return;
    }
    let r = n.get("/tls");
    let text = r.text();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("CERTIFICATE,SERVER REWRITE"), "{text}");
    let hello = lines.next().unwrap_or_default();
    assert!(
        hello.starts_with("false ")
            && hello.contains("API disabled in the context of ssl_client_hello"),
        "{text}"
    );
    n.assert_clean_log();
}

#[test]
fn push_task_outside_yieldable_contexts_names_the_context() {
    let http = r#"
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
    lua_shared_dict results 1m;
    init_worker_by_lua_block {
        local tp = require "resty.threadpool"
        local ok, err = pcall(function() return tp.upper_pool:push_task("x") end)
        ngx.shared.results:set("init_worker", tostring(ok) .. " " .. tostring(err))
        -- the pools start after init_worker_by_lua; a timer reaches them
        local posted, perr = tp.upper_pool:post_task("x")
        local stats, serr = tp.upper_pool:stats()
        ngx.shared.results:set("init_worker_post", tostring(posted) .. " " .. tostring(perr)
            .. "|" .. tostring(stats) .. " " .. tostring(serr))
        assert(ngx.timer.at(0, function()
            ngx.shared.results:set("timer_post", tostring(tp.upper_pool:post_task("x"))
                .. " " .. tp.upper_pool:stats().threads)
        end))
    }
    server {
        listen 127.0.0.1:$PORT;
        location /set {
            set_by_lua_block $res {
                local tp = require "resty.threadpool"
                local ok, err = pcall(tp.upper_pool.push_task, tp.upper_pool, "x")
                return tostring(ok) .. " " .. tostring(err)
            }
            return 200 "$res\n";
        }
        location /header_filter {
            content_by_lua_block { ngx.say("body") }
            header_filter_by_lua_block {
                local tp = require "resty.threadpool"
                local ok, err = pcall(tp.upper_pool.push_task, tp.upper_pool, "x")
                ngx.log(ngx.ERR, "header_filter said: ", tostring(ok), " ", err)
            }
        }
        location /log {
            content_by_lua_block { ngx.say("body") }
            log_by_lua_block {
                local tp = require "resty.threadpool"
                tp.upper_pool:push_task("x")
            }
        }
        location /init_worker {
            content_by_lua_block { ngx.say(ngx.shared.results:get(ngx.var.arg_key or "init_worker")) }
        }
        location /works {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.say(assert(tp.upper_pool:push_task("ok")))
            }
        }
        location /version {
            content_by_lua_block { ngx.say(ngx.config.ngx_lua_version) }
        }
    }
"#;
    let mut n = Case::new(MAIN).http(http).start();
    let t = n.get("/set").text();
    assert!(
        t.starts_with("false ") && t.contains("API disabled in the context of set"),
        "{t}"
    );
    // the contexts of the lua module loaded: precontent from 0.10.31 on
    let contexts = if lua_version(&n) >= 10_031 {
        "rewrite, server_rewrite, access, precontent, content, timer or ssl_certificate"
    } else {
        "rewrite, server_rewrite, access, content, timer or ssl_certificate"
    };
    assert!(
        t.contains(&format!(
            "(use it in {contexts}, or an ngx.thread of those)"
        )),
        "{t}"
    );
    let t = n.get("/init_worker").text();
    assert!(
        t.starts_with("false ") && t.contains("API disabled in the context of init_worker"),
        "{t}"
    );
    let started =
        "nil thread pools start after init_worker_by_lua: reach them from ngx.timer.at(0, ...)";
    assert_eq!(
        n.get("/init_worker?key=init_worker_post").text(),
        format!("{started}|{started}\n")
    );
    assert_eq!(n.get("/init_worker?key=timer_post").text(), "true 1\n");

    assert_eq!(n.get("/header_filter").text(), "body\n");
    assert_eq!(n.get("/log").text(), "body\n");
    assert!(common::eventually(Duration::from_secs(5), || {
        n.error_log().contains("failed to run log_by_lua")
    }));
    let log = n.error_log();
    assert!(
        log.contains("header_filter said: false ")
            && log.contains("API disabled in the context of header_filter"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("failed to run log_by_lua")
            && l.contains("API disabled in the context of log")),
        "{log}"
    );
    assert_eq!(n.get("/works").text(), "OK\n");
    // the refusals this test provokes, logged at level error
    n.expect_errors(&[
        "[error]*header_filter said: false ",
        "[error]*failed to run log_by_lua*API disabled in the context of log",
    ]);
    n.assert_clean_log();
}

/// The lua module's `ngx.config.ngx_lua_version` (10031 for 0.10.31), from
/// a location `/version` of `n` that says it.
fn lua_version(n: &Nginx) -> u32 {
    let t = n.get("/version").text();
    t.trim().parse().unwrap_or_else(|_| panic!("/version: {t}"))
}

#[test]
fn push_task_waits_in_precontent_where_the_lua_module_has_it() {
    let http = r#"
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
    server {
        listen 127.0.0.1:$PORT;
        location /version {
            content_by_lua_block { ngx.say(ngx.config.ngx_lua_version) }
        }
    }
"#;
    let version = lua_version(&Case::new(MAIN).http(http).start());
    let precontent = r#"
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
    server {
        listen 127.0.0.1:$PORT;
        location /precontent {
            precontent_by_lua_block {
                local tp = require "resty.threadpool"
                local th = ngx.thread.spawn(function()
                    return tp.upper_pool:push_task("light thread")
                end)
                ngx.ctx.precontent = assert(tp.upper_pool:push_task("precontent"))
                local _, in_thread = assert(ngx.thread.wait(th))
                ngx.ctx.in_thread = in_thread
            }
            content_by_lua_block {
                ngx.say(ngx.ctx.precontent, ",", ngx.ctx.in_thread, ",", ngx.get_phase())
            }
        }
    }
"#;
    if version < 10_031 {
        // precontent_by_lua came with 0.10.31: an older release refuses it
        // as an unknown directive, and there is nothing to push from
        let out = Case::new(MAIN).http(precontent).nginx_t();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains("unknown directive \"precontent_by_lua_block\""),
            "{stderr}"
        );
        eprintln!(
            "lua-nginx-module {version} has no precontent_by_lua: the push there is not tried"
        );
        return;
    }
    let n = Case::new(MAIN).http(precontent).start();
    assert_eq!(
        n.get("/precontent").text(),
        "PRECONTENT,LIGHT THREAD,content\n"
    );
    n.assert_clean_log();
}

#[test]
fn push_task_works_in_every_yieldable_context() {
    let http = r#"
    thread_pool_process_by_lua upper_pool "local arg = ... return arg:upper()";
    lua_shared_dict results 1m;
    server {
        listen 127.0.0.1:$PORT;
        location /phases {
            rewrite_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.ctx.rewrite = assert(tp.upper_pool:push_task("rewrite"))
            }
            access_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.ctx.access = assert(tp.upper_pool:push_task("access"))
            }
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local th = ngx.thread.spawn(function()
                    return tp.upper_pool:push_task("light thread")
                end)
                local content = assert(tp.upper_pool:push_task("content"))
                local _, in_thread = assert(ngx.thread.wait(th))
                ngx.say(ngx.ctx.rewrite, ",", ngx.ctx.access, ",", content, ",", in_thread)
            }
        }
        location /timer {
            content_by_lua_block {
                local ok, err = ngx.timer.at(0, function(premature)
                    local tp = require "resty.threadpool"
                    local res, err = tp.upper_pool:push_task("timer")
                    ngx.shared.results:set("timer", res or ("error: " .. tostring(err)))
                end)
                ngx.say(ok and "scheduled" or err)
            }
        }
        location /result {
            content_by_lua_block { ngx.say(ngx.shared.results:get("timer") or "none") }
        }
    }
"#;
    let n = Case::new(MAIN).http(http).start();
    assert_eq!(
        n.get("/phases").text(),
        "REWRITE,ACCESS,CONTENT,LIGHT THREAD\n"
    );
    assert_eq!(n.get("/timer").text(), "scheduled\n");
    assert!(
        common::eventually(Duration::from_secs(5), || n.get("/result").text()
            != "none\n"),
        "the timer never stored its result"
    );
    assert_eq!(n.get("/result").text(), "TIMER\n");
    n.assert_clean_log();
}
