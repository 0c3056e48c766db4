//! Streams (`push_stream`): a handler's chunks reach the reader in order
//! and before its results, an error after some chunks comes after them, a
//! producer faster than its reader waits instead of piling chunks up in
//! the worker's memory, and a reader that gives up (timeout, close, client
//! gone) cancels the handler: its next or waiting send fails at once with
//! "cancelled" and `cancelled()` is true. Input the other way: the
//! caller's writes reach the handler's receive() in order, then the end of
//! input, and a caller faster than its handler is held back by the same
//! bound.
//!
//! Each scenario runs in a Lua pool (`gen`, its handlers below) and in a
//! Rust pool (`rgen`, the same handlers in tests/fixtures/rust_handler,
//! through the handler crate's send, receive and cancelled and the C
//! ABI): `scenario::lua` and `scenario::rust`, one function, the same
//! assertions; the shadow comparison with each kind as POOL and as
//! SHADOW; the valgrind run with both. What a handler saw it logs ("seen
//! KEY [...]"), read back from error.log.

mod common;

use common::handlers::rust_fixture;
use common::{eventually, request, status_kib, Case, Nginx};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The pools the scenarios run in: a Lua pool and a Rust one.
const LUA: &str = "gen";
const RUST: &str = "rgen";

/// Makes each scenario, a function of the pool it runs in, two tests:
/// `scenario::lua` and `scenario::rust`.
macro_rules! in_both_pools {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[test]
            fn lua() {
                super::$scenario(super::LUA)
            }
            #[test]
            fn rust() {
                super::$scenario(super::RUST)
            }
        }
    )*};
}

in_both_pools!(
    chunks_come_in_order_then_the_results,
    an_error_after_chunks_comes_after_them,
    a_stream_without_chunks_is_a_task,
    a_fast_handler_waits_for_a_slow_reader,
    closing_cancels_the_handler,
    a_read_timeout_cancels_the_handler,
    a_client_gone_cancels_the_handler,
    a_stream_whose_caller_is_gone_leaves_nothing,
    a_fast_writer_waits_for_a_slow_handler,
    closing_cancels_a_handler_waiting_for_input,
    streams_are_counted,
    the_queue_bound_covers_streams,
    a_killed_reader_cancels_its_handler_when_the_request_ends,
);

