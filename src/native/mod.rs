//! A pool thread's native handler: a library written to
//! handler/include/ngx_threadpool.h (`thread_pool_process_by_rust`), one
//! state of it per thread, built by `ngx_threadpool_init`, fed one task at
//! a time by `ngx_threadpool_process`, updated between two tasks by
//! `ngx_threadpool_update` (if the library has it) and freed by
//! `ngx_threadpool_free`.
//!
//! The library gets the arguments' payload as it crossed (strings the
//! event loop lends arrive as spans), writes its results through a writer
//! bounded by codec::MAX_PAYLOAD, and reads the task's cancellation
//! through a callback. Its results are not checked here: the event loop's
//! decoder refuses a malformed payload (`bad payload: ...`) as it would
//! any other.

mod abi;
mod library;

pub use library::{Library, LoadError, NO_UPDATES};

use crate::codec::{self, Span, MAX_PAYLOAD};
use crate::handoff::outcome::{Cancel, Outcome};
use crate::handoff::payload::Payload;
use crate::handoff::stream;
use crate::ngx::guard;
use crate::ngx::log::{self, Log};
use std::borrow::Cow;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

/// What a thread needs to build its native state; cloned into every
/// thread.
#[derive(Clone)]
pub struct Spec {
    pub library: Arc<Library>,
    /// CONFIG of the directive, handed to each thread's init.
    pub config: Option<Vec<u8>>,
}

/// Where the library's log lines go; boxed, so that its address, given to
/// the library, holds for the state's life.
struct LogTo {
    log: Option<Log>,
    /// The pool's suffix (log::pool_suffix).
    suffix: String,
}

/// One thread's state of the library; only that thread uses it.
pub struct State {
    state: *mut c_void,
    library: Arc<Library>,
    _log: Box<LogTo>,
}

impl State {
    /// Runs the library's init for thread `thread` of pool `pool`: its
    /// error text when it fails.
    pub fn new(spec: &Spec, pool: &str, log: Option<Log>, thread: usize) -> Result<State, String> {
        let log_to = Box::new(LogTo {
            log,
            suffix: log::pool_suffix(pool),
        });
        let init = abi::ngx_tp_init_t {
            pool: abi::bytes(pool.as_bytes()),
            config: spec.config.as_deref().map_or(
                abi::ngx_tp_bytes_t {
                    data: std::ptr::null(),
                    len: 0,
                },
                abi::bytes,
            ),
            thread: thread as c_uint,
            log_fn: Some(log_line),
            log: (&raw const *log_to).cast(),
        };
        let mut err = Vec::new();
        let mut sink = Sink::new(&mut err);
        let mut state = std::ptr::null_mut();
        // SAFETY: init, its strings and log_to outlive the call (log_to the
        // state's); state and the writer are what the header says.
        let rc = unsafe { (spec.library.init)(&init, &mut state, &mut sink.out()) };
        let written = sink.finish();
        failure(rc, written, &err, "ngx_threadpool_init", &spec.library.path)?;
        Ok(State {
            state,
            library: spec.library.clone(),
            _log: log_to,
        })
    }

    /// Runs one task: the library's results or error value go to `out`.
    ///
    /// # Safety
    /// The bytes of `spans` must be alive until this returns.
    pub unsafe fn run(
        &self,
        args: &[u8],
        spans: &[Span],
        out: &mut Vec<u8>,
        cancel: &Cancel,
    ) -> Outcome {
        let task = abi::ngx_tp_task_t {
            args: abi::bytes(args),
            // a Span has ngx_tp_bytes_t's layout (abi.rs checks it)
            spans: spans.as_ptr().cast(),
            nspans: spans.len(),
            cancelled: Some(cancelled),
            module: (cancel as *const Cancel).cast(),
            send: Some(send),
            receive: Some(receive),
        };
        let mut sink = Sink::new(out);
        // SAFETY: the state is this thread's; task, its spans (our
        // contract) and the cancellation flag outlive the call.
        let rc = unsafe { (self.library.process)(self.state, &task, &mut sink.out()) };
        match (sink.finish(), rc) {
            (Err(text), _) => {
                crate::handoff::outcome::fail(out, &text);
                Outcome::Failed
            }
            (Ok(()), abi::OK) => Outcome::Done,
            (Ok(()), abi::ERROR) => Outcome::Failed,
            (Ok(()), rc) => {
                crate::handoff::outcome::fail(
                    out,
                    &returned("ngx_threadpool_process", &self.library.path, rc),
                );
                Outcome::Failed
            }
        }
    }

