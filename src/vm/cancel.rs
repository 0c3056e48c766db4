//! Cooperative cancellation, a Lua handler's side: the pool thread marks
//! the task its state runs (`running`), and the handler reads that mark
//! through `ngx_threadpool_task_cancelled` (cancel.lua:
//! `require("resty.threadpool").cancelled()`). The flag is run::Cancel.

use crate::handoff::outcome::Cancel;
use mlua::Lua;
use std::cell::Cell;

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
