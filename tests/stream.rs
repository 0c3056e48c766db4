//! Streams (`push_stream`): a handler's chunks reach the reader in order
//! and before its results, an error after some chunks comes after them, a
//! producer faster than its reader waits instead of piling chunks up in
//! the worker's memory, and a reader that gives up (timeout, close, client
//! gone) cancels the handler: its next or waiting send fails at once with
//! "cancelled" and `cancelled()` is true. Input the other way: the
//! caller's writes reach the handler's receive() in order, then the end of
//! input, and a caller faster than its handler is held back by the same
//! bound. What the handler saw is recorded in a shared dict and read back
//! over HTTP.

mod common;

use common::handlers::rust_fixture;
use common::{eventually, request, status_kib, Nginx};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const HTTP: &str = r#"
    lua_shared_dict seen 1m;
    lua_thread_pool gen threads=2;
    thread_pool_process_by_lua_block gen {
        local tp = require "resty.threadpool"
        local handlers = {}
        -- chunks 1..n of mixed kinds, then two results
        function handlers.count(n)
            for i = 1, n do
                local chunk = i
                if i % 3 == 1 then
                    chunk = "c" .. i
                elseif i % 3 == 2 then
                    chunk = { i = i, s = { "x" } }
                end
                assert(tp.send(chunk))
            end
            return "end", n
        end
        -- n chunks (more than the stream's bound), then an error
        function handlers.fail(n)
            for i = 1, n do
                assert(tp.send(i))
            end
            error("failed after " .. n, 0)
        end
        -- n chunks of size bytes as fast as it can
        function handlers.flood(n, size)
            local s = string.rep("x", size)
            for i = 1, n do
                local ok, err = tp.send(s)
                if not ok then
                    return nil, "send " .. i .. ": " .. err
                end
            end
            return n
        end
        -- sends until a send fails, then records why under key
        function handlers.forever(key)
            local i = 0
            while true do
                i = i + 1
                local ok, err = tp.send(i)
                if not ok then
                    ngx.shared.seen:set(key, err .. " " .. tostring(tp.cancelled()))
                    return
                end
            end
        end
        -- one chunk, then after pause seconds (the reader's timeout
        -- passes meanwhile) one more send, whose outcome it records
        function handlers.pause(key, pause)
            assert(tp.send("first"))
            local deadline = ngx.now() + pause
            while ngx.now() < deadline do
                ngx.update_time()
            end
            local ok, err = tp.send("second")
            ngx.shared.seen:set(key, tostring(ok) .. " " .. tostring(err) .. " "
                                .. tostring(tp.cancelled()))
        end
        function handlers.plain(a, b)
            return a + b, "plain"
        end
        function handlers.misuse(v)
            return pcall(tp.send, v)
        end
        -- after pause seconds, receives every chunk until the end of
        -- input, sending back the sum of their n fields
        function handlers.sum(pause)
            local deadline = ngx.now() + pause
            while ngx.now() < deadline do
                ngx.update_time()
            end
            local sum, count = 0, 0
            while true do
                local chunk, err = tp.receive()
                if chunk == nil then
                    return sum, count, err
                end
                sum, count = sum + chunk.n, count + 1
                if count % 200 == 0 then
                    assert(tp.send(sum))
                end
            end
        end
        -- receives until the caller lets go, recording why under key;
        -- tells the caller it got the first chunk
        function handlers.drain(key)
            local first = true
            while true do
                local chunk, err = tp.receive()
                if first then
                    first = false
                    assert(tp.send("got"))
                end
                if chunk == nil then
                    ngx.shared.seen:set(key, tostring(err) .. " " .. tostring(tp.cancelled()))
                    return
                end
            end
        end
        function handlers.badchunk()
            return tp.send(print)
        end
        return function(what, ...)
            return handlers[what](...)
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;
        location /seen {
            content_by_lua_block { ngx.print(ngx.shared.seen:get(ngx.var.arg_k)) }
        }
        location /chunks {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").gen:push_stream(ngx.var.arg_what,
                                                                            tonumber(ngx.var.arg_n)))
                local got = {}
                while true do
                    local v, err = s:read()
                    if s.done then
                        ngx.say(table.concat(got, ","), " ", tostring(v), " ", tostring(err))
                        break
                    end
                    if type(v) == "table" then
                        v = "t" .. v.i .. v.s[1]
                    end
                    got[#got + 1] = v
                end
            }
        }
        location /plain {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local s = assert(tp.gen:push_stream("plain", 1, 2))
                local a, b = s:read()
                local done = s.done
                local again, err = s:read()
                ngx.say(a, " ", b, " ", tostring(done), " ", tostring(again), " ", err,
                        " | ", table.concat({ tp.gen:push_task("plain", 1, 2) }, " "))
            }
        }
        location /misuse {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local ok, err = tp.gen:push_task("misuse", 1)
                local bad = pcall(tp.gen.push_stream_opts, tp.gen, { chunks = 0.5 }, "plain", 1, 2)
                local s = assert(tp.gen:push_stream("badchunk"))
                local v, serr = s:read()
                ngx.say(tostring(ok), " ", err, " | ", tostring(bad), " | ",
                        tostring(v), " ", serr, " ", tostring(s.done))
            }
        }
        location /flood {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local n, size = tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_size)
                local s = assert(tp.gen:push_stream_opts({ chunks = 16 }, "flood", n, size))
                -- a slow reader: it sleeps before it starts and now and then
                ngx.sleep(0.5)
                local chunks, bytes = 0, 0
                while true do
                    local v, err = s:read()
                    if s.done then
                        ngx.say(chunks, " ", bytes, " ", tostring(v), " ", tostring(err))
                        break
                    end
                    chunks = chunks + 1
                    bytes = bytes + #v
                    if chunks % 1000 == 0 then
                        ngx.sleep(0.05)
                    end
                end
            }
        }
        location /close {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").gen:push_stream_opts(
                    { chunks = 1 }, "forever", ngx.var.arg_key))
                local a, b = s:read(), s:read()
                s:close()
                local after, err = s:read()
                ngx.say(a, " ", b, " ", tostring(after), " ", err)
            }
        }
        location /timeout {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").gen:push_stream("pause", ngx.var.arg_key,
                    tonumber(ngx.var.arg_pause) or 0.5))
                local first = s:read()
                local v, err = s:read(0.05)
                ngx.say(first, " ", tostring(v), " ", err, " ", tostring(s.done))
            }
        }
        location /abort {
            lua_check_client_abort on;
            content_by_lua_block {
                local s = assert(require("resty.threadpool").gen:push_stream_opts(
                    { chunks = 1 }, "forever", ngx.var.arg_key))
                ngx.say("chunk ", s:read())
                ngx.flush(true)
                ngx.sleep(30)
            }
        }
        location /input {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").gen:push_stream_opts(
                    { chunks = 4 }, "sum", 0.3))
                -- the handler is not receiving yet: four fit, the fifth
                -- does not, unless it waits
                local out = {}
                for i = 1, 5 do
                    local ok, err = s:write({ n = i }, true)
                    out[#out + 1] = tostring(ok) .. (err and (":" .. err) or "")
                end
                local n = tonumber(ngx.var.arg_n)
                for i = 5, n do
                    assert(s:write({ n = i }))
                end
                s:close_write()
                local sent, err = s:write({ n = 0 })
                out[#out + 1] = tostring(sent) .. ":" .. err
                local partial = 0
                while true do
                    local v, a, b = s:read()
                    if s.done then
                        out[#out + 1] = table.concat({ tostring(v), tostring(a), tostring(b) }, ":")
                        break
                    end
                    partial = partial + 1
                end
                out[#out + 1] = partial
                ngx.say(table.concat(out, " "))
            }
        }
        location /input_close {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").gen:push_stream("drain", ngx.var.arg_key))
                assert(s:write({ n = 1 }))
                local got = s:read()
                s:close()
                ngx.say(got, " closed")
            }
        }
        location /kill {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local key = ngx.var.arg_key
                local reader = ngx.thread.spawn(function()
                    local s = assert(tp.gen:push_stream_opts({ chunks = 1 }, "forever", key))
                    while not s.done do
                        s:read()
                    end
                end)
                ngx.sleep(0.05)
                ngx.thread.kill(reader)
                ngx.say("killed")
            }
        }
        location /stats {
            content_by_lua_block {
                local s = require("resty.threadpool").gen:stats()
                ngx.print(s.streams, " ", s.stream_chunks_out, " ", s.stream_bytes_out, " ",
                          s.stream_chunks_in, " ", s.stream_bytes_in, " ",
                          tostring(s.stream_send_wait > 0))
            }
        }
        location = /metrics { thread_pool_status; }
        location /idle {
            content_by_lua_block {
                local s = require("resty.threadpool").gen:stats()
                ngx.print(s.busy + s.queued)
            }
        }
    }
