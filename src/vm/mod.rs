//! A pool thread's Lua state: built once when the thread starts, then fed
//! one task at a time.

pub mod chunk;
mod ngx_api;
mod ngx_re;

pub use ngx_api::NgxEnv;

use crate::codec;
use crate::ngx::log::Log;
use chunk::{error_text, Chunk, Style};
use mlua::{Function, Lua, LuaString, MultiValue, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a thread needs to build its state; cloned into every thread.
#[derive(Clone)]
pub struct Spec {
    pub pool: String,
    pub init: Option<Chunk>,
    pub process: Chunk,
    pub style: Style,
    pub package_path: Option<Vec<u8>>,
    pub package_cpath: Option<Vec<u8>>,
    pub log: Option<Log>,
    pub ngx: NgxEnv,
    /// Result strings of at least this many bytes are borrowed by the
    /// event loop (`thread_pool_zero_copy`; None: copied).
    pub zero_copy: Option<usize>,
}

pub struct ThreadVm {
    /// Result strings the event loop reads in place, by pin key, until it
    /// lets go of them (dropped before the state is closed).
    pins: RefCell<HashMap<PinKey, Vec<LuaString>>>,
    zero_copy: Option<usize>,
    lua: Lua,
    /// The handler under protect.lua: returns ok, values... or false, err.
    call: Function,
    /// collectgarbage() under protect.lua.
    collect: Function,
    allocator: crate::lua::Allocator,
    pool: String,
    log: Option<Log>,
}

impl Drop for ThreadVm {
    fn drop(&mut self) {
        crate::lua::restore_allocator(&self.lua, &self.allocator);
    }
}

/// Names the result strings of one task that a state keeps alive; unique
/// in the process, so a key finds its state after a rebuild too.
pub type PinKey = u64;

static NEXT_PIN: AtomicU64 = AtomicU64::new(1);

/// How a task went, for the thread that ran it.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The payload holds the results.
    Done,
    /// The payload holds the error value for the caller.
    Failed,
    /// As Failed, and the state should not serve another task: it ran out
    /// of memory (its handler may keep what filled it), or Lua failed
    /// outside the handler. The thread rebuilds it.
    Broken(String),
}

impl ThreadVm {
    /// Builds the state: standard libraries (with ffi and jit), package
    /// paths, the `ngx` table, the init chunk, then the handler.
    pub fn new(spec: &Spec) -> Result<ThreadVm, String> {
        let (lua, allocator) = crate::lua::new_thread_state().map_err(|e| error_text(&e))?;
        let setup = || -> Result<(Function, Function), String> {
            let package: mlua::Table = lua.globals().get("package").map_err(|e| error_text(&e))?;
            for (key, value) in [("path", &spec.package_path), ("cpath", &spec.package_cpath)] {
                if let Some(v) = value {
                    let s = lua.create_string(v).map_err(|e| error_text(&e))?;
                    package.set(key, s).map_err(|e| error_text(&e))?;
                }
            }
            ngx_api::install(&lua, &spec.pool, spec.log, &spec.ngx).map_err(|e| error_text(&e))?;
            let protect: Function = lua
                .load(include_str!("protect.lua"))
                .set_name("=ngx_threadpool.protect")
                .call(())
                .map_err(|e| error_text(&e))?;
            let run_protected = |f: Function| -> Result<MultiValue, String> {
                let wrapped: Function = protect.call(f).map_err(|e| error_text(&e))?;
                let mut out = wrapped.call::<MultiValue>(()).map_err(|e| error_text(&e))?;
                match out.pop_front() {
                    Some(Value::Boolean(true)) => Ok(out),
                    _ => Err(error_value_text(out.pop_front().unwrap_or(Value::Nil))),
                }
            };
            if let Some(init) = &spec.init {
                run_protected(init.load(&lua)?).map_err(|e| format!("init: {e}"))?;
            }
            let process = spec.process.load(&lua)?;
            let handler = match spec.style {
                Style::PerTask => process,
                Style::Factory => match run_protected(process)?.pop_front().unwrap_or(Value::Nil) {
                    Value::Function(f) => f,
                    other => {
                        return Err(format!(
                        "process chunk {} does not use ... and returned {} instead of a function",
                        spec.process.name.trim_start_matches(['=', '@']),
                        codec::type_name(&other)
                    ))
                    }
                },
            };
            let collect = lua
                .globals()
                .get::<Function>("collectgarbage")
                .and_then(|f| protect.call(f))
                .map_err(|e| error_text(&e))?;
            let call = protect.call(handler).map_err(|e| error_text(&e))?;
            Ok((call, collect))
        };
        match setup() {
            Ok((call, collect)) => Ok(ThreadVm {
                pins: RefCell::default(),
                zero_copy: spec.zero_copy,
                lua,
                call,
                collect,
                allocator,
                pool: spec.pool.clone(),
                log: spec.log,
            }),
            Err(e) => {
                crate::lua::restore_allocator(&lua, &allocator);
                Err(e)
            }
        }
    }

