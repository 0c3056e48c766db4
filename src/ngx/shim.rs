//! What the C functions of the Lua shim (api/functions.rs) work with: the running
//! request and lua-resty-core style out-parameters, made safe to use once,
//! at the entry point.

use super::{lua, sys};
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

/// The request of the running Lua handler. Event-loop thread only.
pub struct Request(NonNull<sys::ngx_http_request_t>);

impl Request {
    /// # Safety
    /// `r` must be null or the request of the Lua handler running now, used
    /// only during the current call from the shim.
    pub unsafe fn from_raw(r: *mut sys::ngx_http_request_t) -> Option<Request> {
        NonNull::new(r).map(Request)
    }

    /// The number of the request's connection.
    pub fn connection_number(&self) -> u64 {
        // SAFETY: the request of the running handler (from_raw).
        unsafe { super::accept::connection_number(self.0.as_ptr()) }
    }

    /// Whether the running Lua handler may wait on a semaphore here.
    pub fn may_yield(&self) -> bool {
        // SAFETY: the request of the running handler (from_raw).
        unsafe { lua::may_yield(self.0.as_ptr()) }
    }

    /// This module's value of type T for the request, created (with
    /// `T::default()`, in the request's pool, dropped with it) on first
    /// use. None when the pool is out of memory.
    ///
    /// # Safety
    /// Every value this module keeps in the request's context slot must be
    /// a T.
    pub unsafe fn module_ctx<T: Default>(&self) -> Option<NonNull<T>> {
        // SAFETY: r->ctx has a slot per http module; ours holds the value
        // allocated in r->pool. An internal redirect resets the slot, which
        // only means a second value: the first is still dropped with the
        // pool.
        unsafe {
            let r = self.0.as_ptr();
            let slot = (*r).ctx.add(super::module::own_ctx_index());
            if let Some(value) = NonNull::new((*slot).cast::<T>()) {
                return Some(value);
            }
            let value = super::palloc::adopt((*r).pool, T::default())?;
            *slot = value.as_ptr().cast::<c_void>();
            Some(value)
        }
    }

    pub fn raw(&self) -> *mut sys::ngx_http_request_t {
        self.0.as_ptr()
    }
}

/// An error message out-parameter: a buffer and its size, which becomes the
/// message's length.
pub struct ErrOut {
    buf: *mut u8,
    len: *mut usize,
}

impl ErrOut {
    /// # Safety
    /// `buf` must hold `*len` writable bytes, or either may be null.
    pub unsafe fn new(buf: *mut u8, len: *mut usize) -> ErrOut {
        ErrOut { buf, len }
    }

    /// Writes `msg`, cut to the buffer's size.
    pub fn set(&self, msg: &str) {
        if self.buf.is_null() || self.len.is_null() {
            return;
        }
        // SAFETY: buf holds *len writable bytes (new).
        unsafe {
            let n = msg.len().min(*self.len);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), self.buf, n);
            *self.len = n;
        }
    }

    pub fn raw(&self) -> (*mut u8, *mut usize) {
        (self.buf, self.len)
    }
}

/// `len` bytes at `data` (an empty slice for a null pointer).
///
/// # Safety
/// `data` must be null or point to `len` readable bytes that stay put for
/// `'a`.
pub unsafe fn bytes<'a>(data: *const u8, len: usize) -> &'a [u8] {
    if data.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: data is non-null (checked above) and points to `len` readable
    // bytes that stay put for 'a (the contract).
    unsafe { std::slice::from_raw_parts(data, len) }
}

/// Waits on `sema` in the current coroutine of `r`: NGX_OK when a resource
/// was there, NGX_AGAIN after queueing the coroutine (the caller must
/// yield), NGX_ERROR with a message in `err` (wrong context).
pub fn wait(sema: &lua::Sema, r: &Request, ms: c_int, err: &ErrOut) -> c_int {
    let (buf, len) = err.raw();
    // SAFETY: r is the running handler's request and err a valid
    // out-parameter (their constructors); the semaphore is live.
    unsafe { sema.wait(r.raw(), ms, buf, len) }
}