"#;

fn start() -> Nginx {
    Nginx::start("", HTTP)
}

/// What a handler recorded under `key`, once it did.
fn seen(n: &Nginx, key: &str) -> String {
    let mut v = String::new();
    let found = eventually(Duration::from_secs(20), || {
        v = n.get(&format!("/seen?k={key}")).text();
        v != "nil"
    });
    assert!(found, "{key}: the handler recorded nothing");
    v
}

/// Every handler of the pool returned: none is left waiting in a send.
fn assert_idle(n: &Nginx) {
    assert!(
        eventually(Duration::from_secs(20), || n.get("/idle").text() == "0"),
        "a handler is still running"
    );
}

#[test]
fn chunks_come_in_order_then_the_results() {
    let n = start();
    let r = n.get("/chunks?what=count&n=2000");
    assert_eq!(r.status, 200);
    let text = r.text();
    let (chunks, rest) = text.trim_end().split_once(' ').expect(&text);
    assert_eq!(rest, "end 2000");
    let chunks: Vec<&str> = chunks.split(',').collect();
    assert_eq!(chunks.len(), 2000);
    for (i, c) in (1..).zip(chunks) {
        let want = match i % 3 {
            1 => format!("c{i}"),
            2 => format!("t{i}x"),
            _ => i.to_string(),
        };
        assert_eq!(c, want, "chunk {i}");
    }
    n.assert_clean_log();
}

