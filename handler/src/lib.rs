#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod de;
mod export;
pub mod ffi;
mod init;
mod logger;
mod results;
mod ser;
mod task;

#[cfg(test)]
mod tests;

pub use init::Init;
pub use results::{IntoResults, ValueList, Values};
pub use serde_bytes;
pub use task::{ArgError, StreamError, Task};

/// An error of any type, for `process` and `init` to return with `?`
/// ([`ArgError`], I/O errors, `String`s through `.into()`...): the caller
/// gets its text.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The version of the ABI (`include/ngx_threadpool.h`'s
/// `NGX_THREADPOOL_ABI_VERSION`) this crate implements: what
/// `ngx_threadpool_abi_version` returns. The module refuses a library
/// built for a version it does not know (it loads 1 and 2; 2 added
/// streams: [`Task::send`], [`Task::receive`]).
pub const ABI_VERSION: u32 = 2;

/// Generates the four exports of a handler library from an `init` and a
/// `process` function; once per library, at the crate's top level.
///
/// ```text
/// fn init(init: &Init) -> Result<S, E>
/// fn process(state: &mut S, task: &Task) -> Result<R, E2>
/// ```
///
/// * `S` is the per-thread state: `init` runs on each pool thread before
///   its first task, and `process` gets that thread's state. It need not
///   be `Send` or `Sync`: it never leaves its thread. It is dropped when
///   the thread exits (worker exit, reload).
/// * `R` is the results: any `Serialize` value, or [`Values`] for several
///   (see [`IntoResults`]). It may borrow from the task's arguments.
/// * `E` and `E2` are any `Display` type (`String`, `ArgError`,
///   [`Error`]...): an `Err` from `process` becomes `nil, e` for the
///   caller; an `Err` from `init` makes the pool unusable, and its tasks
///   get `nil` and the text.
/// * A panic in either is caught: the task's caller gets
///   `nil, "panic: <message>"` (the thread keeps serving, with the state
///   as the panic left it); in `init`, the text is `init`'s error.
///
/// The generated functions are `ngx_threadpool_abi_version`,
/// `ngx_threadpool_init`, `ngx_threadpool_process` and
/// `ngx_threadpool_free`, with the prototypes of
/// `include/ngx_threadpool.h`.
#[macro_export]
macro_rules! export {
    ($init:expr, $process:expr $(,)?) => {
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
            init: *const $crate::ffi::ngx_tp_init_t,
            state: *mut *mut ::std::ffi::c_void,
            err: *mut $crate::ffi::ngx_tp_out_t,
        ) -> ::std::ffi::c_int {
            let f = $init;
            // SAFETY: the module keeps the header's contract.
            unsafe { $crate::__private::init(init, state, err, f) }
        }

        /// Runs one task on this thread's state.
        ///
        /// # Safety
        /// Called by the ngx_threadpool module as `ngx_threadpool.h` says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn ngx_threadpool_process(
            state: *mut ::std::ffi::c_void,
            task: *const $crate::ffi::ngx_tp_task_t,
            out: *mut $crate::ffi::ngx_tp_out_t,
        ) -> ::std::ffi::c_int {
            let (init, process) = ($init, $process);
            // SAFETY: the module keeps the header's contract.
            unsafe {
                $crate::__private::process(state, task, out, init, |state, task, reply| {
                    reply.set(process(state, task))
                })
            }
        }

        /// Frees this thread's state.
        ///
        /// # Safety
        /// Called by the ngx_threadpool module as `ngx_threadpool.h` says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn ngx_threadpool_free(state: *mut ::std::ffi::c_void) {
            let init = $init;
            // SAFETY: the module keeps the header's contract.
            unsafe { $crate::__private::free(state, init) }
        }
    };
}

/// For [`export!`] only: not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{free, init, process, Reply};
}
