//! The codec against generated inputs (`make fuzz`; a short run is part of
//! `make test`). Each seed makes one input, of one of four kinds:
//!
//! * 40 %: Lua values from tests/fixtures/propgen.lua (the generator of
//!   tests/property.rs), encoded (copying strings, or borrowing those from
//!   a random size up) and decoded back in the same LuaJIT state: the
//!   values must be equal (NaN equals NaN, -0 differs from 0), their count
//!   included; a failing value is shrunk to the smallest that still fails;
//! * 30 %: a valid payload (of other generated values) with one to four
//!   mutations: bit flips, bytes set to markers, truncations, insertions,
//!   deletions, duplicated ranges, counts and lengths rewritten, splices;
//! * 20 %: MessagePack streams built to be almost right: wrong counts and
//!   positions, every marker, float bit patterns, ext types and borrowed
//!   string indexes, nesting bombs, huge counts with nothing after them;
//! * 10 %: random bytes.
//!
//! The decoder must answer every input: values, or an error whose text
//! starts with `bad payload: `; never a panic, abort, crash or hang. Values
//! it accepts must encode again and decode to equal values.
//!
//! The seeds are cut into slices, each checked by a child process (this
//! test binary running `fuzz_slice`), `FUZZ_JOBS` at a time: a crash ends
//! one child, and the seeds of its slice are bisected down to the one that
//! crashes, whose input is then printed. A child stops on an input that
//! runs longer than `FUZZ_HANG_SECS` and names it.
//!
//! Environment: `FUZZ_INPUTS` (default 150,000, ~15 s on 2 cores),
//! `FUZZ_SEED` (the first seed, default 0), `FUZZ_JOBS` (default: the
//! CPUs), `FUZZ_HANG_SECS` (default 10). `FUZZ_SEED=S FUZZ_INPUTS=1`
//! replays seed S and prints its input.

mod codec;
mod inputs;

use codec::Payload;
use inputs::Rng;
use mlua::{Function, Lua, MultiValue, Table, Value};
use std::collections::VecDeque;
use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Marks the lines a child reports on.
const PREFIX: &str = "fuzz| ";
const SHRINK_TRIES: usize = 2000;
/// Failures a child prints in full (it counts them all).
const MAX_PRINTED: u64 = 10;
/// propgen.args options: smaller values than through nginx, so that the
/// round trips are many.
const GEN_OPTS: &str = "return { budget = 20, long = 0.002, many = 0.002 }";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

// Counting ------------------------------------------------------------------

const COUNTS: [&str; 8] = [
    "inputs",
    "roundtrip",
    "mutated",
    "structured",
    "random",
    "accepted",
    "rejected",
    "failures",
];
const INPUTS: usize = 0;
const ACCEPTED: usize = 5;
const REJECTED: usize = 6;
const FAILURES: usize = 7;

#[derive(Clone, Copy, Default)]
struct Counts([u64; COUNTS.len()]);

impl Counts {
    fn add(&mut self, other: &Counts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    fn line(&self) -> String {
        let fields: Vec<String> = COUNTS
            .iter()
            .zip(self.0)
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
        fields.join(" ")
    }

    fn parse(line: &str) -> Option<Counts> {
        let mut c = Counts::default();
        for (slot, field) in c.0.iter_mut().zip(line.split_whitespace()) {
            *slot = field.split_once('=')?.1.parse().ok()?;
        }
        Some(c)
    }
}

/// What a seed's input is, and its counter.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    RoundTrip = 1,
    Mutated,
    Structured,
    Random,
}

fn kind_of(seed: u64) -> Kind {
    match Rng::new(seed).below(10) {
        0..=3 => Kind::RoundTrip,
        4..=6 => Kind::Mutated,
        7 | 8 => Kind::Structured,
        _ => Kind::Random,
    }
}

