//! No panic may unwind into nginx or out of a pool thread's task loop.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`, turning a panic into its message.
pub fn catch<T>(body: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(body)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into())
    })
}

/// Runs `body` for an entry point nginx or the shim calls: a panic is
/// logged and becomes `fallback`.
pub fn no_unwind<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    catch(body).unwrap_or_else(|msg| {
        super::log::message(
            super::log::NGX_LOG_ALERT,
            format_args!("panic in {what}: {msg}"),
        );
        fallback
    })
}
