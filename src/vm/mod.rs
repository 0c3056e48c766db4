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
    /// `pcall` bound to the handler: returns ok, values... or false, err.
    call: Function,
}

impl ThreadVm {
    /// Builds the state: standard libraries (with ffi and jit), package
    /// paths, the `ngx` table, the init chunk, then the handler.
    pub fn new(spec: &Spec) -> Result<ThreadVm, String> {
        // SAFETY: unsafe_new only adds the ffi library, which pool code uses
        // as event-loop code does; the state never leaves this thread.
        let lua = unsafe { Lua::unsafe_new() };
        let setup = || -> Result<Function, String> {
            let package: mlua::Table = lua.globals().get("package").map_err(|e| error_text(&e))?;
            for (key, value) in [("path", &spec.package_path), ("cpath", &spec.package_cpath)] {
                if let Some(v) = value {
                    let s = lua.create_string(v).map_err(|e| error_text(&e))?;
                    package.set(key, s).map_err(|e| error_text(&e))?;
                }
            }
            ngx_api::install(&lua, &spec.pool, spec.log, &spec.ngx).map_err(|e| error_text(&e))?;
            if let Some(init) = &spec.init {
                init.load(&lua)?
                    .call::<()>(())
                    .map_err(|e| format!("init: {}", error_text(&e)))?;
            }
            let process = spec.process.load(&lua)?;
            let handler = match spec.style {
                Style::PerTask => process,
                Style::Factory => match process.call::<Value>(()).map_err(|e| error_text(&e))? {
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
            lua.load("local h, pcall = ... return function(...) return pcall(h, ...) end")
                .set_name("=ngx_threadpool.call")
                .call((
                    handler,
                    lua.globals()
                        .get::<Function>("pcall")
                        .map_err(|e| error_text(&e))?,
                ))
                .map_err(|e| error_text(&e))
        };
        let call = setup()?;
        Ok(ThreadVm { lua, call })
    }

    /// Runs one task: `payload` holds the encoded arguments on entry and the
    /// encoded results (or the error value) on return. Returns whether the
    /// handler failed.
    pub fn run(&self, payload: &mut Vec<u8>) -> bool {
        let args = match codec::decode_values(&self.lua, payload) {
            Ok(args) => args,
            Err(e) => return fail(payload, &e),
        };
        let mut out = match self.call.call::<MultiValue>(args) {
            Ok(out) => out,
            Err(e) => return fail(payload, &error_text(&e)),
        };
        let ok = matches!(out.pop_front(), Some(Value::Boolean(true)));
        payload.clear();
        if ok {
            match codec::encode_values(&out, payload, "return value") {
                Ok(()) => false,
                Err(e) => fail(payload, &e),
            }
        } else {
            // error(x): pass x itself when it can cross (a string, a table),
            // else its tostring; error() and error(nil) still give the caller
            // a message to log.
            let err = out.pop_front().unwrap_or(Value::Nil);
            if err.is_nil() {
                return fail(payload, "error raised with a nil value");
            }
            let err = MultiValue::from_iter([err]);
            if codec::encode_values(&err, payload, "error value").is_err() {
                return fail(payload, &err[0].to_string().unwrap_or_default());
            }
            true
        }
    }
}

/// Replaces `payload` with a single string error value; returns true
/// (failed) for the caller's convenience.
pub fn fail(payload: &mut Vec<u8>, msg: &str) -> bool {
    payload.clear();
    codec::encode_string(msg.as_bytes(), payload);
    true
}
