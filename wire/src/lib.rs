#![doc = include_str!("../README.md")]

/// Deepest table nesting a payload holds (a top-level table is level 1):
/// the header's `NGX_TP_MAX_DEPTH`.
pub const MAX_DEPTH: usize = 100;

/// Most values in one payload: the header's `NGX_TP_MAX_VALUES`. LuaJIT
/// cannot push or `unpack` more than about 8000 values at once, so this
/// leaves room and bounds what a count in a corrupt payload can make the
/// decoder allocate.
pub const MAX_VALUES: usize = 4096;

/// Largest payload, in encoded bytes.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// The msgpack ext type of a borrowed string (the header's
/// `NGX_TP_EXT_BORROWED`): a large string that is not copied into the
/// payload but read in place where the payload is decoded. Its data is the
/// big-endian u32 index of the task's span holding it.
pub const EXT_BORROWED: i8 = 1;

/// The version of the C ABI (the header's `NGX_THREADPOOL_ABI_VERSION`):
/// what a handler library's `ngx_threadpool_abi_version` returns. Version
/// 2 added a task's `send` and `receive` (streams) at the end of
/// `ngx_tp_task_t`.
pub const ABI_VERSION: u32 = 2;

/// The oldest version the module loads: a version 1 library never reads
/// the fields version 2 added.
pub const ABI_VERSION_MIN: u32 = 1;

/// The return codes of `ngx_threadpool_init` and `ngx_threadpool_process`
/// (`NGX_TP_OK`, `NGX_TP_ERROR`), and of a task's `send` and `receive`.
pub mod status {
    /// The payload written holds the results.
    pub const OK: i32 = 0;
    /// The payload written holds one error value.
    pub const ERROR: i32 = 1;
    /// `NGX_TP_CANCELLED`: the stream's caller let go.
    pub const CANCELLED: i32 = 2;
    /// `NGX_TP_END`: the stream's input ended.
    pub const END: i32 = 3;
    /// `NGX_TP_NO_STREAM`: the task was not pushed with push_stream.
    pub const NO_STREAM: i32 = 4;
}

/// The levels of the ABI's log function, nginx's own (`NGX_TP_LOG_ERR` ...
/// `NGX_TP_LOG_DEBUG`).
pub mod level {
    /// `NGX_TP_LOG_ERR`.
    pub const ERR: i32 = 4;
    /// `NGX_TP_LOG_WARN`.
    pub const WARN: i32 = 5;
    /// `NGX_TP_LOG_NOTICE`.
    pub const NOTICE: i32 = 6;
    /// `NGX_TP_LOG_INFO`.
    pub const INFO: i32 = 7;
    /// `NGX_TP_LOG_DEBUG`.
    pub const DEBUG: i32 = 8;
}

/// What a stream's send or receive says in a task not pushed with
/// push_stream: the Lua thread library raises it, the handler crate's
/// StreamError::NoStream displays it.
pub const NO_STREAM: &str = "no stream: send and receive are for a handler run by push_stream";

/// A table key a Lua table cannot hold.
pub const NIL_KEY: &str = "nil table key";
/// A table key a Lua table cannot hold.
pub const NAN_KEY: &str = "NaN table key";

/// More than MAX_VALUES values of `what` ("argument", "return value").
pub fn too_many(what: &str) -> String {
    format!("too many {what}s (max {MAX_VALUES})")
}

/// A table past MAX_DEPTH, before the place it is in.
pub fn too_deep() -> String {
    format!("table nested deeper than {MAX_DEPTH}")
}

/// A payload over MAX_PAYLOAD, naming what it holds ("argument", "return
/// value").
pub fn too_large(what: &str) -> String {
    format!("{what}s exceed {MAX_PAYLOAD} bytes")
}

/// A payload the reader refuses (a bug or corruption, never a value of
/// the caller's), and why.
pub fn bad_payload(why: impl std::fmt::Display) -> String {
    format!("bad payload: {why}")
}

/// A panic caught at an edge, as the caller gets it.
pub fn panicked(message: impl std::fmt::Display) -> String {
    format!("panic: {message}")
}
