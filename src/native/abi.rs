//! The C side of handler/include/ngx_threadpool.h: its structs and the
//! four exports, as a loaded library gives them. Kept in step with the
//! header by hand: each item names its C counterpart.

use crate::codec::Span;
use std::ffi::{c_int, c_uint, c_void};

/// NGX_THREADPOOL_ABI_VERSION.
pub const ABI_VERSION: u32 = 2;
/// The oldest version loaded: version 2 only added fields at the end of
/// `ngx_tp_task_t`.
pub const ABI_VERSION_MIN: u32 = 1;

/// NGX_TP_OK and NGX_TP_ERROR.
pub const OK: c_int = 0;
pub const ERROR: c_int = 1;
/// NGX_TP_CANCELLED, NGX_TP_END, NGX_TP_NO_STREAM (send and receive).
pub const CANCELLED: c_int = 2;
pub const END: c_int = 3;
pub const NO_STREAM: c_int = 4;

/// NGX_TP_LOG_ERR ... NGX_TP_LOG_DEBUG, nginx's own levels.
pub const LOG_ERR: c_int = 4;
pub const LOG_DEBUG: c_int = 8;

/// `ngx_tp_bytes_t`: codec::Span is `#[repr(C)] { data, len }`, the same
/// layout, so spans cross as they are.
pub type Bytes = Span;

/// `ngx_tp_out_t`.
#[repr(C)]
pub struct Out {
    pub write: unsafe extern "C" fn(out: *mut Out, data: *const u8, len: usize) -> c_int,
    pub module: *mut c_void,
}

/// `ngx_tp_log_pt`.
pub type LogFn = unsafe extern "C" fn(log: *const c_void, level: c_int, msg: *const u8, len: usize);

/// `ngx_tp_init_t`.
#[repr(C)]
pub struct Init {
    pub pool: Bytes,
    pub config: Bytes,
    pub thread: c_uint,
    pub log_fn: LogFn,
    pub log: *const c_void,
}

/// `ngx_tp_task_t`.
#[repr(C)]
pub struct Task {
    pub args: Bytes,
    pub spans: *const Bytes,
    pub nspans: usize,
    pub cancelled: unsafe extern "C" fn(task: *const Task) -> c_int,
    pub module: *const c_void,
    pub send: unsafe extern "C" fn(task: *const Task, payload: *const u8, len: usize) -> c_int,
    pub receive: unsafe extern "C" fn(task: *const Task, out: *mut Out) -> c_int,
}

/// `ngx_threadpool_abi_version`.
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
/// `ngx_threadpool_init`.
pub type InitFn =
    unsafe extern "C" fn(init: *const Init, state: *mut *mut c_void, err: *mut Out) -> c_int;
/// `ngx_threadpool_process`.
pub type ProcessFn =
    unsafe extern "C" fn(state: *mut c_void, task: *const Task, out: *mut Out) -> c_int;
/// `ngx_threadpool_free`.
pub type FreeFn = unsafe extern "C" fn(state: *mut c_void);
