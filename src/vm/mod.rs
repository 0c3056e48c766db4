//! A pool thread's Lua state: built once when the thread starts, then fed
//! one task at a time.
//!
//! The state is built in two steps. First, with its collector stopped, the
//! module's own code sets it up through mlua (libraries, package paths,
//! the `ngx` table, finalizers that never raise: finalizers.lua): no user
//! code has run, so no finalizer exists. Then the
//! collector starts for good, and from there on every call into the state
//! is one protected call of a C function (lua/call.rs, task.rs): the init
//! chunk, the handler, each task, letting go of pinned strings, a full
//! collection. A finalizer may run anywhere, as on the event loop, and its
//! error stops at that call's boundary.

pub mod cancel;
pub mod chunk;
mod ngx_re;
mod ngx_table;
mod task;

pub use ngx_re::{Pcre, RegexEnv, DEFAULT_REGEX_MAX_ERR_LEN};
pub use ngx_table::NgxEnv;

use crate::codec::{self, CodecError, Span};
use crate::handoff::outcome::{Cancel, Outcome, PinKey, Ran};
use crate::luajit::call::{CFunction, Status};
use crate::ngx::log::Log;
use chunk::{error_text, Chunk, Style};
use mlua::ffi::{self, lua_State};
use mlua::Lua;
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use task::{Apply, Refs, Setup, Task, Unpin};

/// The error of an update to a Lua pool without an update chunk.
pub const NO_UPDATE_CHUNK: &str =
    "it has no thread_pool_update_by_lua* to apply an update's arguments";

/// What a thread needs to build its Lua state; cloned into every thread.
#[derive(Clone)]
pub struct Spec {
    pub init: Option<Chunk>,
    pub process: Chunk,
    pub style: Style,
    /// `thread_pool_update_by_lua*`: run with each update's arguments.
    pub update: Option<Chunk>,
    pub package_path: Option<Vec<u8>>,
    pub package_cpath: Option<Vec<u8>>,
    pub ngx: NgxEnv,
}

/// The C functions a state's protected calls run.
struct Calls {
    run: CFunction,
    update: CFunction,
    unpin: CFunction,
    collect: CFunction,
}

pub struct ThreadVm {
    /// Result strings the event loop reads in place: the keys of pins[] in
    /// the state (let go of before the state is closed).
    pinned: RefCell<HashSet<PinKey>>,
    zero_copy: Option<usize>,
    /// The state's main thread; only this pool thread uses it.
    l: *mut lua_State,
    refs: Refs,
    calls: Calls,
    /// Dropped after `lua` (fields drop in this order): the state closes
    /// with its allocator.
    _lua: Lua,
    allocator: crate::luajit::Allocator,
}

static NEXT_PIN: AtomicU64 = AtomicU64::new(1);

impl ThreadVm {
    /// Builds the state: standard libraries (with ffi and jit), package
    /// paths, the `ngx` table (logging as `pool` to `log`), the init
    /// chunk, then the handler. Result strings of at least `zero_copy`
    /// bytes are borrowed by the event loop (None: copied).
    pub fn new(
        spec: &Spec,
        pool: &str,
        log: Option<Log>,
        zero_copy: Option<usize>,
    ) -> Result<ThreadVm, String> {
        let (lua, allocator) = crate::luajit::new_thread_state().map_err(|e| error_text(&e))?;
        let built = build(&lua, spec, pool, log);
        match built {
            Ok((l, refs, calls)) => Ok(ThreadVm {
                pinned: RefCell::default(),
                zero_copy,
                l,
                refs,
                calls,
                _lua: lua,
                allocator,
            }),
            Err(e) => {
                // the state first, with its allocator (see ThreadVm)
                drop(lua);
                drop(allocator);
                Err(e)
            }
        }
    }

    /// Runs one task with the encoded arguments `args` (borrowing
    /// `spans`): its results, or its error value, go to `out` and
    /// `out_spans`. With borrowed results, the key under which their
    /// strings stay pinned until `unpin`. The handler sees `cancel` through
    /// `require("resty.threadpool").cancelled()` (cancel.rs).
    ///
    /// # Safety
    /// The bytes of `spans` must be alive until this returns (the shim
    /// anchors them until the completion).
    pub unsafe fn run(
        &self,
        args: &[u8],
        spans: &[Span],
        out: &mut Vec<u8>,
        out_spans: &mut Vec<Span>,
        cancel: &Cancel,
    ) -> Ran {
        let key = NEXT_PIN.fetch_add(1, Ordering::Relaxed);
        let mut t = Task {
            refs: self.refs,
            args,
            spans,
            borrow: self.zero_copy,
            pin: key as f64,
            out,
            out_spans,
            outcome: Outcome::Done,
            pinned: false,
            drained: (0, None),
        };
        // SAFETY: l is this thread's state; t is what task::run expects
        // and outlives the call; the spans are alive (our contract).
        let status = cancel::running(cancel, || unsafe {
            self.calls.run.call(self.l, (&raw mut t).cast::<c_void>())
        });
        match status {
            Status::Ok => {}
            // Raised outside the handler: building its arguments or
            // pinning its results ran out of memory, or ran a finalizer
            // that failed.
            Status::OutOfMemory => t.fail(CodecError::OutOfMemory),
            Status::Error(msg) => t.fail(CodecError::Value(msg)),
        }
        if self.allocator.spent() {
            // Whatever the handler made of its memory error, the state
            // holds the memory and is to be closed: so are the results
            // it may have pinned in it.
            t.fail(CodecError::OutOfMemory);
        }
        let pin = (t.pinned && t.outcome == Outcome::Done).then(|| {
            self.pinned.borrow_mut().insert(key);
            key
        });
        Ran {
            outcome: t.outcome,
            pin,
            drained: t.drained,
        }
    }