    /// Whether the library applies updates (it exports
    /// ngx_threadpool_update).
    pub fn takes_updates(&self) -> bool {
        self.library.takes_updates()
    }

    /// Runs the library's update on this thread's state, between two
    /// tasks: its error text when it fails (the library then kept its
    /// previous state) or when the library has no update.
    pub fn update(&self, version: u64, args: &[u8]) -> Result<(), String> {
        let Some(update) = self.library.update else {
            return Err(self.library.no_updates());
        };
        let raw = abi::ngx_tp_update_t {
            version,
            args: abi::bytes(args),
        };
        let mut err = Vec::new();
        let mut sink = Sink::new(&mut err);
        // SAFETY: the state is this thread's and no task runs on it; raw
        // and its payload outlive the call, the writer is the sink's.
        let rc = unsafe { update(self.state, &raw, &mut sink.out()) };
        let written = sink.finish();
        failure(
            rc,
            written,
            &err,
            "ngx_threadpool_update",
            &self.library.path,
        )
    }
}

/// What init or update (`export`) of the library at `path` returned, rc
/// with the error payload `err` it wrote: Ok, or the error's text (a
/// refused write's, the payload's, or `returned`'s when there is none).
fn failure(
    rc: c_int,
    written: Result<(), Cow<'static, str>>,
    err: &[u8],
    export: &str,
    path: &str,
) -> Result<(), String> {
    match (rc, written) {
        (abi::OK, _) => Ok(()),
        (_, Err(text)) => Err(text.into_owned()),
        (abi::ERROR, Ok(())) if !err.is_empty() => Err(codec::error_text(err)),
        (rc, Ok(())) => Err(returned(export, path, rc)),
    }
}

/// An export's return code that is none of its codes, or an error
/// without its error value.
fn returned(export: &str, path: &str, rc: c_int) -> String {
    format!("{export} of \"{path}\" returned {rc}")
}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: the state came from this library's init, on this thread,
        // and is freed once.
        unsafe { (self.library.free)(self.state) };
    }
}

/// The payload a library writes, bounded like any other.
struct Sink<'a> {
    buf: &'a mut Vec<u8>,
    /// Why a write was refused: the error the caller gets instead (out of
    /// memory without allocating).
    refused: Option<Cow<'static, str>>,
}

impl<'a> Sink<'a> {
    fn new(buf: &'a mut Vec<u8>) -> Sink<'a> {
        Sink { buf, refused: None }
    }

    /// The writer handed to the library, pointing at this sink: used only
    /// while the sink is borrowed for the call.
    fn out(&mut self) -> abi::ngx_tp_out_t {
        abi::ngx_tp_out_t {
            write: Some(write),
            module: (self as *mut Sink).cast(),
        }
    }

    /// Ok, or the error text of a refused write (the payload is then
    /// not the library's).
    fn finish(self) -> Result<(), Cow<'static, str>> {
        self.refused.map_or(Ok(()), Err)
    }

    fn write(&mut self, bytes: &[u8]) -> c_int {
        if self.refused.is_some() {
            return -1;
        }
        if self.buf.len() + bytes.len() > MAX_PAYLOAD {
            self.refused = Some(codec::size_message("return value").into());
            return -1;
        }
        if self.buf.try_reserve(bytes.len()).is_err() {
            self.refused = Some(Cow::Borrowed(codec::NOT_ENOUGH_MEMORY));
            return -1;
        }
        self.buf.extend_from_slice(bytes);
        0
    }
}

/// `ngx_tp_out_t.write`.
unsafe extern "C" fn write(out: *mut abi::ngx_tp_out_t, data: *const u8, len: usize) -> c_int {
    guard::catch(|| {
        // SAFETY: out is the writer of Sink::out, whose module points to
        // the sink, alive and not otherwise borrowed during the call; data
        // holds len bytes (the header's contract).
        unsafe {
            let sink = &mut *(*out).module.cast::<Sink>();
            sink.write(crate::ngx::shim::bytes(data, len))
        }
    })
    .unwrap_or(-1)
}

