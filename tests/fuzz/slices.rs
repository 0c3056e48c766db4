//! Seeds in slices: a child process checks a slice and reports on stdout
//! (run_slice); the parent runs children, reads their reports, and bisects
//! the slice of a child that died down to the seed that killed it.

use crate::checks::{kind_of, Fuzzer, Outcome};
use crate::env_u64;
use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Marks the lines a child reports on.
const PREFIX: &str = "fuzz| ";
/// Failures a child prints in full (it counts them all).
const MAX_PRINTED: u64 = 10;

/// The counters of a slice; a `Kind`'s value is the index of its own.
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
pub const INPUTS: usize = 0;
pub const ACCEPTED: usize = 5;
pub const REJECTED: usize = 6;
pub const FAILURES: usize = 7;

#[derive(Clone, Copy, Default)]
pub struct Counts(pub [u64; COUNTS.len()]);

impl Counts {
    pub fn add(&mut self, other: &Counts) {
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

/// A line for the parent (stdout, flushed: the process may die next).
pub fn report(text: &str) {
    let mut out = std::io::stdout().lock();
    for line in text.lines() {
        let _ = writeln!(out, "{PREFIX}{line}");
    }
    let _ = out.flush();
}

/// Checks seeds `first..first + count` in this process; reports failures,
/// then a `done` line with the counts.
pub fn run_slice(first: u64, count: u64, verbose: bool) {
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
/// Lines before the first are a replayed input: printed here.
fn failures(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in lines {
        if line.starts_with("FAIL") || line.starts_with("HANG") {
            out.push(line.clone());
        } else if let Some(last) = out.last_mut() {
            last.push('\n');
            last.push_str(line);
        } else {
            eprintln!("{line}");
        }
    }
    out
}

/// Checks seeds `first..first + count` in children: their counts and
/// failures. A child that dies is bisected down to the seed that kills it.
pub fn check_slice(first: u64, count: u64, verbose: bool) -> (Counts, Vec<String>) {
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