    /// Whether the state has an update chunk.
    pub fn takes_updates(&self) -> bool {
        self.refs.update != 0
    }

    /// Runs the update chunk with the encoded arguments `args`: its error,
    /// if it raised one (or there is no update chunk).
    pub fn update(&self, args: &[u8]) -> Result<(), String> {
        if self.refs.update == 0 {
            return Err(NO_UPDATE_CHUNK.into());
        }
        let mut a = Apply {
            refs: self.refs,
            args,
            error: None,
        };
        // SAFETY: l is this thread's state; a is what task::update expects
        // and outlives the call.
        let status = unsafe {
            self.calls
                .update
                .call(self.l, (&raw mut a).cast::<c_void>())
        };
        match status {
            Status::Ok => a.error.map_or(Ok(()), Err),
            Status::OutOfMemory => Err(codec::NOT_ENOUGH_MEMORY.into()),
            Status::Error(msg) => Err(msg),
        }
    }

    /// Lets go of the result strings pinned under `key`; false if this
    /// state holds none under it.
    pub fn unpin(&self, key: PinKey) -> bool {
        if !self.pinned.borrow_mut().remove(&key) {
            return false;
        }
        let keys = [key as f64];
        let mut u = Unpin {
            pins: self.refs.pins,
            keys: &keys,
        };
        // SAFETY: l is this thread's state and u what task::unpin expects.
        // Out of memory cannot happen (nothing allocates); were it to fail,
        // the strings would only stay until the state is closed.
        let _ = unsafe { self.calls.unpin.call(self.l, (&raw mut u).cast::<c_void>()) };
        true
    }

    /// Whether some result strings of this state are still read in place.
    pub fn has_pins(&self) -> bool {
        !self.pinned.borrow().is_empty()
    }

    /// A full collection, when the thread goes idle after large payloads:
    /// the error of a finalizer it runs, if any.
    pub fn collect_garbage(&self) -> Result<(), String> {
        // SAFETY: l is this thread's state; collect takes no context.
        match unsafe { self.calls.collect.call(self.l, std::ptr::null_mut()) } {
            Status::Ok => Ok(()),
            Status::OutOfMemory => Err(codec::NOT_ENOUGH_MEMORY.into()),
            Status::Error(msg) => Err(msg),
        }
    }
}

/// Sets the state up (see the module comment): its main thread, the
/// handler's references and the C functions of its protected calls.
fn build(
    lua: &Lua,
    spec: &Spec,
    pool: &str,
    log: Option<Log>,
) -> Result<(*mut lua_State, Refs, Calls), String> {
    let package: mlua::Table = lua.globals().get("package").map_err(|e| error_text(&e))?;
    for (key, value) in [("path", &spec.package_path), ("cpath", &spec.package_cpath)] {
        if let Some(v) = value {
            let s = lua.create_string(v).map_err(|e| error_text(&e))?;
            package.set(key, s).map_err(|e| error_text(&e))?;
        }
    }
    ngx_table::install(lua, pool, log, &spec.ngx).map_err(|e| error_text(&e))?;
    cancel::install(lua).map_err(|e| error_text(&e))?;
    let ngx: mlua::Table = lua.globals().get("ngx").map_err(|e| error_text(&e))?;
    let log: mlua::Function = ngx.get("log").map_err(|e| error_text(&e))?;
    let warn: mlua::Value = ngx.get("WARN").map_err(|e| error_text(&e))?;
    lua.load(include_str!("finalizers.lua"))
        .set_name("=ngx_threadpool.finalizers")
        .call::<()>((log, warn))
        .map_err(|e| error_text(&e))?;
    let mut l = std::ptr::null_mut();
    // SAFETY: exec_raw hands over the state's main thread, which this
    // pool thread alone uses.
    unsafe { lua.exec_raw::<()>((), |state| l = state) }.map_err(|e| error_text(&e))?;
    // SAFETY: l is the state, its collector still stopped (new_thread_state)
    // while the functions are made; then it runs for good, and every later
    // call into the state is a protected CFunction::call.
    let (setup, calls) = unsafe {
        let setup = CFunction::new(l, task::setup);
        let calls = Calls {
            run: CFunction::new(l, task::run),
            update: CFunction::new(l, task::update),
            unpin: CFunction::new(l, task::unpin),
            collect: CFunction::new(l, task::collect),
        };
        ffi::lua_gc(l, ffi::LUA_GCRESTART, 0);
        (setup, calls)
    };
    let mut s = Setup {
        init: spec.init.as_ref(),
        process: &spec.process,
        update: spec.update.as_ref(),
        style: spec.style,
        refs: Refs::default(),
        error: None,
    };
    // SAFETY: l is this thread's state and setup was made in it; it has two
    // free slots (nothing is on its stack), and s is the Setup task::setup
    // expects, alive across the call.
    match unsafe { setup.call(l, (&raw mut s).cast::<c_void>()) } {
        Status::Ok => {}
        Status::OutOfMemory => return Err(codec::NOT_ENOUGH_MEMORY.into()),
        Status::Error(msg) => return Err(msg),
    }
    match s.error {
        Some(e) => Err(e),
        None => Ok((l, s.refs, calls)),
    }
}
