//! The phases where push_task waits beyond rewrite, access, content and
//! timers: server_rewrite_by_lua and ssl_certificate_by_lua, where
//! lua-nginx-module lets a coroutine wait (run_worker_thread works there
//! too). ssl_client_hello_by_lua is refused with an error naming it:
//! Debian's nginx cannot resume a handshake paused there.
//!
//! The TLS server's client is nginx itself: a plain location proxies to it
//! over TLS, so no TLS client is needed here.

mod common;

use common::{free_port, Nginx};

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
    server {
        listen 127.0.0.1:$PORT;
        location /tls {
            proxy_pass https://127.0.0.1:$TLS_PORT;
        }
    }
"#;

#[test]
fn push_task_waits_in_server_rewrite_and_ssl_certificate() {
    let http = HTTP.replace("$TLS_PORT", &free_port().to_string());
    let main = "thread_pool upper_pool threads=1;";
    let n = Nginx::start_with(1, main, &http, &[("cert.pem", CERT), ("key.pem", KEY)]);
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