#[test]
fn an_error_after_chunks_comes_after_them() {
    let n = start();
    let want: Vec<String> = (1..=40).map(|i| i.to_string()).collect();
    let want = format!("{} nil failed after 40\n", want.join(","));
    assert_eq!(n.get("/chunks?what=fail&n=40").text(), want);
    n.assert_clean_log();
}

/// A handler that sends nothing: its first read gives its results, as
/// push_task would; the stream is then done. Misuse: send outside a
/// stream's handler raises; a value that cannot cross is refused by the
/// send, not the stream; bad options raise.
#[test]
fn a_stream_without_chunks_is_a_task() {
    let n = start();
    assert_eq!(
        n.get("/plain").text(),
        "3 plain true nil stream closed | 3 plain\n"
    );
    let text = n.get("/misuse").text();
    assert!(
        text.starts_with(
            "false no stream: send() and receive() are for a handler run by push_stream \
             | false | nil "
        ),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with(" true") && text.contains("function"),
        "{text}"
    );
    n.assert_clean_log();
}

/// 10,000 chunks of 64 KiB (625 MiB) sent as fast as the handler can to
/// a reader that sleeps: the worker's peak RSS grows by less than the
/// bound docs/streaming.md states (64 MiB: 16 unread chunks, the ones
/// being encoded and read, and the allocator's slack), where without
/// back-pressure it would hold most of the stream.
#[test]
fn a_fast_handler_waits_for_a_slow_reader() {
    let n = start();
    let worker = n.workers()[0];
    // warm up: the pool threads' states and the allocator's arenas
    assert_eq!(
        n.get("/flood?n=100&size=65536").text(),
        "100 6553600 100 nil\n"
    );
    let before = status_kib(worker, "VmHWM:");
    let r = n.get("/flood?n=10000&size=65536");
    assert_eq!(r.text(), "10000 655360000 10000 nil\n");
    let grew = status_kib(worker, "VmHWM:").saturating_sub(before);
    eprintln!("peak RSS grew by {grew} KiB");
    assert!(grew < 64 * 1024, "peak RSS grew by {grew} KiB");
    n.assert_clean_log();
}