    /// Runs one task: `payload` and `spans` hold the encoded arguments on
    /// entry and the encoded results (or the error value) on return. With
    /// borrowed results, the key under which their strings stay pinned
    /// until `unpin`.
    ///
    /// # Safety
    /// The bytes of `spans` must be alive until this returns (the shim
    /// anchors them until the completion).
    pub unsafe fn run(&self, payload: &mut Vec<u8>, spans: &mut Vec<codec::Span>) -> Ran {
        // SAFETY: forwarded from the caller.
        let args = unsafe { codec::decode_borrowing(&self.lua, payload, spans) };
        spans.clear();
        let args = match args {
            Ok(args) => args,
            Err(e) => return Ran::from(fail_with(payload, e)),
        };
        let mut out = match self.call.call::<MultiValue>(args) {
            Ok(out) => out,
            // Only protect.lua's own code runs outside the handler's pcall.
            Err(e) => {
                let msg = error_text(&e);
                fail(payload, &msg);
                return Ran::from(Outcome::Broken(msg));
            }
        };
        let ok = matches!(out.pop_front(), Some(Value::Boolean(true)));
        payload.clear();
        if ok {
            return self.results(&out, payload, spans);
        }
        // error(x): pass x itself when it can cross (a string, a table),
        // else its tostring; error() and error(nil) still give the caller
        // a message to log.
        let err = out.pop_front().unwrap_or(Value::Nil);
        if err.is_nil() {
            fail(payload, "error raised with a nil value");
            return Ran::from(Outcome::Failed);
        }
        if let Value::String(s) = &err {
            if s.as_bytes().as_ref() == codec::NOT_ENOUGH_MEMORY.as_bytes() {
                fail(payload, codec::NOT_ENOUGH_MEMORY);
                return Ran::from(Outcome::Broken(codec::NOT_ENOUGH_MEMORY.into()));
            }
        }
        let err = MultiValue::from_iter([err]);
        if codec::encode_values(&err, payload, "error value").is_err() {
            fail(payload, &error_value_text(err[0].clone()));
        }
        Ran::from(Outcome::Failed)
    }

    /// Encodes the handler's return values, borrowing the large strings.
    fn results(
        &self,
        out: &MultiValue,
        payload: &mut Vec<u8>,
        spans: &mut Vec<codec::Span>,
    ) -> Ran {
        let mut strings = Vec::new();
        let borrow = self.zero_copy.map(|min| codec::Borrow {
            min,
            spans,
            strings: &mut strings,
        });
        if let Err(e) = codec::encode_borrowing(out, payload, "return value", borrow) {
            return Ran::from(fail_with(payload, e));
        }
        let pin = (!strings.is_empty()).then(|| {
            let key = NEXT_PIN.fetch_add(1, Ordering::Relaxed);
            self.pins.borrow_mut().insert(key, strings);
            key
        });
        Ran {
            outcome: Outcome::Done,
            pin,
        }
    }

    /// Lets go of the result strings pinned under `key`; false if this
    /// state holds none under it.
    pub fn unpin(&self, key: PinKey) -> bool {
        self.pins.borrow_mut().remove(&key).is_some()
    }

    /// Whether some result strings of this state are still read in place.
    pub fn has_pins(&self) -> bool {
        !self.pins.borrow().is_empty()
    }
}

/// What running a task gave: how it went, and the key of its borrowed
/// result strings.
pub struct Ran {
    pub outcome: Outcome,
    pub pin: Option<PinKey>,
}

impl From<Outcome> for Ran {
    fn from(outcome: Outcome) -> Ran {
        Ran { outcome, pin: None }
    }
}

impl ThreadVm {
    /// A full collection, when the thread goes idle after large payloads.
    /// Protected like any Lua code of the thread: a finalizer's error is
    /// logged, not raised.
    pub fn collect_garbage(&self) {
        if let Ok(mut out) = self.collect.call::<MultiValue>(()) {
            if !matches!(out.pop_front(), Some(Value::Boolean(true))) {
                let err = error_value_text(out.pop_front().unwrap_or(Value::Nil));
                let args =
                    format_args!("thread pool \"{}\": error between tasks: {err}", self.pool);
                match self.log {
                    Some(log) => log.message(crate::ngx::log::NGX_LOG_WARN, args),
                    None => eprintln!("{}{args}", crate::ngx::log::PREFIX),
                }
            }
        }
    }
}

/// An error value as text: its tostring, or its type when that fails (a
/// `__tostring` that raises) or is empty.
fn error_value_text(v: Value) -> String {
    match v.to_string() {
        Ok(s) if !s.is_empty() => s,
        _ => format!("error object is a {}", codec::type_name(&v)),
    }
}

/// The task failed with `msg`; out of memory means the state is spent.
fn fail_with(payload: &mut Vec<u8>, msg: String) -> Outcome {
    fail(payload, &msg);
    if msg == codec::NOT_ENOUGH_MEMORY {
        Outcome::Broken(msg)
    } else {
        Outcome::Failed
    }
}

/// Replaces `payload` with a single string error value; returns true
/// (failed) for the caller's convenience.
pub fn fail(payload: &mut Vec<u8>, msg: &str) -> bool {
    payload.clear();
    codec::encode_string(msg.as_bytes(), payload);
    true
}
