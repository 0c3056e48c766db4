//! Why the worker could not do what was asked.

pub use crate::handoff::outcome::OVERLOADED;
use std::fmt;

#[derive(Debug)]
pub enum WorkerError {
    /// The pool's queue holds `max_queue` tasks (the caller may run the
    /// work itself).
    QueueFull,
    /// The pool cannot be expected to finish the push's tasks before
    /// their deadline (the caller may shed the work or run a cheaper
    /// fallback).
    Overloaded,
    NoSuchPool,
    /// `thread_pool_update_size off`.
    UpdatesOff,
    /// The worker is exiting, or every thread of the pool is gone.
    Stopped,
    /// More task records than a handle can name (2^32).
    TooManyTasks,
    /// lua-nginx-module would not create a semaphore.
    Semaphore(String),
    ThreadSpawn {
        pool: String,
        err: std::io::Error,
    },
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            WorkerError::QueueFull => f.write_str("queue full"),
            WorkerError::Overloaded => f.write_str(OVERLOADED),
            WorkerError::NoSuchPool => f.write_str("no such thread pool"),
            WorkerError::UpdatesOff => {
                f.write_str("its updates are off (thread_pool_update_size off)")
            }
            WorkerError::Stopped => f.write_str("thread pool is stopped"),
            WorkerError::TooManyTasks => f.write_str("too many tasks"),
            WorkerError::Semaphore(why) => write!(f, "cannot create a semaphore: {why}"),
            WorkerError::ThreadSpawn { pool, err } => {
                write!(f, "thread pool \"{pool}\": cannot start a thread: {err}")
            }
        }
    }
}
