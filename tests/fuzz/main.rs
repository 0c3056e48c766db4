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
//! Environment: `FUZZ_INPUTS` (default 300,000, 10–30 s on 2 cores),
//! `FUZZ_SEED` (the first seed, default 0), `FUZZ_JOBS` (default: the
//! CPUs), `FUZZ_HANG_SECS` (default 10). `FUZZ_SEED=S FUZZ_INPUTS=1`
//! replays seed S and prints its input.
//!
//! Files: checks.rs (one seed's input and its check), inputs.rs (the byte
//! inputs), slices.rs (children, their reports, bisection), codec.rs (the
//! codec under test: the only file that names its API).

mod checks;
mod codec;
mod inputs;
mod slices;

use checks::Kind;
use slices::{check_slice, run_slice, Counts, ACCEPTED, FAILURES, INPUTS, REJECTED};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
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

#[test]
fn fuzz() {
    let inputs = env_u64("FUZZ_INPUTS", 300_000);
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