fn hex(bytes: &[u8]) -> String {
    const MAX: usize = 2048;
    let mut s: String = bytes.iter().take(MAX).map(|b| format!("{b:02x}")).collect();
    if bytes.len() > MAX {
        s.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    s
}

// One child's inputs -----------------------------------------------------------

/// A Lua state with propgen, and the inputs' checks.
struct Fuzzer {
    lua: Lua,
    args: Function,
    same: Function,
    show: Function,
    shrink: Function,
    opts: Table,
    /// Three strings that borrowed-string indexes 0..2 of random inputs
    /// find.
    donor: Payload,
    /// The valid payload that mutations start from, by its seed.
    base: Option<(u64, Payload)>,
}

/// Round trip of one argument list: Ok(Ok) when equal, Ok(Err(why)) when not.
type Check = mlua::Result<Result<(), String>>;

impl Fuzzer {
    fn new() -> mlua::Result<Fuzzer> {
        // SAFETY: unsafe_new only adds the ffi library, which propgen uses
        // as pool-thread code does; the state stays on this thread.
        let lua = unsafe { Lua::unsafe_new() };
        let gen: Table = lua
            .load(include_str!("../fixtures/propgen.lua"))
            .set_name("propgen")
            .call(())?;
        let opts = lua.load(GEN_OPTS).eval()?;
        let donor = lua
            .load(r#"return "donor 0", "donor 1", "\0donor 2""#)
            .eval()?;
        Ok(Fuzzer {
            args: gen.get("args")?,
            same: gen.get("same")?,
            show: gen.get("show")?,
            shrink: gen.get("shrink")?,
            opts,
            donor: codec::encode(&donor, Some(1)).map_err(mlua::Error::runtime)?,
            base: None,
            lua,
        })
    }

    fn show(&self, list: &Table) -> mlua::Result<String> {
        self.show.call(list)
    }

    /// The argument list of a seed, `{ n = ..., ... }`.
    fn list(&self, seed: u64) -> mlua::Result<Table> {
        self.args.call((seed as f64, &self.opts))
    }

    /// Where a seed's round trip borrows strings from, if it does.
    fn borrow_of(seed: u64) -> Option<usize> {
        let mut rng = Rng::new(seed ^ 0xb0_88_0b);
        rng.chance(60).then(|| 1 + rng.index(64))
    }

    fn borrowing(borrow: Option<usize>) -> String {
        borrow.map_or("copying strings".into(), |min| {
            format!("borrowing strings from {min} bytes")
        })
    }

    /// Encodes `list` and decodes the payload back, in the same state.
    fn round_trip(lua: &Lua, same: &Function, list: &Table, borrow: Option<usize>) -> Check {
        let vals = unpack(list)?;
        let payload = match codec::encode(&vals, borrow) {
            Ok(p) => p,
            Err(e) => return Ok(Err(format!("refused to encode: {e}"))),
        };
        let back = match codec::decode(lua, &payload.bytes, &payload) {
            Ok(v) => v,
            Err(e) => return Ok(Err(format!("refused its own payload: {e}"))),
        };
        let (ok, diff): (bool, Option<String>) = same.call((list, packed(lua, &back)?))?;
        Ok(if ok {
            Ok(())
        } else {
            Err(diff.unwrap_or_default())
        })
    }

    /// The round trip of a seed's values; on failure, the text to print.
    fn values(&self, seed: u64, verbose: bool) -> Check {
        let list = self.list(seed)?;
        let borrow = Self::borrow_of(seed);
        if verbose {
            report(&format!(
                "input: values ({}): {}",
                Self::borrowing(borrow),
                self.show(&list)?
            ));
            if let Ok(p) = codec::encode(&unpack(&list)?, borrow) {
                report(&format!("payload: {}", hex(&p.bytes)));
            }
        }
        let Err(diff) = Self::round_trip(&self.lua, &self.same, &list, borrow)? else {
            return Ok(Ok(()));
        };
        let same = self.same.clone();
        let fails = self.lua.create_function(move |lua, list: Table| {
            Ok(Self::round_trip(lua, &same, &list, borrow)?.is_err())
        })?;
        let (small, tried): (Table, usize) = self.shrink.call((&list, fails, SHRINK_TRIES))?;
        let small_diff = Self::round_trip(&self.lua, &self.same, &small, borrow)?
            .err()
            .unwrap_or_default();
        let small_payload = codec::encode(&unpack(&small)?, borrow)
            .map_or_else(|e| format!("(refused: {e})"), |p| hex(&p.bytes));
        Ok(Err(format!(
            "round trip ({}): {diff}\n  value: {}\n  smallest failing value \
             ({tried} tried): {}\n  which gives: {small_diff}\n  its payload: {small_payload}",
            Self::borrowing(borrow),
            self.show(&list)?,
            self.show(&small)?,
        )))
    }

    /// Makes `self.base` the valid payload that the mutations of `seed`
    /// start from: the values of another seed, shared by 32 seeds in a row.
    fn make_base(&mut self, seed: u64) -> mlua::Result<()> {
        let base_seed = (1 << 40) + seed / 32;
        if self.base.as_ref().is_none_or(|(s, _)| *s != base_seed) {
            let vals = unpack(&self.list(base_seed)?)?;
            let payload = codec::encode(&vals, (base_seed % 2 == 1).then_some(8))
                .map_err(mlua::Error::runtime)?;
            self.base = Some((base_seed, payload));
        }
        Ok(())
    }

    /// Decodes bytes whose borrowed strings are those of `strings`.
    fn decode(&self, bytes: &[u8], strings: &Payload) -> mlua::Result<Outcome> {
        let vals = match codec::decode(&self.lua, bytes, strings) {
            Ok(vals) => vals,
            Err(e) if e.len() > "bad payload: ".len() && e.starts_with("bad payload: ") => {
                return Ok(Outcome::Refused)
            }
            Err(e) => {
                return Ok(Outcome::Failed(format!(
                    "refused without a \"bad payload: \" text: {e:?}"
                )))
            }
        };
        let list = packed(&self.lua, &vals)?;
        Ok(
            match Self::round_trip(&self.lua, &self.same, &list, None)? {
                Ok(()) => Outcome::Accepted,
                Err(e) => Outcome::Failed(format!(
                    "accepted {}, which do not cross again: {e}",
                    self.show(&list)?
                )),
            },
        )
    }

    /// Checks the input of `seed`.
    fn check(&mut self, seed: u64, kind: Kind, verbose: bool) -> mlua::Result<Outcome> {
        if kind == Kind::RoundTrip {
            return Ok(match self.values(seed, verbose)? {
                Ok(()) => Outcome::Passed,
                Err(why) => Outcome::Failed(why),
            });
        }
        let mut rng = Rng::new(seed);
        rng.next();
        self.make_base(seed)?;
        let base = &self.base.as_ref().expect("made").1;
        let (bytes, what, strings) = match kind {
            Kind::Mutated => (
                inputs::mutate(&mut rng, &base.bytes),
                "mutated payload",
                base,
            ),
            Kind::Structured => (
                inputs::structured(&mut rng),
                "structured payload",
                &self.donor,
            ),
            _ => (inputs::random(&mut rng), "random bytes", &self.donor),
        };
        let input = || format!("{what} ({} bytes): {}", bytes.len(), hex(&bytes));
        if verbose {
            report(&format!("input: {}", input()));
        }
        Ok(match self.decode(&bytes, strings)? {
            Outcome::Failed(why) => Outcome::Failed(format!("{why}\n  input: {}", input())),
            outcome => outcome,
        })
    }
}

/// What became of one input.
enum Outcome {
    /// Values that crossed intact.
    Passed,
    /// Bytes the decoder took, whose values cross again intact.
    Accepted,
    /// Bytes the decoder refused with a "bad payload: ..." text.
    Refused,
    Failed(String),
}

/// The values of a packed list.
fn unpack(list: &Table) -> mlua::Result<MultiValue> {
    let n: usize = list.raw_get("n")?;
    (1..=n).map(|i| list.raw_get::<Value>(i)).collect()
}

/// A packed list of values: `{ n = ..., ... }`.
fn packed(lua: &Lua, vals: &MultiValue) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("n", vals.len())?;
    for (i, v) in vals.iter().enumerate() {
        t.raw_set(i + 1, v)?;
    }
    Ok(t)
}

/// A line for the parent (stdout, flushed: the process may die next).
fn report(text: &str) {
    let mut out = std::io::stdout().lock();
    for line in text.lines() {
        let _ = writeln!(out, "{PREFIX}{line}");
    }
    let _ = out.flush();
}

/// Checks seeds `first..first + count` in this process; reports failures,
/// then a `done` line with the counts.
fn run_slice(first: u64, count: u64, verbose: bool) {
    static CURRENT: AtomicU64 = AtomicU64::new(u64::MAX);
    static STARTED_MS: AtomicU64 = AtomicU64::new(0);
    let clock = Instant::now();
    let hang = Duration::from_secs(env_u64("FUZZ_HANG_SECS", 10));
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        let seed = CURRENT.load(Ordering::SeqCst);
        let since = clock.elapsed() - Duration::from_millis(STARTED_MS.load(Ordering::SeqCst));
        if seed != u64::MAX && since > hang {
            report(&format!(
                "HANG seed={seed}: still running after {:.1} s",
                since.as_secs_f64()
            ));
            std::process::exit(3);
        }
    });

    let mut fuzzer = Fuzzer::new().expect("propgen loads");
    let mut counts = Counts::default();
    for seed in first..first + count {
        STARTED_MS.store(clock.elapsed().as_millis() as u64, Ordering::SeqCst);
        CURRENT.store(seed, Ordering::SeqCst);
        let kind = kind_of(seed);
        let outcome = fuzzer
            .check(seed, kind, verbose)
            .unwrap_or_else(|e| Outcome::Failed(format!("the harness failed: {e}")));
        CURRENT.store(u64::MAX, Ordering::SeqCst);
        counts.0[INPUTS] += 1;
        counts.0[kind as usize] += 1;
        match outcome {
            Outcome::Passed => {}
            Outcome::Accepted => counts.0[ACCEPTED] += 1,
            Outcome::Refused => counts.0[REJECTED] += 1,
            Outcome::Failed(text) => {
                counts.0[FAILURES] += 1;
                if counts.0[FAILURES] <= MAX_PRINTED {
                    report(&format!("FAIL seed={seed}: {text}"));
                }
            }
        }
    }
    report(&format!("done {}", counts.line()));
}

