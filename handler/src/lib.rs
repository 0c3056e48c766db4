#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod args;
mod de;
mod export;
/// The header's types, for [`export!`]'s functions to name; not part of
/// the API.
#[doc(hidden)]
pub mod ffi;
mod handler;
mod init;
mod logger;
mod results;
mod ser;
mod task;
mod update;

#[cfg(test)]
mod tests;

pub use args::ArgError;
pub use handler::Handler;
pub use init::Init;
pub use results::{IntoResults, ValueList, Values};
pub use serde_bytes;
pub use task::{StreamError, Task};
pub use update::Update;

/// An error of any type, for [`Handler::process`], [`Handler::init`] and
/// [`Handler::update`] to return with `?` ([`ArgError`], I/O errors, `String`s and `&str`s
/// through `.into()`...): the caller gets its text.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The version of the C ABI (`include/ngx_threadpool.h`'s
/// `NGX_THREADPOOL_ABI_VERSION`) this crate implements: what
/// `ngx_threadpool_abi_version` returns. The module refuses a library
/// built for a version it does not know (it loads 1 and 2; 2 added
/// streams: [`Task::send`], [`Task::receive`]).
pub const ABI_VERSION: u32 = ngx_threadpool_wire::ABI_VERSION;

/// Makes a [`Handler`] the library's C exports; once per library, at the
/// crate's top level: `export!(MyHandler);`.
///
/// The generated functions are `ngx_threadpool_abi_version`,
/// `ngx_threadpool_init`, `ngx_threadpool_process`,
/// `ngx_threadpool_update` (calling [`Handler::update`], which by default
/// refuses) and `ngx_threadpool_free`, with the prototypes of
/// `include/ngx_threadpool.h`; the library exports them when built as a
/// `cdylib`. A type that is not a [`Handler`] is the compiler's error
/// ``the trait bound `T: Handler` is not satisfied`` (E0277):
///
/// ```compile_fail,E0277
/// struct NotAHandler;
///
/// ngx_threadpool_handler::export!(NotAHandler);
/// ```
#[macro_export]
macro_rules! export {
    ($handler:ty $(,)?) => {
        /// The ABI version this library was built for.
        #[unsafe(no_mangle)]
        pub extern "C" fn ngx_threadpool_abi_version() -> u32 {
            $crate::ABI_VERSION
        }

        /// Builds this thread's handler state.
        ///
        /// # Safety
        /// Called by the ngx_threadpool module as `ngx_threadpool.h` says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn ngx_threadpool_init(
            init: *const $crate::__private::ffi::ngx_tp_init_t,
            state: *mut *mut ::std::ffi::c_void,
            err: *mut $crate::__private::ffi::ngx_tp_out_t,
        ) -> ::std::ffi::c_int {
            // SAFETY: the module calls this export as the header says,
            // which is init's contract.
            unsafe { $crate::__private::init::<$handler>(init, state, err) }
        }

        /// Runs one task on this thread's state.
        ///
        /// # Safety
        /// Called by the ngx_threadpool module as `ngx_threadpool.h` says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn ngx_threadpool_process(
            state: *mut ::std::ffi::c_void,
            task: *const $crate::__private::ffi::ngx_tp_task_t,
            out: *mut $crate::__private::ffi::ngx_tp_out_t,
        ) -> ::std::ffi::c_int {
            // SAFETY: the module calls this export as the header says, with
            // a state that ngx_threadpool_init, above, built for this
            // handler type: process's contract.
            unsafe { $crate::__private::process::<$handler>(state, task, out) }
        }

        /// Applies a live update to this thread's handler state.
        ///
        /// # Safety
        /// Called by the ngx_threadpool module as `ngx_threadpool.h` says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn ngx_threadpool_update(
            state: *mut ::std::ffi::c_void,
            update: *const $crate::__private::ffi::ngx_tp_update_t,
            err: *mut $crate::__private::ffi::ngx_tp_out_t,
        ) -> ::std::ffi::c_int {
            // SAFETY: the module calls this export as the header says, with
            // a state that ngx_threadpool_init, above, built for this
            // handler type: update's contract.
            unsafe { $crate::__private::update::<$handler>(state, update, err) }
        }

        /// Frees this thread's state.
        ///
        /// # Safety
        /// Called by the ngx_threadpool module as `ngx_threadpool.h` says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn ngx_threadpool_free(state: *mut ::std::ffi::c_void) {
            // SAFETY: the module frees, once, a state that
            // ngx_threadpool_init, above, built for this handler type:
            // free's contract.
            unsafe { $crate::__private::free::<$handler>(state) }
        }
    };
}

/// For [`export!`] only: not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{free, init, process, update};
    pub use crate::ffi;
}
