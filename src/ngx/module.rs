//! Constant builders for the tables nginx reads: commands and the module.

use super::sys::{self, ngx_command_t, ngx_module_t, ngx_str_t};
use std::ffi::{c_char, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// This module's record, registered by lib.rs when nginx first calls into
/// it, so that code below lib.rs can find its configuration and request
/// context slots without reaching up to the crate root.
static OWN: AtomicPtr<ngx_module_t> = AtomicPtr::new(ptr::null_mut());

/// Registers this module's record (lib.rs, at create_main_conf).
pub fn register_own(module: *mut ngx_module_t) {
    OWN.store(module, Ordering::Release);
}

/// This module's record (null before registration).
pub fn own() -> *const ngx_module_t {
    OWN.load(Ordering::Acquire)
}

/// This module's index among the http modules' context slots.
pub fn own_ctx_index() -> usize {
    // SAFETY: a registered record is the module's static, set up by nginx
    // (ctx_index) before it calls create_main_conf.
    unsafe { own().as_ref().map_or(usize::MAX, |m| m.ctx_index) }
}

/// A directive's setter, as nginx calls it.
pub type Setter = unsafe extern "C" fn(
    cf: *mut sys::ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char;

/// One directive; `post` carries data for a setter shared by several names.
pub const fn command(name: ngx_str_t, type_: u32, set: Setter, post: usize) -> ngx_command_t {
    ngx_command_t {
        name,
        type_: type_ as usize,
        set: Some(set),
        conf: sys::NGX_RS_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: post as *mut c_void,
    }
}

/// The terminator of a command table.
pub const NULL_COMMAND: ngx_command_t = ngx_command_t {
    name: ngx_str_t {
        len: 0,
        data: ptr::null_mut(),
    },
    type_: 0,
    set: None,
    conf: 0,
    offset: 0,
    post: ptr::null_mut(),
};

/// A module record with nginx's version and the signature of the configured
/// build, so nginx refuses to load a module built for another binary.
pub const fn module(ctx: *mut c_void, commands: *mut ngx_command_t, type_: u32) -> ngx_module_t {
    ngx_module_t {
        ctx_index: usize::MAX,
        index: usize::MAX,
        name: ptr::null_mut(),
        spare0: 0,
        spare1: 0,
        version: sys::nginx_version as usize,
        signature: sys::NGX_RS_MODULE_SIGNATURE.as_ptr() as *const c_char,
        ctx,
        commands,
        type_: type_ as usize,
        init_master: None,
        init_module: None,
        init_process: None,
        init_thread: None,
        exit_thread: None,
        exit_process: None,
        exit_master: None,
        spare_hook0: 0,
        spare_hook1: 0,
        spare_hook2: 0,
        spare_hook3: 0,
        spare_hook4: 0,
        spare_hook5: 0,
        spare_hook6: 0,
        spare_hook7: 0,
    }
}