#[test]
#[ignore = "a slice of `fuzz`, run by it in a child process"]
fn fuzz_slice() {
    let Ok(slice) = std::env::var("FUZZ_SLICE") else {
        return;
    };
    let (first, count) = slice.split_once(':').expect("FUZZ_SLICE=first:count");
    run_slice(
        first.parse().expect("first seed"),
        count.parse().expect("count"),
        std::env::var_os("FUZZ_VERBOSE").is_some(),
    );
}

// The parent -----------------------------------------------------------------

/// What a child said.
struct Child {
    /// Its counts, when it got to the end of its slice.
    counts: Option<Counts>,
    /// Its reports other than the counts: failures, a hang, a verbose input.
    lines: Vec<String>,
    /// How it ended, and the end of its stderr, when it did not get to the end.
    death: String,
}

fn run_child(first: u64, count: u64, verbose: bool) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "fuzz_slice",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("FUZZ_SLICE", format!("{first}:{count}"));
    if verbose {
        cmd.env("FUZZ_VERBOSE", "1");
    }
    let out = cmd.output().expect("cannot start a fuzz child");
    let mut child = Child {
        counts: None,
        lines: Vec::new(),
        death: String::new(),
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // (libtest's "test fuzz_slice ... " may start the line)
        let Some((_, report)) = line.split_once(PREFIX) else {
            continue;
        };
        match report.strip_prefix("done ") {
            Some(counts) => child.counts = Counts::parse(counts),
            None => child.lines.push(report.to_string()),
        }
    }
    if child.counts.is_none() || !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        child.counts = None;
        child.death = format!(
            "{}; stderr ends: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    child
}

