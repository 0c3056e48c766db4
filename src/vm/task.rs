//! What runs inside a pool thread's protected calls (lua/call.rs): the
//! state's setup once its collector runs, one task, an update, letting go
//! of pinned result strings, and a full collection. Each is a C function called with
//! its context as a light userdata; whatever Lua raises in it (out of
//! memory, a finalizer's error) stops at the call's boundary, and the
//! Rust frames between own nothing but what the context owns.

use super::chunk::{Chunk, Style};
use crate::codec::{self, Borrow, CodecError, Source, Span};
use crate::handoff::outcome::Outcome;
use crate::luajit::call::{argument, plain_text};
use mlua::ffi::{self, lua_State};
use std::ffi::{c_int, CString};

/// The registry references of what a task needs.
#[derive(Clone, Copy, Default)]
pub struct Refs {
    pub handler: c_int,
    /// A C function that runs one collector step (see `drain`).
    pub step: c_int,
    /// Result strings the event loop reads in place, by pin key.
    pub pins: c_int,
    /// `tostring` as the state started, for error values.
    pub tostring: c_int,
    /// The update chunk (0: none).
    pub update: c_int,
}

/// The setup: the init chunk, then the handler, per `style`, and the
/// update chunk.
pub struct Setup<'a> {
    pub init: Option<&'a Chunk>,
    pub process: &'a Chunk,
    pub update: Option<&'a Chunk>,
    pub style: Style,
    pub refs: Refs,
    pub error: Option<String>,
}

pub unsafe extern "C-unwind" fn setup(l: *mut lua_State) -> c_int {
    // SAFETY: called by CFunction::call with a Setup (ThreadVm::new).
    let s = unsafe { &mut *argument::<Setup>(l) };
    // SAFETY: l is this thread's state inside a protected call; a C
    // function has LUA_MINSTACK free slots, and each step pops what it
    // pushed but the references it keeps.
    unsafe {
        ffi::lua_getfield_(l, ffi::LUA_GLOBALSINDEX, c"tostring".as_ptr());
        s.refs.tostring = ffi::luaL_ref(l, ffi::LUA_REGISTRYINDEX);
        ffi::lua_createtable(l, 0, 0);
        s.refs.pins = ffi::luaL_ref(l, ffi::LUA_REGISTRYINDEX);
        ffi::lua_pushcfunction(l, step);
        s.refs.step = ffi::luaL_ref(l, ffi::LUA_REGISTRYINDEX);
        if let Some(init) = s.init {
            if let Err(e) = load(l, init) {
                s.error = Some(e);
                return 0;
            }
            if ffi::lua_pcall(l, 0, 0, 0) != ffi::LUA_OK {
                s.error = Some(format!("init: {}", error_text(l, s.refs.tostring)));
                return 0;
            }
        }
        if let Err(e) = load(l, s.process) {
            s.error = Some(e);
            return 0;
        }
        if s.style == Style::Factory {
            if ffi::lua_pcall(l, 0, 1, 0) != ffi::LUA_OK {
                s.error = Some(error_text(l, s.refs.tostring));
                return 0;
            }
            let t = ffi::lua_type(l, -1);
            if t != ffi::LUA_TFUNCTION {
                s.error = Some(format!(
                    "process chunk {} does not use ... and returned {} instead of a function",
                    s.process.name.trim_start_matches(['=', '@']),
                    codec::lua_type_name(t)
                ));
                return 0;
            }
        }
        s.refs.handler = ffi::luaL_ref(l, ffi::LUA_REGISTRYINDEX);
        if let Some(update) = s.update {
            if let Err(e) = load(l, update) {
                s.error = Some(e);
                return 0;
            }
            s.refs.update = ffi::luaL_ref(l, ffi::LUA_REGISTRYINDEX);
        }
    }
    0
}

/// An update applied: the update chunk run with its arguments.
pub struct Apply<'a> {
    pub refs: Refs,
    pub args: &'a [u8],
    pub error: Option<String>,
}

pub unsafe extern "C-unwind" fn update(l: *mut lua_State) -> c_int {
    // SAFETY: called by CFunction::call with an Apply (ThreadVm::update).
    let a = unsafe { &mut *argument::<Apply>(l) };
    // SAFETY: l is this thread's state inside a protected call; the chunk
    // and its values go above the light userdata (index 1), push_values
    // reserves the slots it needs; update arguments borrow nothing.
    unsafe {
        ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, a.refs.update);
        let n = match codec::push_values(l, a.args, &[]) {
            Ok(n) => n,
            Err(e) => {
                a.error = Some(e.to_string());
                return 0;
            }
        };
        match ffi::lua_pcall(l, n as c_int, 0, 0) {
            ffi::LUA_OK => {}
            ffi::LUA_ERRMEM => a.error = Some(codec::NOT_ENOUGH_MEMORY.into()),
            _ => a.error = Some(error_text(l, a.refs.tostring)),
        }
        ffi::lua_settop(l, 1);
    }
    0
}

