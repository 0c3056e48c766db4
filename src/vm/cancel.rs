//! Cooperative cancellation: a task's flag that its caller gave up, and
//! how the handler running the task reads it.
//!
//! The event loop sets the flag when the caller lets go of a task that has
//! not finished (timeout, request gone, its batch timed out:
//! worker/tasks.rs). A task no thread took yet is then skipped; a running
//! one cannot be interrupted, but its handler may look and stop early.
//! `Cancel::is_cancelled` is the one place the flag is read, whatever the
//! handler's kind: a pool thread marks the task it runs (`running`), and a
//! Lua handler reads that mark through `ngx_threadpool_task_cancelled`
//! (cancel.lua: `require("resty.threadpool").cancelled()`).

use mlua::Lua;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the caller of a task gave up on it. Relaxed: it only decides
/// whether work is wasted, never what is read; a handler sees it at its
/// next look, which on x86 is the next load after the store.
#[derive(Default)]
pub struct Cancel(AtomicBool);

impl Cancel {
    /// The caller gave up (event loop).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

thread_local! {
    /// The flag of the task this thread runs now (null between tasks and
    /// on the event loop). Points into the task's Work, which the thread
    /// holds for as long as the mark is set (`running`).
    static RUNNING: Cell<*const Cancel> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` (one task's handler) with `cancel` as this thread's running
/// task's flag; the mark is cleared when `f` returns or unwinds.
pub fn running<R>(cancel: &Cancel, f: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            RUNNING.set(std::ptr::null());
        }
    }
    RUNNING.set(cancel);
    let _clear = Clear;
    f()
}

/// Whether the caller of the task this thread runs gave up: false between
/// tasks, outside pool threads, and on the event loop. Called by handlers
/// through the FFI, possibly in an inner loop: a thread-local read and a
/// load.
#[no_mangle]
pub extern "C" fn ngx_threadpool_task_cancelled() -> bool {
    let running = RUNNING.get();
    // SAFETY: a non-null mark points to the flag of the task this thread
    // runs, whose Work the thread holds until `running` clears the mark.
    !running.is_null() && unsafe { &*running }.is_cancelled()
}

/// Makes `require "resty.threadpool"` in a pool thread give the thread's
/// side of the library (cancel.lua) rather than the event loop's, whose
/// pools a thread cannot push to.
pub fn install(lua: &Lua) -> mlua::Result<()> {
    let module: mlua::Value = lua
        .load(include_str!("cancel.lua"))
        .set_name("=ngx_threadpool.threadpool")
        .call(())?;
    let preload: mlua::Table = lua
        .globals()
        .get::<mlua::Table>("package")?
        .get("preload")?;
    let loader = lua.create_function(move |_, ()| Ok(module.clone()))?;
    preload.set("resty.threadpool", loader)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_follows_the_running_task() {
        let (a, b) = (Cancel::default(), Cancel::default());
        assert!(!ngx_threadpool_task_cancelled());
        b.cancel();
        running(&a, || assert!(!ngx_threadpool_task_cancelled()));
        running(&b, || assert!(ngx_threadpool_task_cancelled()));
        let unwound = std::panic::catch_unwind(|| running(&b, || panic!("handler")));
        assert!(unwound.is_err());
        assert!(!ngx_threadpool_task_cancelled());
    }
}
