//! A pool thread's Lua state: built once when the thread starts, then fed
//! one task at a time.

pub mod chunk;
mod ngx_api;
mod ngx_re;

pub use ngx_api::NgxEnv;

use crate::codec;
use crate::ngx::log::Log;
use chunk::{error_text, Chunk, Style};
use mlua::{Function, Lua, MultiValue, Value};

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
}

pub struct ThreadVm {
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

    /// Runs one task: `payload` holds the encoded arguments on entry and the
    /// encoded results (or the error value) on return.
    pub fn run(&self, payload: &mut Vec<u8>) -> Outcome {
        let args = match codec::decode_values(&self.lua, payload) {
            Ok(args) => args,
            Err(e) => return fail_with(payload, e),
        };
        let mut out = match self.call.call::<MultiValue>(args) {
            Ok(out) => out,
            // Only protect.lua's own code runs outside the handler's pcall.
            Err(e) => {
                let msg = error_text(&e);
                fail(payload, &msg);
                return Outcome::Broken(msg);
            }
        };
        let ok = matches!(out.pop_front(), Some(Value::Boolean(true)));
        payload.clear();
        if ok {
            return match codec::encode_values(&out, payload, "return value") {
                Ok(()) => Outcome::Done,
                Err(e) => fail_with(payload, e),
            };
        }
        // error(x): pass x itself when it can cross (a string, a table),
        // else its tostring; error() and error(nil) still give the caller
        // a message to log.
        let err = out.pop_front().unwrap_or(Value::Nil);
        if err.is_nil() {
            fail(payload, "error raised with a nil value");
            return Outcome::Failed;
        }
        if let Value::String(s) = &err {
            if s.as_bytes().as_ref() == codec::NOT_ENOUGH_MEMORY.as_bytes() {
                fail(payload, codec::NOT_ENOUGH_MEMORY);
                return Outcome::Broken(codec::NOT_ENOUGH_MEMORY.into());
            }
        }
        let err = MultiValue::from_iter([err]);
        if codec::encode_values(&err, payload, "error value").is_err() {
            fail(payload, &error_value_text(err[0].clone()));
        }
        Outcome::Failed
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