/// `gen`'s handlers; `rgen`'s, the Rust fixture's ops of the same names,
/// do the same (its module doc).
const HTTP: &str = r#"
    lua_thread_pool gen threads=2;
    lua_thread_pool rgen threads=2;
    thread_pool_process_by_rust rgen LIB;
    thread_pool_process_by_lua_block gen {
        local ffi = require "ffi"
        local tp = require "resty.threadpool"
        ffi.cdef "int stream_test_usleep(unsigned int usec) asm(\"usleep\");"
        -- what the handler saw, under key, for the test to find in error.log
        local function seen(key, what)
            ngx.log(ngx.INFO, "seen ", key, " [", what, " ", tostring(tp.cancelled()), "]")
        end
        local handlers = {}
        -- chunks 1..n of mixed kinds, then two results
        function handlers.mixed(n)
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
        -- sends until a send fails, then notes why
        function handlers.forever(key)
            local i = 0
            while true do
                i = i + 1
                local ok, err = tp.send(i)
                if not ok then
                    seen(key, err)
                    return
                end
            end
        end
        -- Pauses sleep rather than spin: valgrind runs one thread at a
        -- time, and a spinning one can hold off the event loop's timers.
        -- One chunk, then after pause seconds (the reader's timeout
        -- passes meanwhile) one more send, whose outcome it notes.
        function handlers.pause(key, pause)
            assert(tp.send("first"))
            ffi.C.stream_test_usleep(pause * 1e6)
            local ok, err = tp.send("second")
            seen(key, tostring(ok) .. " " .. tostring(err))
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
            ffi.C.stream_test_usleep(pause * 1e6)
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
        -- receives until the caller lets go, noting why; tells the
        -- caller it got the first chunk
        function handlers.drain(key)
            local first = true
            while true do
                local chunk, err = tp.receive()
                if first then
                    first = false
                    assert(tp.send("got"))
                end
                if chunk == nil then
                    seen(key, tostring(err))
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
        location /chunks {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream(ngx.var.arg_what, tonumber(ngx.var.arg_n)))
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
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream("plain", 1, 2))
                local a, b = s:read()
                local done = s.done
                local again, err = s:read()
                ngx.say(a, " ", b, " ", tostring(done), " ", tostring(again), " ", err,
                        " | ", table.concat({ pool:push_task("plain", 1, 2) }, " "))
            }
        }
        location /misuse {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local ok, err = pool:push_task("misuse", 1)
                local bad = {}
                for _, chunks in ipairs({ 0.5, 0, -1, 65537 }) do
                    local ok = pcall(pool.push_stream_opts, pool, { chunks = chunks }, "plain", 1, 2)
                    bad[#bad + 1] = tostring(ok)
                end
                bad = table.concat(bad, ",")
                local s = assert(pool:push_stream("badchunk"))
                local _, werr = pcall(s.write, s, nil)
                local v, serr = s:read()
                ngx.say(tostring(ok), " ", err, " | ", bad, " | ",
                        tostring(v), " ", serr, " ", tostring(s.done), " | ", werr)
            }
        }
        location /flood {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local n, size = tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_size)
                local s = assert(pool:push_stream_opts({ chunks = 16 }, "flood", n, size))
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
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream_opts({ chunks = 1 }, "forever", ngx.var.arg_key))
                local a, b = s:read(), s:read()
                s:close()
                local after, err = s:read()
                ngx.say(a, " ", b, " ", tostring(after), " ", err)
            }
        }
        location /timeout {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream("pause", ngx.var.arg_key,
                    tonumber(ngx.var.arg_pause) or 0.5))
                local first = s:read()
                local v, err = s:read(0.05)
                ngx.say(first, " ", tostring(v), " ", err, " ", tostring(s.done))
            }
        }
        location /abort {
            lua_check_client_abort on;
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream_opts({ chunks = 1 }, "forever", ngx.var.arg_key))
                ngx.say("chunk ", s:read())
                ngx.flush(true)
                ngx.sleep(30)
            }
        }
        location /input {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream_opts({ chunks = 4 }, "sum", 0.3))
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
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local s = assert(pool:push_stream("drain", ngx.var.arg_key))
                assert(s:write({ n = 1 }))
                local got = s:read()
                s:close()
                ngx.say(got, " closed")
            }
        }
        location /kill {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local key = ngx.var.arg_key
                local reader = ngx.thread.spawn(function()
                    local s = assert(pool:push_stream_opts({ chunks = 1 }, "forever", key))
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
                local s = require("resty.threadpool")[ngx.var.arg_pool]:stats()
                ngx.print(s.streams, " ", s.stream_chunks_out, " ", s.stream_bytes_out, " ",
                          s.stream_chunks_in, " ", s.stream_bytes_in, " ",
                          tostring(s.stream_send_wait > 0))
            }
        }
        location = /metrics { thread_pool_status; }
        location /idle {
            content_by_lua_block {
                local s = require("resty.threadpool")[ngx.var.arg_pool]:stats()
                ngx.print(s.busy + s.queued)
            }
        }
    }
"#;

/// `http` with the Rust fixture's path for LIB.
fn with_fixture(http: &str) -> String {
    http.replace("LIB", &rust_fixture().v1.display().to_string())
}

fn start() -> Nginx {
    Case::new("").http(&with_fixture(HTTP)).start()
}

/// What a handler, of either pool, noted under `key` (its "seen KEY
/// [...]" line), once it did.
fn seen(n: &Nginx, key: &str) -> String {
    let start = format!("seen {key} [");
    let mut v = None;
    let found = eventually(Duration::from_secs(60), || {
        let log = n.error_log();
        v = log
            .split_once(&start)
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(what, _)| what.to_string());
        v.is_some()
    });
    assert!(found, "{key}: the handler noted nothing");
    v.unwrap_or_default()
}

/// Every handler of `pool` returned: none is left waiting in a send.
fn assert_idle(n: &Nginx, pool: &str) {
    assert!(
        eventually(Duration::from_secs(20), || n
            .get(&format!("/idle?pool={pool}"))
            .text()
            == "0"),
        "a handler of {pool} is still running"
    );
}