/// A reader that closes its stream: the handler, waiting for room in its
/// send, gets "cancelled" and sees cancelled(); the stream reads as
/// closed.
#[test]
fn closing_cancels_the_handler() {
    cancels(
        "/close?key=c1",
        "1 2 nil stream closed\n",
        "c1",
        "cancelled true",
    );
}

/// `path` answers `body`, and the handler it started records `seen` under
/// `key`; then no handler is left running.
fn cancels(path: &str, body: &str, key: &str, want: &str) {
    let n = start();
    assert_eq!(n.get(path).text(), body);
    assert_eq!(seen(&n, key), want);
    assert_idle(&n);
    n.assert_clean_log();
}

/// A read that times out cancels the handler: its next send fails.
#[test]
fn a_read_timeout_cancels_the_handler() {
    cancels(
        "/timeout?key=t1",
        "first nil timeout true\n",
        "t1",
        "nil cancelled true",
    );
}

/// A client that goes away while its request reads a stream: the
/// handler's send fails, and nothing is left running.
#[test]
fn a_client_gone_cancels_the_handler() {
    let n = start();
    let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /abort?key=a1 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("chunk 1") {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "closed early");
        got.extend_from_slice(&buf[..k]);
    }
    drop(s);
    assert_eq!(seen(&n, "a1"), "cancelled true");
    assert_idle(&n);
    n.assert_clean_log();
}

/// Streams whose readers went away in every way leave no handler
/// running and no record behind: a long run of them ends with the pool
/// idle and the worker's memory where it was.
#[test]
fn a_stream_whose_caller_is_gone_leaves_nothing() {
    let n = start();
    for i in 0..200 {
        let path = if i % 2 == 0 { "close" } else { "timeout" };
        let r = request(
            n.port,
            "GET",
            &format!("/{path}?key=g{i}&pause=0.1"),
            &[],
            b"",
        );
        assert_eq!(r.status, 200);
    }
    assert_idle(&n);
    n.assert_clean_log();
}

/// Input: while the handler does not receive, the stream's bound of
/// chunks can be written and the next write fails at once if asked not
/// to wait; a write that waits gets in once the handler makes room; the
/// handler gets every chunk in order, then the end of input, after which
/// writes fail; its chunks and results come back as usual.
#[test]
fn a_fast_writer_waits_for_a_slow_handler() {
    let n = start();
    let count = 500;
    let sum: u64 = (1..=count).sum();
    let text = n.get(&format!("/input?n={count}")).text();
    assert_eq!(
        text,
        format!(
            "true true true true nil:stream input full nil:stream input ended {sum}:{count}:nil {}\n",
            count / 200
        )
    );
    n.assert_clean_log();
}

/// A caller that lets go while its handler waits for input cancels it:
/// the handler's receive returns nil and "cancelled".
#[test]
fn closing_cancels_a_handler_waiting_for_input() {
    cancels(
        "/input_close?key=i1",
        "got closed\n",
        "i1",
        "cancelled true",
    );
}

