//! What a pool thread's handler, of either kind, is given and gives back
//! for one task: the task's cancellation, how it went, and its error
//! payload. Below both kinds (vm/, native/) and the seam over them
//! (thread/handler.rs).

use crate::codec;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a push with a deadline gets when the pool cannot be expected to
/// finish it in time: at once, or from a thread that found its deadline
/// too close to start it.
pub const OVERLOADED: &str = "overloaded";

/// Whether a task's caller gave up (timeout, request gone, its batch
/// timed out): its result will be dropped, so its handler may stop. Set by
/// the event loop when the caller lets go of a task that has not finished
/// (worker/tasks.rs); a task no thread took yet is then skipped, a running
/// one cannot be interrupted, but its handler may look, whatever its kind:
/// a Lua handler through `require("resty.threadpool").cancelled()`
/// (vm/cancel.rs), a native one through `ngx_tp_task_t.cancelled`
/// (native/). One per push, shared by its tasks (handoff/job.rs).
#[derive(Default)]
pub struct Cancel(AtomicBool);

impl Cancel {
    /// The caller gave up (event loop).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Relaxed: the flag only tells the handler that work is wasted; it
    /// orders nothing the handler reads. One load, cheap enough for a
    /// handler's inner loop.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
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
