//! The shadow's half of a shadow comparison (`thread_pool_shadow`): what a
//! shadow task carries — copies of the arguments and of POOL's result that
//! outlive POOL's task — and the comparison, counting and logging that
//! SHADOW's thread does once it has run the task. Nothing goes back to the
//! event loop. shadow.rs is POOL's half.

use crate::codec::{self, Span};
use crate::handoff::job::Expectation;
use crate::handoff::payload::{Args, Payload};
use crate::luajit::stack::Op;
use crate::stats::PoolStats;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A pool and its shadow, as their threads share them.
pub struct Pair {
    pub pool: String,
    pub shadow: String,
    /// POOL's counters, where the pair's are kept.
    pub counts: &'static PoolStats,
    /// Whether a mismatch's line shows the values (`log_values=on`), or
    /// only what identifies them: the values are request data.
    log_values: bool,
    /// When the last mismatch was logged, and how many since were not.
    logged: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

/// How often a pair logs a mismatch at most (the first one at once).
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Bytes of each of the arguments and the two results in a log line
/// (`log_values=on`).
pub const SHOWN: usize = 256;

impl Pair {
    pub fn new(pool: String, shadow: String, counts: &'static PoolStats, log_values: bool) -> Pair {
        Pair {
            pool,
            shadow,
            counts,
            log_values,
            logged: Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Whether a mismatch is logged now: with how many were not since the
    /// last line.
    fn may_log(&self) -> Option<u64> {
        let mut last = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.unlogged.fetch_add(1, Relaxed);
            return None;
        }
        *last = Some(Instant::now());
        Some(self.unlogged.swap(0, Relaxed))
    }
}

/// Copies of borrowed strings that a payload's spans point into: only
/// kept, never read through (the spans are).
pub struct Held {
    _copies: Vec<Box<[u8]>>,
}

/// A payload copied off the memory it borrowed: its bytes, and spans that
/// point into `held` (or are empty where the payload does not use them).
pub struct Owned {
    pub bytes: Vec<u8>,
    pub spans: Vec<Span>,
    pub held: Held,
}

impl Owned {
    /// Copies `bytes` and the borrowed strings it uses of `spans` (a
    /// batch's task uses some of its push's spans).
    ///
    /// # Safety
    /// The spans' bytes must be alive until this returns.
    pub unsafe fn copy(bytes: &[u8], spans: &[Span]) -> Owned {
        // The strings the payload reads are the decoder's byte slices that
        // are a span's exact bytes; a payload without spans reads none.
        let used: HashSet<(usize, usize)> = if spans.is_empty() {
            HashSet::new()
        } else {
            // SAFETY: the spans' bytes are alive until this returns (the
            // contract), and the decoder reads them only here.
            match unsafe { codec::decode(bytes, spans, codec::reuse(Vec::new())) } {
                Ok(decoded) => decoded
                    .ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::Bytes(b) => Some((b.as_ptr() as usize, b.len())),
                        _ => None,
                    })
                    .collect(),
                // not decodable: whatever it is, the shadow sees the same
                Err(_) => spans.iter().map(|s| (s.data as usize, s.len)).collect(),
            }
        };
        let mut held = Vec::new();
        let spans = spans
            .iter()
            .map(|s| {
                if !used.contains(&(s.data as usize, s.len)) {
                    return Span::of(&[]);
                }
                // SAFETY: the span's bytes are alive until this returns (the
                // contract); they are copied into the box at once.
                let copy: Box<[u8]> = unsafe { s.bytes() }.into();
                // the box's bytes stay where they are when it moves
                let span = Span::of(&copy);
                held.push(copy);
                span
            })
            .collect();
        Owned {
            bytes: bytes.to_vec(),
            spans,
            held: Held { _copies: held },
        }
    }

    fn values(&self) -> Result<codec::Values<'_>, codec::CodecError> {
        // SAFETY: the spans point into held, alive as long as self.
        unsafe { codec::values(&self.bytes, &self.spans) }
    }
}

/// What a shadow task carries besides its arguments: POOL's result and
/// where to count.
pub struct Expected {
    /// The copies the shadow task's argument spans point into: kept.
    _args_held: Held,
    result: Owned,
    /// POOL's handler failed: `result` holds its error value.
    failed: bool,
    /// A stream's: the chunks POOL's handler sent, in order.
    chunks: Vec<Vec<u8>>,
    pair: std::sync::Arc<Pair>,
}

impl Expected {
    /// A shadow task's arguments (one task) and what it carries.
    pub fn task(
        args: Owned,
        result: Owned,
        failed: bool,
        chunks: Vec<Vec<u8>>,
        pair: std::sync::Arc<Pair>,
    ) -> (Args, Expected) {
        let Owned { bytes, spans, held } = args;
        let ends = vec![bytes.len()];
        let expected = Expected {
            _args_held: held,
            result,
            failed,
            chunks,
            pair,
        };
        (Args { bytes, spans, ends }, expected)
    }
}

impl Expectation for Expected {
    unsafe fn check(&self, args: &Args, got: &Payload, chunks: &[Payload]) -> Option<String> {
        let counts = self.pair.counts;
        PoolStats::add(&counts.shadow_compared);
        let want = self.result.values();
        // SAFETY: got's spans are SHADOW's pinned result strings, alive as
        // long as got.
        let have = unsafe { codec::values(&got.bytes, &got.spans) };
        // The first chunk that differs, as many as were sent when all that
        // both sent are alike; None when the sequences are alike.
        let differs = self.chunks.iter().zip(chunks).position(|(a, b)| {
            // SAFETY: chunks borrow nothing (their spans are empty).
            let (a, b) = unsafe { (codec::values(a, &[]), codec::values(&b.bytes, &b.spans)) };
            !matches!((a, b), (Ok(a), Ok(b)) if a == b)
        });
        let differs = differs
            .or((self.chunks.len() != chunks.len()).then(|| self.chunks.len().min(chunks.len())));
        let equal = differs.is_none()
            && self.failed == got.failed
            && matches!((&want, &have), (Ok(a), Ok(b)) if a == b);
        if equal {
            return None;
        }
        PoolStats::add(&counts.shadow_mismatched);
        let unlogged = self.pair.may_log()?;
        let log_values = self.pair.log_values;
        let show = |failed: bool, v: Result<codec::Values, codec::CodecError>| {
            let text = v.map_or_else(
                |e| e.to_string(),
                |v| {
                    if log_values {
                        v.show(SHOWN)
                    } else {
                        v.digest()
                    }
                },
            );
            if failed {
                format!("error {text}")
            } else {
                text
            }
        };
        let Pair { pool, shadow, .. } = &*self.pair;
        let stream = match differs {
            Some(k) => format!(
                "; of its stream, \"{pool}\" sent {} chunks and \"{shadow}\" {}, \
                 the first that differs is #{}",
                self.chunks.len(),
                chunks.len(),
                k + 1
            ),
            None => String::new(),
        };
        Some(format!(
            "thread pool \"{pool}\" and its shadow \"{shadow}\" differ \
             ({unlogged} more since the last line): arguments: {}; \"{pool}\" returned: {}; \
             \"{shadow}\" returned: {}{stream}",
            // SAFETY: the spans point into _args_held (our contract).
            show(false, unsafe { codec::values(&args.bytes, &args.spans) }),
            show(self.failed, want),
            show(got.failed, have)
        ))
    }
}