fn chunks_come_in_order_then_the_results(pool: &str) {
    let n = start();
    let r = n.get(&format!("/chunks?pool={pool}&what=mixed&n=2000"));
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

fn an_error_after_chunks_comes_after_them(pool: &str) {
    let n = start();
    let want: Vec<String> = (1..=40).map(|i| i.to_string()).collect();
    let want = format!("{} nil failed after 40\n", want.join(","));
    let path = format!("/chunks?pool={pool}&what=fail&n=40");
    assert_eq!(n.get(&path).text(), want);
    n.assert_clean_log();
}

/// A handler that sends nothing: its first read gives its results, as
/// push_task would; the stream is then done. Misuse: send outside a
/// stream's handler fails; a value that cannot cross is refused by the
/// send, not the stream; bad options raise (`chunks` 0 too, which the
/// C function takes for the pool's bound).
fn a_stream_without_chunks_is_a_task(pool: &str) {
    let n = start();
    assert_eq!(
        n.get(&format!("/plain?pool={pool}")).text(),
        "3 plain true nil stream closed | 3 plain\n"
    );
    // One text for a send outside a stream (Lua's raises it, the handler
    // crate's StreamError::NoStream displays it); each kind has its own
    // value that cannot cross: a function in Lua, which Rust has not;
    // there a table nested too deep.
    let no_stream = "no stream: send and receive are for a handler run by push_stream";
    let bad_value = if pool == LUA {
        "function"
    } else {
        "nested deeper than"
    };
    let text = n.get(&format!("/misuse?pool={pool}")).text();
    assert!(
        text.starts_with(&format!(
            "false {no_stream} | false,false,false,false | nil "
        )),
        "{text}"
    );
    let (text, write_nil) = text.trim_end().rsplit_once(" | ").unwrap();
    assert!(
        text.ends_with(" true") && text.contains(bad_value),
        "{text}"
    );
    // the user's chunk is write's argument #1, as Lua numbers them
    assert!(
        write_nil.ends_with("bad argument #1 to 'write' (a chunk expected, got nil)"),
        "{write_nil}"
    );
    n.assert_clean_log();
}

/// 10,000 chunks of 64 KiB (625 MiB) sent as fast as the handler can to
/// a reader that sleeps: the worker's peak RSS grows by less than the
/// bound docs/streaming.md states (64 MiB: 16 unread chunks, the ones
/// being encoded and read, and the allocator's slack), where without
/// back-pressure it would hold most of the stream.
fn a_fast_handler_waits_for_a_slow_reader(pool: &str) {
    let n = start();
    let worker = n.workers()[0];
    // warm up: the pool threads' states and the allocator's arenas
    assert_eq!(
        n.get(&format!("/flood?pool={pool}&n=100&size=65536"))
            .text(),
        "100 6553600 100 nil\n"
    );
    let before = status_kib(worker, "VmHWM:");
    let r = n.get(&format!("/flood?pool={pool}&n=10000&size=65536"));
    assert_eq!(r.text(), "10000 655360000 10000 nil\n");
    let grew = status_kib(worker, "VmHWM:").saturating_sub(before);
    eprintln!("peak RSS grew by {grew} KiB");
    assert!(grew < 64 * 1024, "peak RSS grew by {grew} KiB");
    n.assert_clean_log();
}

/// A reader that closes its stream: the handler, waiting for room in its
/// send, gets "cancelled" and sees cancelled(); the stream reads as
/// closed.
fn closing_cancels_the_handler(pool: &str) {
    cancels(
        pool,
        "/close?key=c1",
        "1 2 nil stream closed\n",
        "c1",
        "cancelled true",
    );
}

/// `path` of `pool` answers `body`, and the handler it started notes
/// `want` under `key`; then no handler is left running.
fn cancels(pool: &str, path: &str, body: &str, key: &str, want: &str) {
    let n = start();
    assert_eq!(n.get(&format!("{path}&pool={pool}")).text(), body);
    assert_eq!(seen(&n, key), want);
    assert_idle(&n, pool);
    n.assert_clean_log();
}

/// A read that times out cancels the handler: its next send fails.
fn a_read_timeout_cancels_the_handler(pool: &str) {
    cancels(
        pool,
        "/timeout?key=t1",
        "first nil timeout true\n",
        "t1",
        "nil cancelled true",
    );
}

/// Requests /abort for `key` on `pool` and goes away once the first
/// chunk came.
fn abort(n: &Nginx, pool: &str, key: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", n.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET /abort?pool={pool}&key={key} HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("chunk 1") {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "closed early");
        got.extend_from_slice(&buf[..k]);
    }
}

