//! Encoded values on their way between the event loop and a pool thread,
//! with the large strings they borrow instead of holding (codec::Span)
//! and, for results, what keeps those alive.

use crate::codec::Span;
use crate::handoff::outcome::PinKey;
use crossbeam_channel::Sender;

/// Payload buffers up to this size are kept for reuse.
pub const KEEP: usize = 64 * 1024;
/// After payloads adding up to this size, a pool thread that goes idle
/// gives memory back (thread/run.rs).
pub const LARGE: usize = 1024 * 1024;

/// The arguments of the tasks of one push: one part of `bytes` per task,
/// in order; the parts share `spans` (a borrowed string's index counts
/// from the push's first). Whoever pushed keeps the spans' bytes alive
/// until the tasks are done.
#[derive(Default)]
pub struct Args {
    pub bytes: Vec<u8>,
    pub spans: Vec<Span>,
    /// Where each task's part ends in `bytes`.
    pub ends: Vec<usize>,
}

impl Args {
    /// Empty, its allocations kept for the next push.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
        self.ends.clear();
    }

    /// The number of tasks.
    pub fn count(&self) -> usize {
        self.ends.len()
    }

    /// Marks the end of a task's part: what was appended since the last.
    pub fn end_part(&mut self) {
        self.ends.push(self.bytes.len());
    }

    /// The encoded arguments of task `i`.
    pub fn part(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// Bytes of the borrowed strings, per task: they count as handled
    /// like copied ones.
    pub fn borrowed_per_task(&self) -> usize {
        self.spans.iter().map(|s| s.len).sum::<usize>() / self.count().max(1)
    }
}

/// One task's results, or its error value.
#[derive(Default)]
pub struct Payload {
    pub bytes: Vec<u8>,
    pub spans: Vec<Span>,
    /// The handler failed: `bytes` holds its error value.
    pub failed: bool,
    /// The pool thread's pin on the borrowed strings.
    pub pinned: Option<Pinned>,
}

/// A pool thread's result strings that the event loop reads in place.
/// Dropping it, on whichever thread, tells the pool thread to let go of
/// them; the thread keeps its Lua state alive until it has (thread/run.rs).
pub struct Pinned {
    key: PinKey,
    back: Sender<PinKey>,
}

impl Pinned {
    pub fn new(key: PinKey, back: Sender<PinKey>) -> Pinned {
        Pinned { key, back }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // A thread that is gone took its Lua state with it.
        let _ = self.back.send(self.key);
    }
}
