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
//! Keep-alive storms (SHARES, e.g. 40,30,20,10): before the run each slot
//! opens its connection and asks `/whoami` (the worker's pid); it keeps
//! the connection only while the worker's share of the slots is not full
//! (the first worker seen gets the first share, and so on), else closes
//! it and connects again. Every slot then starts at once, on connections
//! spread over the workers as the shares say, which no accept policy can
//! change any more: a storm on connections opened earlier, under another
//! load.
//!
//! Usage: overload-client PORT SLOTS SECS TIMEOUT_MS KEEPALIVE(0|1) [SHARES]
//! Prints one JSON object: per class (thumb, static) the latencies in ms
//! by status, timeouts, errors, connect times in ms and the 200s within
//! the run; the lags in ms; with SHARES, the connections each worker held
//! at the start (`spread`, in the order of the shares).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Barrier, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Class {
    lat: BTreeMap<u16, Vec<f64>>,
    timeouts: u64,
    errors: u64,
    connect: Vec<f64>,
    served: u64,
    /// When each timed-out request started, in ms from the run's start:
    /// whether timeouts come together (the host stalled) or spread out.
    timed_out_at: Vec<f64>,
}

#[derive(Default)]
struct Seen {
    thumb: Class,
    static_: Class,
}

struct Run {
    addr: SocketAddr,
    /// Set once every slot holds its connection.
    until: OnceLock<Instant>,
    timeout: Duration,
    keepalive: bool,
    secs: u64,
    /// Keep-alive storms: slots per worker, in the order workers are first
    /// seen, and the (pid, connections) taken so far.
    quotas: Vec<u64>,
    taken: Mutex<Vec<(u64, u64)>>,
    /// Every slot and the main thread: connections opened, then the start.
    opened: Barrier,
    started: Barrier,
}

impl Run {
    fn until(&self) -> Instant {
        *self.until.get().expect("set before the slots start")
    }
}

/// A connection on a worker whose share is not full yet (or, after many
/// tries, on any): the prelude of a keep-alive storm.
fn open_spread(run: &Run, buf: &mut Vec<u8>) -> Option<TcpStream> {
    let mut last = None;
    for _ in 0..1000 {
        let Ok(mut s) = TcpStream::connect(run.addr) else {
            continue;
        };
        let t0 = Instant::now();
        let asked = s
            .write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\n\r\n")
            .map_err(Failed::from)
            .and_then(|()| read_answer(&mut s, t0, run, buf, Duration::from_secs(5)));
        let Some(pid) = asked.ok().and_then(|()| body_number(buf)) else {
            continue;
        };
        let mut taken = run.taken.lock().expect("no slot panics");
        let i = match taken.iter().position(|&(p, _)| p == pid) {
            Some(i) => i,
            None => {
                taken.push((pid, 0));
                taken.len() - 1
            }
        };
        if taken[i].1 < run.quotas.get(i).copied().unwrap_or(0) {
            taken[i].1 += 1;
            return Some(s);
        }
        last = Some((s, i));
    }
    let (s, i) = last?;
    run.taken.lock().expect("no slot panics")[i].1 += 1;
    Some(s)
}

/// The number an answer's body holds.
fn body_number(buf: &[u8]) -> Option<u64> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    std::str::from_utf8(&buf[end..]).ok()?.trim().parse().ok()
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
fn read_answer(
    s: &mut TcpStream,
    t0: Instant,
    run: &Run,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> Result<(), Failed> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if run.keepalive && answer_len(buf).is_some_and(|n| buf.len() >= n) {
            return Ok(());
        }
        s.set_read_timeout(Some(left(t0, timeout)?))?;
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
    read_answer(s, t0, run, buf, run.timeout)?;
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
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = Vec::with_capacity(4096);
    let mut conn = if run.quotas.is_empty() {
        None
    } else {
        open_spread(run, &mut buf)
    };
    run.opened.wait();
    run.started.wait();
    let until = run.until();
    while Instant::now() < until {
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
                if status == 200 && done <= until {
                    class.served += 1;
                }
            }
            Err(failed) => {
                match failed {
                    Failed::Timeout => {
                        class.timeouts += 1;
                        let start = until - Duration::from_secs(run.secs);
                        class
                            .timed_out_at
                            .push(ms(t0.saturating_duration_since(start)));
                    }
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
    into.timed_out_at.extend(from.timed_out_at);
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
    out.push_str(",\"timed_out_at\":");
    list(out, &c.timed_out_at);
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
    let shares: Vec<u64> = args
        .get(5)
        .map(|a| a.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    // slots per share, the remainder to the first ones
    let sum = shares.iter().sum::<u64>().max(1);
    let mut quotas: Vec<u64> = shares.iter().map(|s| slots * s / sum).collect();
    let mut rest = slots.saturating_sub(quotas.iter().sum());
    for q in quotas.iter_mut() {
        if rest == 0 {
            break;
        }
        *q += 1;
        rest -= 1;
    }
    let run = Run {
        addr: SocketAddr::from(([127, 0, 0, 1], port as u16)),
        until: OnceLock::new(),
        timeout: Duration::from_millis(timeout_ms),
        keepalive: keepalive != 0,
        secs,
        quotas,
        taken: Mutex::new(Vec::new()),
        opened: Barrier::new(slots as usize + 1),
        started: Barrier::new(slots as usize + 1),
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
        run.opened.wait();
        let until = Instant::now() + Duration::from_secs(secs);
        run.until.set(until).expect("set once");
        run.started.wait();
        let mut lags = Vec::new();
        while Instant::now() < until {
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
    let spread = run.taken.lock().expect("the slots are done");
    out.push_str(",\"spread\":[");
    for (i, (_, n)) in spread.iter().enumerate() {
        let _ = write!(out, "{}{n}", if i > 0 { "," } else { "" });
    }
    out.push_str("]}");
    println!("{out}");
}