/// Failure texts out of a child's lines: each starts at "FAIL" or "HANG".
fn failures(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in lines {
        match out.last_mut() {
            Some(last) if !line.starts_with("FAIL") && !line.starts_with("HANG") => {
                last.push('\n');
                last.push_str(line);
            }
            _ => out.push(line.clone()),
        }
    }
    out
}

/// Checks seeds `first..first + count` in children: their counts and
/// failures. A child that dies is bisected down to the seed that kills it.
fn check_slice(first: u64, count: u64, verbose: bool) -> (Counts, Vec<String>) {
    if count == 0 {
        return (Counts::default(), Vec::new());
    }
    let child = run_child(first, count, verbose);
    if let Some(counts) = child.counts {
        return (counts, failures(&child.lines));
    }
    let hang = child.lines.iter().find_map(|l| {
        l.strip_prefix("HANG seed=")?
            .split(':')
            .next()?
            .parse::<u64>()
            .ok()
    });
    let Some(seed) = hang.or_else(|| culprit(first, count)) else {
        let text = format!(
            "FAIL seeds {first}..{}: a child died ({}), and no part of them alone kills one",
            first + count - 1,
            child.death
        );
        return (Counts::default(), vec![text]);
    };
    // The seed alone, printing its input before checking it.
    let alone = if count == 1 && verbose {
        child
    } else {
        run_child(seed, 1, true)
    };
    let how = if alone.lines.iter().any(|l| l.starts_with("HANG")) {
        "the input hangs"
    } else {
        "the process died"
    };
    let mut text = format!("FAIL seed={seed}: {how}: {}", alone.death);
    for line in &alone.lines {
        text.push_str("\n  ");
        text.push_str(line);
    }
    let (mut counts, mut fails) = check_slice(first, seed - first, verbose);
    let (after, after_fails) = check_slice(seed + 1, first + count - seed - 1, verbose);
    counts.add(&after);
    counts.0[INPUTS] += 1;
    counts.0[FAILURES] += 1;
    fails.push(text);
    fails.extend(after_fails);
    (counts, fails)
}

