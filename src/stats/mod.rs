//! What both sides count and every worker's status page reads: a pool's
//! counters and timings, kept with relaxed atomics (the event loop and the
//! pool's threads update them without a lock; `tp.NAME:stats()` and
//! `thread_pool_status` read them), laid out as plain C data (u64s) in
//! memory shared by the workers.

mod admission;
mod counters;
pub mod gate;
mod histogram;
mod status_table;
mod tally;
mod versions;

pub use counters::{Kind, Labels, PoolStats, Stat, Unit, STATS};
pub use histogram::{Histogram, Reading, BUCKET_BOUNDS_US};
pub use status_table::{StatusTable, UNKNOWN_THREADS};
pub use tally::Tally;
pub use versions::{Reached, ThreadVersion, UpdateError};