/// A Rust pool's stream (tests/fixtures/rust_handler): its sends reach the
/// reader in order before its results, it receives what the caller
/// writes, and a caller that closes the stream makes its waiting send
/// fail with "cancelled" while `cancelled()` is true.
#[test]
fn a_rust_handler_streams_both_ways() {
    let lib = &rust_fixture().v1;
    let http = r#"
    thread_pool_process_by_rust rs LIB;
    thread_pool_stream_chunks rs 4;
    server {
        listen 127.0.0.1:$PORT;
        location /out {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").rs:push_stream("stream", 100))
                local got = {}
                while true do
                    local v, n = s:read()
                    if s.done then
                        ngx.say(table.concat(got, ","), " ", v, " ", n)
                        break
                    end
                    got[#got + 1] = v
                end
            }
        }
        location /in {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").rs:push_stream("sum"))
                for i = 1, 100 do
                    assert(s:write(i))
                end
                s:close_write()
                ngx.say(s:read())
            }
        }
        location /close {
            content_by_lua_block {
                local s = assert(require("resty.threadpool").rs:push_stream("forever"))
                local a, b = s:read(), s:read()
                s:close()
                ngx.say(a, " ", b)
            }
        }
    }
    "#
    .replace("LIB", &lib.display().to_string());
    let n = Nginx::start("thread_pool rs threads=2;", &http);
    let want: Vec<String> = (1..=100).map(|i| i.to_string()).collect();
    assert_eq!(
        n.get("/out").text(),
        format!("{} end 100\n", want.join(","))
    );
    assert_eq!(n.get("/in").text(), "5050\n");
    assert_eq!(n.get("/close").text(), "1 2\n");
    assert!(
        eventually(Duration::from_secs(20), || n
            .error_log()
            .contains("stream send failed: cancelled, cancelled true")),
        "{}",
        n.error_log()
    );
    n.assert_clean_log();
}

/// stats() and thread_pool_status count streams, the chunks and bytes
/// each way, and the time handlers' sends waited for their reader (which
/// they did: the reader of /flood sleeps before it reads).
#[test]
fn streams_are_counted() {
    let n = start();
    assert_eq!(n.get("/stats").text(), "0 0 0 0 0 false");
    n.get("/chunks?what=count&n=100");
    n.get("/input?n=10");
    n.get("/flood?n=100&size=1000");
    let text = n.get("/stats").text();
    let v: Vec<&str> = text.split(' ').collect();
    assert_eq!(v[0], "3", "{text}");
    // 100 + 0 (the sum's chunks: 10 < 200) + 100
    assert_eq!(v[1], "200", "{text}");
    assert!(v[2].parse::<u64>().unwrap() > 100 * 1000, "{text}");
    assert_eq!(v[3], "10", "{text}");
    assert!(v[4].parse::<u64>().unwrap() > 0, "{text}");
    assert_eq!(v[5], "true", "{text}");
    let metrics = n.get("/metrics").text();
    for line in [
        "ngx_threadpool_streams_total{pool=\"gen\",worker=\"0\"} 3",
        "ngx_threadpool_stream_chunks_out_total{pool=\"gen\",worker=\"0\"} 200",
        "ngx_threadpool_stream_chunks_in_total{pool=\"gen\",worker=\"0\"} 10",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    assert!(
        metrics.contains(
            "ngx_threadpool_stream_send_wait_seconds_total{pool=\"gen\",worker=\"0\"} 0."
        ) && !metrics.contains(
            "ngx_threadpool_stream_send_wait_seconds_total{pool=\"gen\",worker=\"0\"} 0\n"
        ),
        "{metrics}"
    );
    n.assert_clean_log();
}

/// The pool's queue bound counts a stream as a task: with one thread busy
/// streaming and one stream queued, the next push_stream is refused with
/// "queue full".
#[test]
fn the_queue_bound_covers_streams() {
    let http = r#"
    thread_pool_process_by_lua_block q {
        local tp = require "resty.threadpool"
        return function()
            assert(tp.send("started"))
            return tp.receive()
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        location /full {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local a = assert(tp.q:push_stream())
                local started = a:read()
                local b, berr = tp.q:push_stream()
                local c, cerr = tp.q:push_stream()
                a:close()
                b:close()
                ngx.say(started, " ", tostring(b ~= nil), " ", tostring(berr), " ",
                        tostring(c), " ", cerr)
            }
        }
    }
    "#;
    let n = Nginx::start("thread_pool q threads=1 max_queue=1;", http);
    assert_eq!(n.get("/full").text(), "started true nil nil queue full\n");
    n.assert_clean_log();
}

/// A reader whose light thread is killed: its handler, left waiting for
/// room, is cancelled when the request ends.
#[test]
fn a_killed_reader_cancels_its_handler_when_the_request_ends() {
    cancels("/kill?key=k1", "killed\n", "k1", "cancelled true");
}

