//! The pool threads' side of the hand-off: each thread's loop, the seam
//! over its handler (a Lua state or a native library), the shadow
//! comparison and the watchdog. Nothing here runs on the event loop.

pub mod compare;
pub mod handler;
pub mod run;
pub mod shadow;
pub mod stack;
pub mod updates;
pub mod watchdog;