/// A client that goes away while its request reads a stream: the
/// handler's send fails, and nothing is left running.
fn a_client_gone_cancels_the_handler(pool: &str) {
    let n = start();
    abort(&n, pool, "a1");
    assert_eq!(seen(&n, "a1"), "cancelled true");
    assert_idle(&n, pool);
    n.assert_clean_log();
}

/// Streams whose readers went away in every way leave no handler
/// running and no record behind: a long run of them ends with the pool
/// idle and the worker's memory where it was.
fn a_stream_whose_caller_is_gone_leaves_nothing(pool: &str) {
    let n = start();
    for i in 0..200 {
        let path = if i % 2 == 0 { "close" } else { "timeout" };
        let r = request(
            n.port,
            "GET",
            &format!("/{path}?pool={pool}&key=g{i}&pause=0.1"),
            &[],
            b"",
        );
        assert_eq!(r.status, 200);
    }
    assert_idle(&n, pool);
    n.assert_clean_log();
}

/// Input: while the handler does not receive, the stream's bound of
/// chunks can be written and the next write fails at once if asked not
/// to wait; a write that waits gets in once the handler makes room; the
/// handler gets every chunk in order, then the end of input, after which
/// writes fail; its chunks and results come back as usual.
fn a_fast_writer_waits_for_a_slow_handler(pool: &str) {
    let n = start();
    let count = 500;
    let sum: u64 = (1..=count).sum();
    let text = n.get(&format!("/input?pool={pool}&n={count}")).text();
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
fn closing_cancels_a_handler_waiting_for_input(pool: &str) {
    cancels(
        pool,
        "/input_close?key=i1",
        "got closed\n",
        "i1",
        "cancelled true",
    );
}

/// stats() and thread_pool_status count streams, the chunks and bytes
/// each way, and the time handlers' sends waited for their reader (which
/// they did: the reader of /flood sleeps before it reads).
fn streams_are_counted(pool: &str) {
    let n = start();
    let stats = format!("/stats?pool={pool}");
    assert_eq!(n.get(&stats).text(), "0 0 0 0 0 false");
    n.get(&format!("/chunks?pool={pool}&what=mixed&n=100"));
    n.get(&format!("/input?pool={pool}&n=10"));
    n.get(&format!("/flood?pool={pool}&n=100&size=1000"));
    let text = n.get(&stats).text();
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
        format!("ngx_threadpool_streams_total{{pool=\"{pool}\",worker=\"0\"}} 3"),
        format!("ngx_threadpool_stream_chunks_out_total{{pool=\"{pool}\",worker=\"0\"}} 200"),
        format!("ngx_threadpool_stream_chunks_in_total{{pool=\"{pool}\",worker=\"0\"}} 10"),
    ] {
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    // some time, however long the machine's load made it
    let wait =
        format!("ngx_threadpool_stream_send_wait_seconds_total{{pool=\"{pool}\",worker=\"0\"}} ");
    let waited = metrics
        .lines()
        .find_map(|l| l.strip_prefix(wait.as_str()))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(waited.is_some_and(|s| s > 0.0), "{metrics}");
    n.assert_clean_log();
}

/// The pool's queue bound counts a stream as a task: with one thread busy
/// streaming and one stream queued, the next push_stream is refused with
/// "queue full".
fn the_queue_bound_covers_streams(pool: &str) {
    let http = r#"
    lua_thread_pool gen threads=1 max_queue=1;
    lua_thread_pool rgen threads=1 max_queue=1;
    thread_pool_process_by_rust rgen LIB;
    thread_pool_process_by_lua_block gen {
        local tp = require "resty.threadpool"
        -- the fixture's "hold"
        return function()
            assert(tp.send("started"))
            return tp.receive()
        end
    }
    server {
        listen 127.0.0.1:$PORT;
        location /full {
            content_by_lua_block {
                local pool = require("resty.threadpool")[ngx.var.arg_pool]
                local a = assert(pool:push_stream("hold"))
                local started = a:read()
                local b, berr = pool:push_stream("hold")
                local c, cerr = pool:push_stream("hold")
                a:close()
                b:close()
                ngx.say(started, " ", tostring(b ~= nil), " ", tostring(berr), " ",
                        tostring(c), " ", cerr)
            }
        }
    }
    "#;
    let n = Case::new("").http(&with_fixture(http)).start();
    assert_eq!(
        n.get(&format!("/full?pool={pool}")).text(),
        "started true nil nil queue full\n"
    );
    n.assert_clean_log();
}

/// A reader whose light thread is killed: its handler, left waiting for
/// room, is cancelled when the request ends.
fn a_killed_reader_cancels_its_handler_when_the_request_ends(pool: &str) {
    cancels(pool, "/kill?key=k1", "killed\n", "k1", "cancelled true");
}

/// Every way a stream's caller goes away, and streams that end normally,
/// in both pools of one nginx process under valgrind's memcheck (`make
/// valgrind`): no memory error, no definite leak but nginx's own
/// (tests/valgrind.supp).
#[test]
#[ignore = "needs valgrind; run with `make valgrind`"]
fn stream_endings_under_valgrind() {
    let mut n = Case::new("")
        .http(&with_fixture(HTTP))
        .under_valgrind()
        .start();
    for i in 0..5 {
        for pool in [LUA, RUST] {
            for path in [
                format!("/close?key={pool}-vc{i}"),
                format!("/timeout?key={pool}-vt{i}&pause=0.3"),
                format!("/input_close?key={pool}-vi{i}"),
                format!("/kill?key={pool}-vk{i}"),
                "/chunks?what=mixed&n=50".to_string(),
                "/chunks?what=fail&n=40".to_string(),
                "/input?n=20".to_string(),
            ] {
                let path = format!("{path}&pool={pool}");
                assert_eq!(n.get(&path).status, 200, "{path}");
            }
            let key = format!("{pool}-va{i}");
            abort(&n, pool, &key);
            assert_eq!(seen(&n, &key), "cancelled true");
        }
    }
    for i in 0..5 {
        for pool in [LUA, RUST] {
            for (key, want) in [
                ("vc", "cancelled true"),
                ("vt", "nil cancelled true"),
                ("vi", "cancelled true"),
                ("vk", "cancelled true"),
            ] {
                assert_eq!(seen(&n, &format!("{pool}-{key}{i}")), want);
            }
        }
    }
    assert_idle(&n, LUA);
    assert_idle(&n, RUST);
    n.quit_under_valgrind();
    n.assert_clean_log();
}

/// Shadowing (`thread_pool_shadow`) runs a stream again on the shadow
/// pool with the same arguments and the same input, and compares the
/// whole sequence of chunks and the results: alike, it counts a
/// comparison; a chunk that differs counts a mismatch and logs which.
/// `main` and `alt` are each a Lua or a Rust pool (the fixture's
/// "shadowed", whose last chunk differs when asked on CONFIG "alt").
fn a_shadow_compares_the_chunks_and_the_result(main: &str, alt: &str) {
    let handler = |pool: &str, kind: &str, last: &str| {
        if kind == RUST {
            let config = if pool == "alt" { " alt" } else { "" };
            return format!("thread_pool_process_by_rust {pool} LIB{config};");
        }
        format!(
            r#"thread_pool_process_by_lua_block {pool} {{
        local tp = require "resty.threadpool"
        return function(_, n, differ)
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
        end
    }}"#
        )
    };
    let http = format!(
        r#"
    lua_thread_pool main threads=1;
    lua_thread_pool alt threads=1;
    thread_pool_shadow main alt sample=1;
    {}
    {}
    server {{
        listen 127.0.0.1:$PORT;
        location /run {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local s = assert(tp.main:push_stream("shadowed", 5, ngx.var.arg_differ == "1"))
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
        handler("main", main, "n + sum"),
        handler("alt", alt, "differ and 0 or n + sum")
    );
    let n = Case::new("").http(&with_fixture(&http)).start();
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
    // the mismatch is counted before its line is written
    let line = "\"main\" sent 5 chunks and \"alt\" 5, the first that differs is #5";
    assert!(
        eventually(Duration::from_secs(10), || n.error_log().contains(line)),
        "{}",
        n.error_log()
    );
    n.assert_clean_log();
}

/// The shadow comparison with each kind of pool as POOL and as SHADOW.
mod a_shadow_compares_the_chunks_and_the_result {
    use super::{a_shadow_compares_the_chunks_and_the_result as shadow, LUA, RUST};

    #[test]
    fn lua() {
        shadow(LUA, LUA)
    }
    #[test]
    fn rust() {
        shadow(RUST, RUST)
    }
    #[test]
    fn lua_shadowed_by_rust() {
        shadow(LUA, RUST)
    }
    #[test]
    fn rust_shadowed_by_lua() {
        shadow(RUST, LUA)
    }
}