/// Pushes the compiled chunk, or its syntax error's text.
///
/// # Safety
/// Inside a protected call on `l`.
unsafe fn load(l: *mut lua_State, chunk: &Chunk) -> Result<(), String> {
    let name = CString::new(chunk.name.replace('\0', "")).unwrap_or_default();
    // SAFETY: this runs inside a protected call on l (the contract), so
    // luaL_loadbuffer's allocations may raise; the code and name outlive the
    // call.
    unsafe {
        let code = &chunk.code;
        if ffi::luaL_loadbuffer(l, code.as_ptr().cast(), code.len(), name.as_ptr()) != ffi::LUA_OK {
            return Err(plain_text(l, -1));
        }
    }
    Ok(())
}

/// The text of the error value on top, as `tostring` gives it (protected:
/// a `__tostring` may fail), else by its type; pops it.
///
/// # Safety
/// Inside a protected call on `l`, with the value on top.
unsafe fn error_text(l: *mut lua_State, tostring: c_int) -> String {
    // SAFETY: this runs inside a protected call on l with the value on top
    // (the contract); two slots were freed by the call that left the value
    // (its function and arguments).
    unsafe {
        let v = ffi::lua_gettop(l);
        let t = ffi::lua_type(l, v);
        let text = if t == ffi::LUA_TSTRING || t == ffi::LUA_TNUMBER {
            plain_text(l, v)
        } else {
            ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, tostring);
            ffi::lua_pushvalue(l, v);
            let ok = ffi::lua_pcall(l, 1, 1, 0) == ffi::LUA_OK
                && ffi::lua_type(l, -1) == ffi::LUA_TSTRING;
            let s = if ok { plain_text(l, -1) } else { String::new() };
            if s.is_empty() {
                format!("error object is a {}", codec::lua_type_name(t))
            } else {
                s
            }
        };
        ffi::lua_settop(l, v - 1);
        text
    }
}

/// One task: its arguments in, its results (or error value) out.
pub struct Task<'a> {
    pub refs: Refs,
    pub args: &'a [u8],
    pub spans: &'a [Span],
    pub borrow: Option<usize>,
    /// The key under which borrowed results are pinned (pins[key]).
    pub pin: f64,
    pub out: &'a mut Vec<u8>,
    pub out_spans: &'a mut Vec<Span>,
    pub outcome: Outcome,
    /// Whether result strings are pinned under `pin`.
    pub pinned: bool,
    /// Finalizers that failed after the handler did (see `drain`): how
    /// many, and the first one's error.
    pub drained: (u32, Option<String>),
}

impl Task<'_> {
    /// The task failed with `e` (out of memory included: then without
    /// allocating, in the room its result buffer was given beforehand).
    pub(super) fn fail(&mut self, e: CodecError) {
        self.out_spans.clear();
        match e {
            CodecError::OutOfMemory => {
                self.outcome = Outcome::OutOfMemory;
                crate::handoff::outcome::fail(self.out, codec::NOT_ENOUGH_MEMORY);
            }
            e => {
                self.outcome = Outcome::Failed;
                crate::handoff::outcome::fail(self.out, &e.to_string());
            }
        }
    }
}

pub unsafe extern "C-unwind" fn run(l: *mut lua_State) -> c_int {
    // SAFETY: called by CFunction::call with a Task (ThreadVm::run).
    let t = unsafe { &mut *argument::<Task>(l) };
    // SAFETY: l is this thread's state inside a protected call; the
    // handler and its values go above the light userdata (index 1), and
    // push_values reserves the slots it needs; the spans' bytes are alive
    // (ThreadVm::run's contract).
    let status = unsafe {
        ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, t.refs.handler);
        match codec::push_values(l, t.args, t.spans) {
            Ok(n) => ffi::lua_pcall(l, n as c_int, ffi::LUA_MULTRET, 0),
            Err(e) => {
                t.fail(e);
                return 0;
            }
        }
    };
    match status {
        ffi::LUA_OK => {
            // SAFETY: the results are at 2..=top.
            let n = unsafe { ffi::lua_gettop(l) } as usize - 1;
            let borrow = t.borrow.map(|min| Borrow { min, nested: false });
            // SAFETY: inside run's protected call, where write_values may
            // raise, with the n results at 2..=top, unchanged since the
            // handler returned them.
            match unsafe {
                codec::write_values(
                    l,
                    Source::Stack(2),
                    n,
                    "return value",
                    borrow,
                    t.out,
                    t.out_spans,
                )
            } {
                Ok(0) => {}
                // SAFETY: inside run's protected call, with the n results at
                // 2..=n+1 unchanged since they were encoded, as pin needs.
                Ok(borrowed) => unsafe { pin(l, t, n, borrowed) },
                Err(e) => t.fail(e),
            }
        }
        ffi::LUA_ERRMEM => t.fail(CodecError::OutOfMemory),
        // SAFETY: the error value is on top; then it is encoded and gone.
        _ => unsafe {
            error_value(l, t);
            ffi::lua_settop(l, 1);
            drain(l, t);
        },
    }
    0
}

