//! What a pool thread's handler, of either kind, is given and gives back
//! for one task: the task's cancellation, how it went, and its error
//! payload. Below both kinds (vm/, native/) and the seam over them
//! (handler.rs).

use crate::codec;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the running task's caller gave up (timeout, request gone, its
/// batch timed out): its result will be dropped, so the handler may stop.
/// A borrow of the task's flag (worker/work.rs), valid while the task
/// runs; reading it is one relaxed atomic load, cheap enough for a
/// handler's inner loop. Kind-agnostic: a native handler reads it through
/// `ngx_tp_task_t.cancelled`.
#[derive(Clone, Copy)]
pub struct Cancel<'a>(&'a AtomicBool);

impl<'a> Cancel<'a> {
    pub fn new(flag: &'a AtomicBool) -> Cancel<'a> {
        Cancel(flag)
    }

    /// Relaxed: the flag only tells the handler that work is wasted; it
    /// orders nothing the handler reads.
    pub fn is_cancelled(self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The flag itself, for a handler that hands it across an FFI call
    /// and reads it there; valid as long as this borrow.
    pub fn flag(self) -> &'a AtomicBool {
        self.0
    }
}

/// How a task went.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The payload holds the results.
    Done,
    /// The payload holds the error value for the caller.
    Failed,
    /// As Failed, and the state should not serve another task: it ran out
    /// of memory (its handler may keep what filled it). The thread
    /// rebuilds it.
    OutOfMemory,
}

/// Names the result strings of one task that a state keeps alive; unique
/// in the process, so a key finds its state after a rebuild too. Below
/// 2^53: it is a Lua number in the state.
pub type PinKey = u64;

/// What running a task gave: how it went, the key of its borrowed result
/// strings, and the finalizers that failed after it (how many, the first
/// one's error).
pub struct Ran {
    pub outcome: Outcome,
    pub pin: Option<PinKey>,
    pub drained: (u32, Option<String>),
}

impl From<Outcome> for Ran {
    fn from(outcome: Outcome) -> Ran {
        Ran {
            outcome,
            pin: None,
            drained: (0, None),
        }
    }
}

/// Replaces `payload` with a single string error value.
pub fn fail(payload: &mut Vec<u8>, msg: &str) {
    payload.clear();
    codec::encode_string(msg.as_bytes(), payload);
}