/// Every way a stream's caller goes away, and streams that end normally,
/// in one nginx process under valgrind's memcheck (`make valgrind`): no
/// memory error, no definite leak but nginx's own (tests/valgrind.supp).
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn stream_endings_under_valgrind() {
    let mut n = Nginx::start_under_valgrind("", HTTP);
    for i in 0..5 {
        for path in [
            format!("/close?key=vc{i}"),
            format!("/timeout?key=vt{i}&pause=0.3"),
            format!("/input_close?key=vi{i}"),
            format!("/kill?key=vk{i}"),
            "/chunks?what=count&n=50".to_string(),
            "/chunks?what=fail&n=40".to_string(),
            "/input?n=20".to_string(),
        ] {
            assert_eq!(n.get(&path).status, 200, "{path}");
        }
        let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "GET /abort?key=va{i} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("chunk 1") {
            let k = s.read(&mut buf).unwrap();
            assert!(k > 0, "closed early");
            got.extend_from_slice(&buf[..k]);
        }
        drop(s);
        assert_eq!(seen(&n, &format!("va{i}")), "cancelled true");
    }
    for i in 0..5 {
        for (key, want) in [
            ("vc", "cancelled true"),
            ("vt", "nil cancelled true"),
            ("vi", "cancelled true"),
            ("vk", "cancelled true"),
        ] {
            assert_eq!(seen(&n, &format!("{key}{i}")), want);
        }
    }
    assert_idle(&n);
    n.quit_under_valgrind();
    n.assert_clean_log();
}

/// Shadowing (`thread_pool_shadow`) runs a stream again on the shadow
/// pool with the same arguments and the same input, and compares the
/// whole sequence of chunks and the results: alike, it counts a
/// comparison; a chunk that differs counts a mismatch and logs which.
#[test]
fn a_shadow_compares_the_chunks_and_the_result() {
    let handler = |last: &str| {
        format!(
            r#"
        local tp = require "resty.threadpool"
        return function(n, differ)
            local sum = 0
            while true do
                local v = tp.receive()
                if v == nil then
                    break
                end
                sum = sum + v
            end
            for i = 1, n - 1 do
                assert(tp.send(i + sum))
            end
            assert(tp.send({last}))
            return "end"
        end"#
        )
    };
    let http = format!(
        r#"
    lua_thread_pool main threads=1;
    lua_thread_pool alt threads=1;
    thread_pool_shadow main alt sample=1;
    thread_pool_process_by_lua_block main {{ {} }}
    thread_pool_process_by_lua_block alt {{ {} }}
    server {{
        listen 127.0.0.1:$PORT;
        location /run {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local s = assert(tp.main:push_stream(5, ngx.var.arg_differ == "1"))
                assert(s:write(10))
                assert(s:write(20))
                s:close_write()
                local got = {{}}
                while true do
                    local v = s:read()
                    if s.done then
                        ngx.say(table.concat(got, ","), " ", v)
                        break
                    end
                    got[#got + 1] = v
                end
            }}
        }}
        location /stats {{
            content_by_lua_block {{
                local s = require("resty.threadpool").main:stats()
                ngx.print(s.shadow_compared, " ", s.shadow_mismatched)
            }}
        }}
    }}
"#,
        handler("n + sum"),
        handler("differ and 0 or n + sum")
    );
    let n = Nginx::start("", &http);
    assert_eq!(n.get("/run").text(), "31,32,33,34,35 end\n");
    assert!(
        eventually(Duration::from_secs(10), || n.get("/stats").text() == "1 0"),
        "{}",
        n.get("/stats").text()
    );
    assert_eq!(n.get("/run?differ=1").text(), "31,32,33,34,35 end\n");
    assert!(
        eventually(Duration::from_secs(10), || n.get("/stats").text() == "2 1"),
        "{}",
        n.get("/stats").text()
    );
    let log = n.error_log();
    assert!(
        log.contains("\"main\" sent 5 chunks and \"alt\" 5, the first that differs is #5"),
        "{log}"
    );
    n.assert_clean_log();
}