/// The most failing finalizers drained after one task.
const DRAIN_MAX: u32 = 10_000;

/// Runs the finalizers that fail, after a handler failed (perhaps by one
/// of them). LuaJIT runs one finalizer per collector step and raises its
/// error from whatever allocation ran the step; until every failing one
/// has run, each task that allocates would fail with the next one's
/// error. Here they fail between tasks instead: one protected step at a
/// time, as long as steps raise.
///
/// # Safety
/// Inside `run`, with its light userdata alone on the stack.
unsafe fn drain(l: *mut lua_State, t: &mut Task) {
    for _ in 0..DRAIN_MAX {
        // SAFETY: this runs inside `run`, a protected call, with its light
        // userdata alone on the stack (the contract); step is a C function of
        // this state, and a C function has slots for it and its error.
        let failed = unsafe {
            ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, t.refs.step);
            let failed = ffi::lua_pcall(l, 0, 0, 0) != ffi::LUA_OK;
            if failed && t.drained.1.is_none() {
                t.drained.1 = Some(plain_text(l, -1));
            }
            ffi::lua_settop(l, 1);
            failed
        };
        if !failed {
            return;
        }
        t.drained.0 += 1;
    }
}

unsafe extern "C-unwind" fn step(l: *mut lua_State) -> c_int {
    // SAFETY: called protected (drain); a finalizer's error stops there.
    unsafe { ffi::lua_gc(l, ffi::LUA_GCSTEP, 0) };
    0
}

/// Keeps the strings the results borrow in pins[t.pin] until the event
/// loop lets go of them.
///
/// # Safety
/// Inside `run`, with the `n` results at 2..=n+1 as encoded.
unsafe fn pin(l: *mut lua_State, t: &mut Task, n: usize, borrowed: usize) {
    let borrow = Borrow {
        min: t.borrow.unwrap_or(0),
        nested: false,
    };
    let end = borrowed as c_int + 1;
    // SAFETY: this runs inside `run`, a protected call where the collection
    // may raise, with the n results at 2..=n+1 as encoded (the contract); the
    // table has room for every borrowed string in its array part
    // (codec::anchor's contract).
    unsafe {
        ffi::lua_createtable(l, borrowed as c_int, 0);
        let table = ffi::lua_gettop(l);
        if codec::anchor(l, Source::Stack(2), n, borrow, table, 1, end) != end {
            t.fail(codec::stack_overflow());
            return;
        }
        ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, t.refs.pins);
        ffi::lua_pushnumber(l, t.pin);
        ffi::lua_pushvalue(l, table);
        ffi::lua_rawset(l, -3);
    }
    t.pinned = true;
}

/// The handler raised: the caller gets the error value itself when it can
/// cross (a string, a table), else its text.
///
/// # Safety
/// Inside `run`, with the error value on top.
unsafe fn error_value(l: *mut lua_State, t: &mut Task) {
    t.outcome = Outcome::Failed;
    // SAFETY: this runs inside `run`, a protected call, with the error value
    // on top (the contract), which is read and replaced here.
    unsafe {
        let v = ffi::lua_gettop(l);
        if ffi::lua_type(l, v) == ffi::LUA_TNIL {
            t.fail(CodecError::Value("error raised with a nil value".into()));
            return;
        }
        if codec::write_values(
            l,
            Source::Stack(v),
            1,
            "error value",
            None,
            t.out,
            t.out_spans,
        )
        .is_err()
        {
            let text = error_text(l, t.refs.tostring);
            t.fail(CodecError::Value(text));
        }
    }
}

/// Result strings to let go of.
pub struct Unpin<'a> {
    pub pins: c_int,
    pub keys: &'a [f64],
}

pub unsafe extern "C-unwind" fn unpin(l: *mut lua_State) -> c_int {
    // SAFETY: called by CFunction::call with an Unpin (ThreadVm::unpin).
    let u = unsafe { &*argument::<Unpin>(l) };
    // SAFETY: inside a protected call; pins is the registry's table.
    unsafe {
        ffi::lua_rawgeti_(l, ffi::LUA_REGISTRYINDEX, u.pins);
        for &key in u.keys {
            ffi::lua_pushnumber(l, key);
            ffi::lua_pushnil(l);
            ffi::lua_rawset(l, -3);
        }
    }
    0
}

pub unsafe extern "C-unwind" fn collect(l: *mut lua_State) -> c_int {
    // SAFETY: inside a protected call: a finalizer's error stops there.
    unsafe { ffi::lua_gc(l, ffi::LUA_GCCOLLECT, 0) };
    0
}
