//! The C types of `include/ngx_threadpool.h`, field for field, for the
//! exports that [`export!`](crate::export) generates. A handler written
//! with this crate never touches them; the generated functions name them
//! through `__private`. The header's numbers are ngx_threadpool_wire's.
//!
//! Invariant: each type has the layout of the header's type of the same
//! name (`tests/c_abi.rs` checks it through a C program built against the
//! header).

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};

/// `ngx_tp_bytes_t`: bytes owned by the module.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ngx_tp_bytes_t {
    /// The first byte; may be null when `len` is 0.
    pub data: *const u8,
    /// How many bytes.
    pub len: usize,
}

/// `ngx_tp_out_t`: where a handler appends a payload.
#[repr(C)]
#[derive(Debug)]
pub struct ngx_tp_out_t {
    /// Appends `len` bytes: 0, or -1 when the payload cannot grow.
    pub write: unsafe extern "C" fn(out: *mut ngx_tp_out_t, data: *const u8, len: usize) -> c_int,
    /// The module's; not touched here.
    pub module: *mut c_void,
}

/// `ngx_tp_log_pt`: writes one line to nginx's error log.
pub type ngx_tp_log_pt =
    unsafe extern "C" fn(log: *const c_void, level: c_int, msg: *const u8, len: usize);

/// `ngx_tp_init_t`: what `ngx_threadpool_init` gets.
#[repr(C)]
#[derive(Debug)]
pub struct ngx_tp_init_t {
    /// The pool's name.
    pub pool: ngx_tp_bytes_t,
    /// CONFIG from nginx.conf; `data` is null if none.
    pub config: ngx_tp_bytes_t,
    /// This thread's index in the pool, from 0.
    pub thread: c_uint,
    /// The error log's writer.
    pub log_fn: ngx_tp_log_pt,
    /// `log_fn`'s first argument, valid for the state's life.
    pub log: *const c_void,
}

/// `ngx_tp_task_t`: what `ngx_threadpool_process` gets.
#[repr(C)]
#[derive(Debug)]
pub struct ngx_tp_task_t {
    /// The arguments' payload.
    pub args: ngx_tp_bytes_t,
    /// Borrowed strings, by index (`nspans` of them).
    pub spans: *const ngx_tp_bytes_t,
    /// How many spans.
    pub nspans: usize,
    /// Non-zero once the caller gave up.
    pub cancelled: unsafe extern "C" fn(task: *const ngx_tp_task_t) -> c_int,
    /// The module's; not touched here.
    pub module: *const c_void,
    /// Hands one chunk (a payload of one value) to the stream's reader.
    pub send:
        unsafe extern "C" fn(task: *const ngx_tp_task_t, payload: *const u8, len: usize) -> c_int,
    /// Writes the caller's next chunk to `out`.
    pub receive: unsafe extern "C" fn(task: *const ngx_tp_task_t, out: *mut ngx_tp_out_t) -> c_int,
}

/// `ngx_tp_update_t`: what `ngx_threadpool_update` gets.
#[repr(C)]
#[derive(Debug)]
pub struct ngx_tp_update_t {
    /// The update's version, larger than any before it.
    pub version: u64,
    /// The arguments' payload, without borrowed strings.
    pub args: ngx_tp_bytes_t,
}

/// The bytes of `b`.
///
/// # Safety
/// `b` must point to `len` bytes that stay alive and unchanged for `'a`
/// (or have `len` 0).
pub(crate) unsafe fn bytes<'a>(b: ngx_tp_bytes_t) -> &'a [u8] {
    if b.len == 0 {
        return &[];
    }
    // SAFETY: non-empty, so data points to len live bytes (the caller's
    // contract), which nobody writes for 'a.
    unsafe { std::slice::from_raw_parts(b.data, b.len) }
}
