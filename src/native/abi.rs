//! The C side of handler/include/ngx_threadpool.h, generated from it by
//! bindgen (build.rs): its structs, its exports' function types, its
//! constants. The header's numbers that the handler crate shares
//! (ngx_threadpool_wire) are checked against it here, when this compiles.

#![allow(non_camel_case_types)]

use crate::codec::Span;
use ngx_threadpool_wire as wire;
use std::mem::{align_of, offset_of, size_of};

include!(concat!(env!("OUT_DIR"), "/handler_abi.rs"));

/// The function a bindgen'd function type holds: bindgen gives C's
/// function types as `Option<fn>`, null being `None`; a looked-up export
/// is never null, so the library keeps the function itself.
pub trait Function {
    type Fn;
}

impl<F> Function for Option<F> {
    type Fn = F;
}

pub type AbiVersionFn = <ngx_threadpool_abi_version_t as Function>::Fn;
pub type InitFn = <ngx_threadpool_init_t as Function>::Fn;
pub type ProcessFn = <ngx_threadpool_process_t as Function>::Fn;
pub type FreeFn = <ngx_threadpool_free_t as Function>::Fn;
pub type UpdateFn = <ngx_threadpool_update_t as Function>::Fn;

/// NGX_TP_OK and NGX_TP_ERROR, as init, process and update return them.
pub const OK: i32 = NGX_TP_OK as i32;
pub const ERROR: i32 = NGX_TP_ERROR as i32;
/// NGX_TP_CANCELLED, NGX_TP_END, NGX_TP_NO_STREAM (a task's send and
/// receive).
pub const CANCELLED: i32 = NGX_TP_CANCELLED as i32;
pub const END: i32 = NGX_TP_END as i32;
pub const NO_STREAM: i32 = NGX_TP_NO_STREAM as i32;

// The header and the crate that handlers are written with say the same.
const _: () = {
    assert!(NGX_THREADPOOL_ABI_VERSION == wire::ABI_VERSION);
    assert!(NGX_TP_MAX_VALUES as usize == wire::MAX_VALUES);
    assert!(NGX_TP_MAX_DEPTH as usize == wire::MAX_DEPTH);
    assert!(NGX_TP_EXT_BORROWED as i8 == wire::EXT_BORROWED);
    assert!(OK == wire::status::OK && ERROR == wire::status::ERROR);
    assert!(CANCELLED == wire::status::CANCELLED && END == wire::status::END);
    assert!(NO_STREAM == wire::status::NO_STREAM);
    assert!(NGX_TP_LOG_ERR as i32 == wire::level::ERR);
    assert!(NGX_TP_LOG_WARN as i32 == wire::level::WARN);
    assert!(NGX_TP_LOG_NOTICE as i32 == wire::level::NOTICE);
    assert!(NGX_TP_LOG_INFO as i32 == wire::level::INFO);
    assert!(NGX_TP_LOG_DEBUG as i32 == wire::level::DEBUG);
};

// A task's spans are the codec's, handed over as they are.
const _: () = assert!(
    size_of::<Span>() == size_of::<ngx_tp_bytes_t>()
        && align_of::<Span>() == align_of::<ngx_tp_bytes_t>()
        && offset_of!(Span, data) == offset_of!(ngx_tp_bytes_t, data)
        && offset_of!(Span, len) == offset_of!(ngx_tp_bytes_t, len)
);

/// The header's view of bytes the module owns.
pub fn bytes(b: &[u8]) -> ngx_tp_bytes_t {
    ngx_tp_bytes_t {
        data: b.as_ptr(),
        len: b.len(),
    }
}
