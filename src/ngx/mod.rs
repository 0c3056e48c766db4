//! The nginx boundary: generated bindings and small wrappers over nginx's
//! and lua-nginx-module's structures and calls.
//!
//! Where else `unsafe` is, and why: the table in lib.rs's module doc.

pub mod accept;
pub mod bindings;
pub mod conf;
pub mod dl;
pub mod guard;
pub mod http;
pub mod http_locations;
pub mod log;
pub mod lua;
pub mod lua_inject;
pub mod lua_symbols;
pub mod module;
pub mod os;
pub mod palloc;
pub mod shim;
pub mod shm;
pub mod thread_pool;

pub use bindings as sys;

/// The bytes of an `ngx_str_t`.
///
/// # Safety
/// `s.data` must point to `s.len` readable bytes that outlive the result
/// (nginx strings from configuration and pools do).
pub unsafe fn str_bytes<'a>(s: &sys::ngx_str_t) -> &'a [u8] {
    if s.len == 0 || s.data.is_null() {
        &[]
    } else {
        // SAFETY: the caller vouches for data/len.
        unsafe { std::slice::from_raw_parts(s.data, s.len) }
    }
}

/// A static `ngx_str_t` for tables nginx reads. The data stays
/// NUL-terminated: nginx matches directive names with strcmp.
pub const fn ngx_string(s: &'static std::ffi::CStr) -> sys::ngx_str_t {
    sys::ngx_str_t {
        len: s.count_bytes(),
        data: s.as_ptr() as *mut u8,
    }
}
