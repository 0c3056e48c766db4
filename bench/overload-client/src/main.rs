//! The overload workload's client (bench/fairness.py, docs/overload.md):
//! `slots` closed-loop slots, each asking for a thumbnail (`/task`) with
//! probability 0.5, else a static page, one request after the other, each
//! given up after `timeout_ms` from the start of its connect.
//!
//! A thread per slot, blocking sockets: a request costs the client a few
//! system calls and no event loop of its own, so that on a host it shares
//! with nginx its own lateness stays out of what it measures (a Python
//! asyncio client, even on uvloop, lagged 45 to 100 ms at 20x on 2 cores
//! and timed those lags as the server's). The lag thread still reports how
//! late a 10 ms sleep wakes.
//!
//! Usage: overload-client PORT SLOTS SECS TIMEOUT_MS KEEPALIVE(0|1)
//! Prints one JSON object: per class (thumb, static) the latencies in ms
//! by status, timeouts, errors, connect times in ms and the 200s within
//! the run; then the lags in ms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Class {
    lat: BTreeMap<u16, Vec<f64>>,
    timeouts: u64,
    errors: u64,
    connect: Vec<f64>,
    served: u64,
}

#[derive(Default)]
struct Seen {
    thumb: Class,
    static_: Class,
}

struct Run {
    addr: SocketAddr,
    until: Instant,
    timeout: Duration,
    keepalive: bool,
}

/// Why a request got no status.
enum Failed {
    Timeout,
    Error,
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Failed {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Failed::Timeout,
            _ => Failed::Error,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The time left of a request started at `t0`: a timeout once none.
fn left(t0: Instant, timeout: Duration) -> Result<Duration, Failed> {
    match timeout.checked_sub(t0.elapsed()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(Failed::Timeout),
    }
}

/// Reads the answer into `buf`: with keep-alive until its head and
/// Content-Length are in, else until the peer closes (HTTP/1.0); each read
/// within the request's time.
fn read_answer(s: &mut TcpStream, t0: Instant, run: &Run, buf: &mut Vec<u8>) -> Result<(), Failed> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if run.keepalive && answer_len(buf).is_some_and(|n| buf.len() >= n) {
            return Ok(());
        }
        s.set_read_timeout(Some(left(t0, run.timeout)?))?;
        match s.read(&mut chunk)? {
            0 if run.keepalive => return Err(Failed::Error),
            0 => return Ok(()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// With keep-alive: the length of the answer in `buf` once its head is
/// in (head and Content-Length).
fn answer_len(buf: &[u8]) -> Option<usize> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    Some(end + length)
}

fn status(buf: &[u8]) -> Result<u16, Failed> {
    let line = buf.split(|&b| b == b' ').nth(1).ok_or(Failed::Error)?;
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Failed::Error)
}

/// One request, with keep-alive on `conn` (kept, opened if None), else on
/// a new connection whose time to connect goes to `class`: its status.
fn ask(
    run: &Run,
    conn: &mut Option<TcpStream>,
    path: &str,
    class: &mut Class,
    buf: &mut Vec<u8>,
) -> Result<u16, Failed> {
    let t0 = Instant::now();
    let connect = || -> Result<TcpStream, Failed> {
        Ok(TcpStream::connect_timeout(
            &run.addr,
            left(t0, run.timeout)?,
        )?)
    };
    // the new connection, closed on return
    let mut fresh = None;
    let s = if run.keepalive {
        if conn.is_none() {
            *conn = Some(connect()?);
        }
        conn.as_mut().expect("opened above")
    } else {
        let s = fresh.insert(connect()?);
        class.connect.push(ms(t0.elapsed()));
        s
    };
    let version = if run.keepalive { "1.1" } else { "1.0" };
    s.set_write_timeout(Some(left(t0, run.timeout)?))?;
    s.write_all(format!("GET {path} HTTP/{version}\r\nHost: x\r\n\r\n").as_bytes())?;
    read_answer(s, t0, run, buf)?;
    status(buf)
}

/// xorshift64: the slot's own sequence of classes, the same each run.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn slot(run: &Run, seed: u64) -> Seen {
    let mut seen = Seen::default();
    let mut conn = None;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = Vec::with_capacity(4096);
    while Instant::now() < run.until {
        let thumb = next(&mut rng) & 1 == 0;
        let (class, path) = if thumb {
            (&mut seen.thumb, "/task")
        } else {
            (&mut seen.static_, "/static")
        };
        let t0 = Instant::now();
        match ask(run, &mut conn, path, class, &mut buf) {
            Ok(status) => {
                let done = Instant::now();
                class.lat.entry(status).or_default().push(ms(done - t0));
                // answers after the run's end would count above capacity
                if status == 200 && done <= run.until {
                    class.served += 1;
                }
            }
            Err(failed) => {
                match failed {
                    Failed::Timeout => class.timeouts += 1,
                    Failed::Error => class.errors += 1,
                }
                conn = None;
            }
        }
    }
    seen
}

fn merge(into: &mut Class, from: Class) {
    for (status, lat) in from.lat {
        into.lat.entry(status).or_default().extend(lat);
    }
    into.timeouts += from.timeouts;
    into.errors += from.errors;
    into.connect.extend(from.connect);
    into.served += from.served;
}

fn list(out: &mut String, xs: &[f64]) {
    out.push('[');
    for (i, x) in xs.iter().enumerate() {
        let _ = write!(out, "{}{x:.3}", if i > 0 { "," } else { "" });
    }
    out.push(']');
}

fn class_json(out: &mut String, c: &Class) {
    out.push_str("{\"lat\":{");
    for (i, (status, lat)) in c.lat.iter().enumerate() {
        let _ = write!(out, "{}\"{status}\":", if i > 0 { "," } else { "" });
        list(out, lat);
    }
    let _ = write!(
        out,
        "}},\"timeouts\":{},\"errors\":{},\"served\":{},\"connect\":",
        c.timeouts, c.errors, c.served
    );
    list(out, &c.connect);
    out.push('}');
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| -> u64 {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: overload-client PORT SLOTS SECS TIMEOUT_MS KEEPALIVE(0|1)");
            std::process::exit(2)
        })
    };
    let (port, slots, secs, timeout_ms, keepalive) = (arg(0), arg(1), arg(2), arg(3), arg(4));
    let run = Run {
        addr: SocketAddr::from(([127, 0, 0, 1], port as u16)),
        until: Instant::now() + Duration::from_secs(secs),
        timeout: Duration::from_millis(timeout_ms),
        keepalive: keepalive != 0,
    };
    let (seen, lags) = thread::scope(|s| {
        let workers: Vec<_> = (0..slots)
            .map(|i| {
                thread::Builder::new()
                    .stack_size(128 << 10)
                    .spawn_scoped(s, {
                        let run = &run;
                        move || slot(run, i + 1)
                    })
                    .expect("a thread per slot")
            })
            .collect();
        let mut lags = Vec::new();
        while Instant::now() < run.until {
            let t0 = Instant::now();
            thread::sleep(Duration::from_millis(10));
            lags.push(ms(t0.elapsed()) - 10.0);
        }
        let mut seen = Seen::default();
        for w in workers {
            let one = w.join().expect("a slot's thread");
            merge(&mut seen.thumb, one.thumb);
            merge(&mut seen.static_, one.static_);
        }
        (seen, lags)
    });
    let mut out = String::from("{\"thumb\":");
    class_json(&mut out, &seen.thumb);
    out.push_str(",\"static\":");
    class_json(&mut out, &seen.static_);
    out.push_str(",\"lags\":");
    list(&mut out, &lags);
    out.push('}');
    println!("{out}");
}
