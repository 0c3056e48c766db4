//! Configuration errors: what `nginx -t` prints, at emerg, with the file
//! and line.

use crate::native::LoadError;
use std::fmt;

#[derive(Debug)]
pub enum ConfError {
    /// Errors of a directive: nginx prints `"<directive>" directive <this>
    /// in <file>:<line>`.
    PoolNameNotUtf8,
    /// Not a time nginx understands (`100ms`, `5s`, `1m`) or `off`.
    BadTime,
    /// A `lua_thread_pool` parameter that is not threads=N or max_queue=M.
    BadPoolParameter(String),
    /// A `thread_pool_accept_gate` parameter that is not on, off, high=N
    /// or low=M, or marks out of order.
    BadGateParameter(String),
    /// A `thread_pool_scheduling` policy or nice value out of range.
    BadScheduling(String),
    /// A size (`thread_pool_zero_copy`, `thread_pool_update_size`) that is
    /// neither a size > 0 nor off.
    BadSize(String),
    /// A `thread_pool_stream_chunks` count that is not 1 to `max`.
    /// A `thread_pool_stack_size` that is not a size of at least `min`.
    BadStackSize {
        arg: String,
        min: usize,
    },
    BadStreamChunks {
        arg: String,
        max: usize,
    },
    /// A `thread_pool_shadow` parameter that is neither sample=RATIO,
    /// RATIO in (0, 1], nor log_values=on|off.
    BadShadowOption(String),
    /// `thread_pool_shadow P P`.
    ShadowOfItself(String),
    NoMemory,
    Read {
        path: String,
        err: std::io::Error,
    },
    /// The block's text (block.rs says why it could not be read).
    Block(String),
    Compile(String),
    Duplicate {
        pool: String,
    },
    /// A Lua directive and a native one on the same pool; `other` is the
    /// one that came first.
    Mixed {
        pool: String,
        other: String,
    },
    /// A native handler library that cannot be used.
    Library(LoadError),
    /// Errors found once the whole configuration is read (init_module).
    NoProcess {
        pool: String,
        /// The directive that named the pool.
        by: String,
        at: String,
    },
    SharedWithAio {
        pool: String,
        /// The pool's handler directive.
        by: String,
        place: String,
        at: String,
    },
    /// A pool's shadow that has a shadow of its own.
    ShadowChain {
        pool: String,
        shadow: String,
        at: String,
    },
    /// nginx's `thread_pool` struct did not read as expected.
    Layout(String),
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            ConfError::PoolNameNotUtf8 => f.write_str("pool name is not UTF-8"),
            ConfError::BadTime => f.write_str("expects a time (100ms, 5s...) or off"),
            ConfError::BadPoolParameter(p) => {
                write!(f, "takes threads=N [max_queue=M]: invalid \"{p}\"")
            }
            ConfError::BadGateParameter(p) => {
                write!(f, "takes on | off [high=N] [low=M]: invalid \"{p}\"")
            }
            ConfError::BadScheduling(p) => {
                write!(
                    f,
                    "takes normal | batch | idle [nice=0..19]: invalid \"{p}\""
                )
            }
            ConfError::BadSize(p) => {
                write!(f, "takes a size (16k, 1m...) or off: invalid \"{p}\"")
            }
            ConfError::BadStackSize { arg, min } => write!(
                f,
                "takes a size of at least {}k: invalid \"{arg}\"",
                min >> 10
            ),
            ConfError::BadStreamChunks { arg, max } => write!(
                f,
                "takes a number of chunks from 1 to {max}: invalid \"{arg}\""
            ),
            ConfError::BadShadowOption(p) => {
                write!(
                    f,
                    "takes POOL SHADOW [sample=RATIO] [log_values=on|off], RATIO in (0, 1]: \
                     invalid \"{p}\""
                )
            }
            ConfError::ShadowOfItself(p) => {
                write!(f, "cannot make thread pool \"{p}\" its own shadow")
            }
            ConfError::NoMemory => f.write_str("no memory"),
            ConfError::Read { path, err } => write!(f, "cannot read \"{path}\": {err}"),
            ConfError::Block(msg) => f.write_str(msg),
            ConfError::Compile(msg) => write!(f, "failed to compile: {msg}"),
            ConfError::Duplicate { pool } => write!(f, "is duplicate for pool \"{pool}\""),
            ConfError::Mixed { pool, other } => write!(
                f,
                "cannot be used with \"{other}\" for pool \"{pool}\": a pool runs Lua or a \
                 native handler, not both"
            ),
            ConfError::Library(e) => write!(f, "{e}"),
            ConfError::NoProcess { pool, by, at } => write!(
                f,
                "thread pool \"{pool}\" has {by} but no thread_pool_process_by_lua in {at}"
            ),
            ConfError::SharedWithAio {
                pool,
                by,
                place,
                at,
            } => write!(
                f,
                "thread pool \"{pool}\" has a {by} handler and cannot \
                 also serve \"aio threads\" (in {place}): declare another thread_pool for aio, \
                 in {at}"
            ),
            ConfError::ShadowChain { pool, shadow, at } => write!(
                f,
                "thread pool \"{pool}\" has the shadow \"{shadow}\", which has a shadow of its \
                 own: a shadow cannot be shadowed, in {at}"
            ),
            ConfError::Layout(msg) => f.write_str(msg),
        }
    }
}