/// `ngx_tp_task_t.cancelled`.
unsafe extern "C" fn cancelled(task: *const abi::ngx_tp_task_t) -> c_int {
    // SAFETY: task is the one run() passed, whose module is the task's
    // cancellation flag, alive during the call.
    c_int::from(unsafe { (*(*task).module.cast::<Cancel>()).is_cancelled() })
}

/// `task->send`: hands a copy of the chunk to the stream of the task this
/// thread runs (handoff::stream, which thread/run.rs marks for the run).
unsafe extern "C" fn send(_task: *const abi::ngx_tp_task_t, data: *const u8, len: usize) -> c_int {
    guard::catch(|| {
        if len > MAX_PAYLOAD {
            return abi::ERROR;
        }
        // SAFETY: the header's contract: data points to len bytes.
        let bytes = unsafe { crate::ngx::shim::bytes(data, len) };
        stream::with_serving(|s| match s {
            None => abi::NO_STREAM,
            Some(s) => {
                let chunk = Payload {
                    bytes: bytes.to_vec(),
                    ..Payload::default()
                };
                match s.send(chunk, crate::handoff::notify::wake) {
                    Ok(_) => abi::OK,
                    Err(_) => abi::CANCELLED,
                }
            }
        })
    })
    .unwrap_or(abi::ERROR)
}

/// `task->receive`: the caller's next chunk, written to `out`.
unsafe extern "C" fn receive(
    _task: *const abi::ngx_tp_task_t,
    out: *mut abi::ngx_tp_out_t,
) -> c_int {
    guard::catch(|| {
        stream::with_serving(
            |s| match s.map(|s| s.receive(crate::handoff::notify::wake)) {
                None => abi::NO_STREAM,
                Some(Err(_)) => abi::CANCELLED,
                Some(Ok(None)) => abi::END,
                Some(Ok(Some(chunk))) => {
                    // SAFETY: out is the library's writer, as the header says;
                    // a chunk written on the event loop borrows nothing.
                    let written = unsafe {
                        (*out)
                            .write
                            .map(|write| write(out, chunk.bytes.as_ptr(), chunk.bytes.len()))
                    };
                    match written {
                        Some(0) => abi::OK,
                        _ => abi::ERROR,
                    }
                }
            },
        )
    })
    .unwrap_or(abi::ERROR)
}

/// `ngx_tp_log_pt`: a line in nginx's error log at `level` (clamped to
/// the header's levels), ending like a Lua thread's.
unsafe extern "C" fn log_line(log: *const c_void, level: c_int, msg: *const u8, len: usize) {
    let _ = guard::catch(|| {
        // SAFETY: log is the LogTo of State::new, alive for the state's
        // life; msg holds len bytes (the header's contract).
        let (to, msg) = unsafe { (&*log.cast::<LogTo>(), crate::ngx::shim::bytes(msg, len)) };
        let level =
            level.clamp(abi::NGX_TP_LOG_ERR as c_int, abi::NGX_TP_LOG_DEBUG as c_int) as u32;
        match to.log {
            Some(l) => l.write_parts(level, &[b"[native] ", msg, to.suffix.as_bytes()]),
            None => eprintln!("[native] {}{}", String::from_utf8_lossy(msg), to.suffix),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What init or update returned, as its caller gets it.
    fn outcome(rc: c_int, written: Result<(), &'static str>, err: &[u8]) -> Result<(), String> {
        let written = written.map_err(Cow::Borrowed);
        failure(rc, written, err, "ngx_threadpool_update", "/lib.so")
    }

    #[test]
    fn an_export_failure_is_its_error_value_or_names_the_export() {
        // uint(1) map(1) {1: bin "no"}
        let err = [0x01, 0x81, 0x01, 0xc4, 2, b'n', b'o'];
        assert_eq!(outcome(abi::OK, Ok(()), &err), Ok(()));
        assert_eq!(outcome(abi::ERROR, Ok(()), &err), Err("no".into()));
        let returned = |rc| format!("ngx_threadpool_update of \"/lib.so\" returned {rc}");
        assert_eq!(outcome(abi::ERROR, Ok(()), &[]), Err(returned(1)));
        assert_eq!(outcome(7, Ok(()), &err), Err(returned(7)));
        assert_eq!(
            outcome(abi::ERROR, Err(codec::NOT_ENOUGH_MEMORY), &[]),
            Err(codec::NOT_ENOUGH_MEMORY.into())
        );
    }
}