/// The one seed of a dying slice that kills a child alone, if one does.
fn culprit(first: u64, count: u64) -> Option<u64> {
    if count == 1 {
        return Some(first);
    }
    let half = count / 2;
    for (a, c) in [(first, half), (first + half, count - half)] {
        if run_child(a, c, false).counts.is_none() {
            return culprit(a, c);
        }
    }
    None
}

#[test]
fn fuzz() {
    let inputs = env_u64("FUZZ_INPUTS", 150_000);
    let first = env_u64("FUZZ_SEED", 0);
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    let jobs = env_u64("FUZZ_JOBS", cpus).max(1);
    let slice = (inputs / (jobs * 8)).clamp(1, 200_000);
    let verbose = inputs == 1;
    let queue: Mutex<VecDeque<(u64, u64)>> = Mutex::new(
        (first..first + inputs)
            .step_by(slice as usize)
            .map(|s| (s, slice.min(first + inputs - s)))
            .collect(),
    );
    let totals = Mutex::new((Counts::default(), Vec::new()));
    let started = Instant::now();
    let last_progress = Mutex::new(Instant::now());

    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let Some((a, c)) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                let (counts, fails) = check_slice(a, c, verbose);
                let mut t = totals.lock().unwrap();
                t.0.add(&counts);
                t.1.extend(fails);
                let mut last = last_progress.lock().unwrap();
                if last.elapsed() > Duration::from_secs(10) {
                    *last = Instant::now();
                    let done = t.0 .0[INPUTS];
                    eprintln!(
                        "fuzz: {done} of {inputs} inputs, {:.0}/s, {} failures",
                        done as f64 / started.elapsed().as_secs_f64(),
                        t.0 .0[FAILURES]
                    );
                }
            });
        }
    });

    let (counts, fails) = totals.into_inner().unwrap();
    let secs = started.elapsed().as_secs_f64();
    let c = counts.0;
    eprintln!(
        "fuzz: {} inputs (seeds {first}..{}) in {secs:.1} s, {:.0} inputs/s, {jobs} processes: \
         {} round trips of generated values, {} mutated payloads, {} structured payloads, \
         {} random byte strings; the decoder accepted {} and refused {} of those; {} failures",
        c[INPUTS],
        first + inputs - 1,
        c[INPUTS] as f64 / secs,
        c[Kind::RoundTrip as usize],
        c[Kind::Mutated as usize],
        c[Kind::Structured as usize],
        c[Kind::Random as usize],
        c[ACCEPTED],
        c[REJECTED],
        c[FAILURES],
    );
    assert!(
        fails.is_empty() && c[FAILURES] == 0,
        "{} failures (replay one with FUZZ_SEED=S FUZZ_INPUTS=1):\n{}",
        c[FAILURES],
        fails.join("\n")
    );
    assert_eq!(c[INPUTS], inputs, "inputs checked");
}
