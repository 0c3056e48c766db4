//! A task's encoded values on their way between the event loop and a pool
//! thread, with the large strings they borrow instead of holding
//! (codec::Span) and, for results, what keeps those alive.

use crate::codec::Span;
use crate::vm::PinKey;
use crossbeam_channel::Sender;

#[derive(Default)]
pub struct Payload {
    pub bytes: Vec<u8>,
    pub spans: Vec<Span>,
    /// Results only: the pool thread's pin on the borrowed strings.
    pub pinned: Option<Pinned>,
}

/// A pool thread's result strings that the event loop reads in place.
/// Dropping it, on whichever thread, tells the pool thread to let go of
/// them; the thread keeps its Lua state alive until it has (threads.rs).
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
