//! What crosses between the event loop (worker/, api/) and the pool threads
//! (pool/): a push's work and its task handle, the encoded values, a
//! task's cancellation and outcome, a stream's chunks, and the adaptive
//! poll both sides wait with.

pub mod job;
pub mod notify;
pub mod outcome;
pub mod payload;
pub mod spin;
pub mod stream;
pub mod update;
