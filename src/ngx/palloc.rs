//! Rust values owned by an nginx memory pool: dropped when the pool is
//! destroyed (a cycle's pool at reload, a request's pool at its end).

use super::sys;
use std::ffi::c_void;
use std::ptr::NonNull;

/// Moves `value` to the heap and registers a cleanup on `pool` that drops
/// it; returns a pointer valid until the pool is destroyed.
///
/// # Safety
/// `pool` must be a live nginx pool, used from the thread that owns it.
pub unsafe fn adopt<T>(pool: *mut sys::ngx_pool_t, value: T) -> Option<NonNull<T>> {
    // SAFETY: the caller vouches for pool.
    let cln = unsafe { sys::ngx_pool_cleanup_add(pool, 0) };
    if cln.is_null() {
        return None;
    }
    let raw = Box::into_raw(Box::new(value));
    // SAFETY: cln was just returned by nginx and is ours to fill.
    unsafe {
        (*cln).handler = Some(drop_boxed::<T>);
        (*cln).data = raw.cast();
    }
    NonNull::new(raw)
}

unsafe extern "C" fn drop_boxed<T>(data: *mut c_void) {
    super::guard::no_unwind("pool cleanup", (), || {
        // SAFETY: data is the Box::into_raw of adopt::<T>, run once by nginx.
        drop(unsafe { Box::from_raw(data.cast::<T>()) });
    })
}
