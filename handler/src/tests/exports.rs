//! The generated exports, called as the module calls them: results and
//! errors through `ngx_tp_out_t`, panics caught, log lines through
//! `log_fn`, state kept per thread, updates applied or refused. (That the header's constants are the
//! crate's, the module checks when it compiles: src/native/abi.rs.)

use super::{bytes_of, payload, raw_task, with_task, Out, V};
use crate::ffi::{ngx_tp_bytes_t, ngx_tp_init_t, ngx_tp_update_t};
use crate::handler::NO_UPDATES;
use crate::{Error, Handler, Init, Task, Update, Values};
use ngx_threadpool_wire::{level, status};
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::AtomicBool;

struct State {
    calls: u64,
    panic_on_drop: bool,
}

impl Drop for State {
    fn drop(&mut self) {
        log::info!("dropped after {}", self.calls);
        if self.panic_on_drop {
            panic!("in drop");
        }
    }
}

impl Handler for State {
    /// The argument, this state's calls, and whether the task was
    /// cancelled.
    type Output<'t> = Values<(&'t str, u64, bool)>;

    fn init(init: &Init) -> Result<State, Error> {
        match init.config() {
            Some("fail") => return Err(format!("cannot start {}", init.pool()).into()),
            Some("panic") => panic!("init panics"),
            _ => {}
        }
        log::warn!("{} #{} {:?}", init.pool(), init.thread(), init.config());
        Ok(State {
            calls: 0,
            panic_on_drop: init.config() == Some("panic in drop"),
        })
    }

    fn process<'t>(&mut self, task: &Task<'t>) -> Result<Self::Output<'t>, Error> {
        let s: &str = task.args()?;
        self.calls += 1;
        log::debug!("call {}", self.calls);
        match s {
            "panic" => panic!("asked to"),
            "fail" => Err("asked to fail".into()),
            "big" => Ok(Values(("x".repeat(64).leak(), self.calls, false))),
            _ => Ok(Values((s, self.calls, task.cancelled()))),
        }
    }

    /// `("set", calls)` sets this state's calls; "fail" fails, "panic"
    /// panics.
    fn update(&mut self, update: &Update<'_>) -> Result<(), Error> {
        let (what, calls): (&str, Option<u64>) = update.args()?;
        match what {
            "panic" => panic!("update panics"),
            "fail" => Err(format!("version {} refused", update.version()).into()),
            _ => {
                log::info!("version {} {what} of {}", update.version(), update.nargs());
                self.calls = calls.unwrap_or(self.calls);
                Ok(())
            }
        }
    }
}

/// A handler that keeps the default update.
struct Fixed;

impl Handler for Fixed {
    type Output<'t> = ();

    fn init(_: &Init) -> Result<Fixed, Error> {
        Ok(Fixed)
    }

    fn process<'t>(&mut self, _: &Task<'t>) -> Result<(), Error> {
        Ok(())
    }
}

mod exported {
    crate::export!(super::State);
}

use exported::{ngx_threadpool_free, ngx_threadpool_process, ngx_threadpool_update};

thread_local! {
    static LINES: RefCell<Vec<(c_int, String)>> = const { RefCell::new(Vec::new()) };
}

unsafe extern "C" fn log_fn(log: *const c_void, level: c_int, msg: *const u8, len: usize) {
    assert_eq!(log as usize, 0x10c, "the init's log handle");
    // SAFETY: msg points to len bytes.
    let msg = unsafe { std::slice::from_raw_parts(msg, len) };
    let line = String::from_utf8(msg.to_vec()).unwrap();
    LINES.with_borrow_mut(|l| l.push((level, line)));
}

fn lines() -> Vec<(c_int, String)> {
    LINES.take()
}

/// Calls ngx_threadpool_init's body for `H`: its code, its state, and its
/// error payload.
fn start<H: Handler>(config: Option<&str>) -> (c_int, *mut c_void, Vec<u8>) {
    let init = ngx_tp_init_t {
        pool: bytes_of(b"up"),
        config: config.map_or(
            ngx_tp_bytes_t {
                data: ptr::null(),
                len: 0,
            },
            |c| bytes_of(c.as_bytes()),
        ),
        thread: 3,
        log_fn,
        log: 0x10c as *const c_void,
    };
    let mut state = ptr::null_mut();
    let mut err = Out::new(usize::MAX);
    // SAFETY: init, its strings and log_fn outlive the call; state and err are
    // writable, as the module passes them.
    let rc = unsafe { crate::__private::init::<H>(&init, &mut state, err.ptr()) };
    (rc, state, err.buf)
}

/// Calls ngx_threadpool_process: its code and its payload.
fn run(state: *mut c_void, p: &[u8], flag: &AtomicBool, limit: usize) -> (c_int, Vec<u8>) {
    let raw = raw_task(p, &[], flag);
    let mut out = Out::new(limit);
    // SAFETY: state is what ngx_threadpool_init made; raw's payload and flag
    // outlive the call, and out is an empty writer, as the module passes them.
    let rc = unsafe { ngx_threadpool_process(state, &raw.raw, out.ptr()) };
    (rc, out.buf)
}

/// Calls ngx_threadpool_update: its code and its error payload.
fn apply(state: *mut c_void, version: u64, p: &[u8]) -> (c_int, Vec<u8>) {
    let update = ngx_tp_update_t {
        version,
        args: bytes_of(p),
    };
    let mut err = Out::new(usize::MAX);
    // SAFETY: state is what ngx_threadpool_init made; the update's payload
    // outlives the call, and err is an empty writer, as the module passes
    // them.
    let rc = unsafe { ngx_threadpool_update(state, &update, err.ptr()) };
    (rc, err.buf)
}

fn error_text(p: &[u8]) -> String {
    with_task(p, &[], |t| t.args::<String>().unwrap())
}

fn call(state: *mut c_void, arg: &'static str) -> (c_int, Vec<u8>) {
    run(
        state,
        &payload(&[Some(V::Str(arg))]),
        &AtomicBool::new(false),
        usize::MAX,
    )
}

#[test]
fn a_state_serves_tasks_and_survives_panics() {
    let (rc, state, _) = start::<State>(Some("cfg"));
    assert_eq!(rc, status::OK);
    assert_eq!(lines(), [(level::WARN, r#"up #3 Some("cfg")"#.to_string())]);

    let (rc, out) = call(state, "abc");
    assert_eq!(rc, status::OK);
    with_task(&out, &[], |t| {
        assert_eq!(t.args::<(&str, u64, bool)>().unwrap(), ("abc", 1, false));
    });
    assert_eq!(lines(), [(level::DEBUG, "call 1".to_string())]);

    let (rc, out) = call(state, "panic");
    assert_eq!(rc, status::ERROR);
    assert_eq!(error_text(&out), "panic: asked to");

    let (rc, out) = call(state, "fail");
    assert_eq!(rc, status::ERROR);
    assert_eq!(error_text(&out), "asked to fail");

    let (rc, out) = run(
        state,
        &payload(&[Some(V::Int(1))]),
        &AtomicBool::new(false),
        usize::MAX,
    );
    assert_eq!(rc, status::ERROR);
    assert_eq!(
        error_text(&out),
        "bad argument #1: expected a borrowed string, got 1"
    );

    // the state lived through the panic: 3 calls got past their
    // arguments
    let cancelled = AtomicBool::new(true);
    let (rc, out) = run(
        state,
        &payload(&[Some(V::Str("c"))]),
        &cancelled,
        usize::MAX,
    );
    assert_eq!(rc, status::OK);
    with_task(&out, &[], |t| {
        assert_eq!(t.args::<(&str, u64, bool)>().unwrap(), ("c", 4, true));
    });

    // a result the module cannot take: an error instead, out not mixed
    let (rc, out) = run(state, &payload(&[Some(V::Str("big"))]), &cancelled, 60);
    assert_eq!(rc, status::ERROR);
    assert_eq!(error_text(&out), "results too large (or out of memory)");

    lines();
    // SAFETY: state is what ngx_threadpool_init made, freed only here, once,
    // as the module frees it.
    unsafe { ngx_threadpool_free(state) };
    assert_eq!(lines(), [(level::INFO, "dropped after 5".to_string())]);
}

#[test]
fn init_errors_and_panics_are_the_error_payload() {
    let (rc, _, err) = start::<State>(Some("fail"));
    assert_eq!(rc, status::ERROR);
    assert_eq!(error_text(&err), "cannot start up");
    let (rc, _, err) = start::<State>(Some("panic"));
    assert_eq!(rc, status::ERROR);
    assert_eq!(error_text(&err), "panic: init panics");
}

#[test]
fn a_panic_in_drop_is_logged() {
    let (rc, state, _) = start::<State>(Some("panic in drop"));
    assert_eq!(rc, status::OK);
    lines();
    // SAFETY: state is what ngx_threadpool_init made, freed only here, once,
    // as the module frees it.
    unsafe { ngx_threadpool_free(state) };
    assert_eq!(
        lines(),
        [
            (level::INFO, "dropped after 0".to_string()),
            (level::ERR, "freeing the state: panic: in drop".to_string())
        ]
    );
}

#[test]
fn updates_reach_the_state_and_their_failures_leave_it() {
    let (rc, state, _) = start::<State>(None);
    assert_eq!(rc, status::OK);
    lines();

    let set = payload(&[Some(V::Str("set")), Some(V::Int(10)), None]);
    assert_eq!(apply(state, 5, &set), (status::OK, Vec::new()));
    assert_eq!(lines(), [(level::INFO, "version 5 set of 3".to_string())]);
    let (_, out) = call(state, "x");
    with_task(&out, &[], |t| {
        assert_eq!(t.args::<(&str, u64, bool)>().unwrap(), ("x", 11, false));
    });

    let failing = [
        (payload(&[Some(V::Str("fail"))]), "version 6 refused"),
        (payload(&[Some(V::Str("panic"))]), "panic: update panics"),
        (
            payload(&[Some(V::Int(1))]),
            "bad argument #1: expected a borrowed string, got 1",
        ),
        (
            payload(&[Some(V::Str("set")), None, Some(V::Bool(true))]),
            "bad argument #3: expected at most 2 arguments, got boolean",
        ),
        // an update's strings are copied: a span is not a payload's
        (
            payload(&[Some(V::Span(0))]),
            "bad payload: bad borrowed string",
        ),
    ];
    for (p, text) in failing {
        let (rc, err) = apply(state, 6, &p);
        assert_eq!((rc, error_text(&err)), (status::ERROR, text.to_string()));
    }
    // the failed updates left the state as it was
    let (_, out) = call(state, "y");
    with_task(&out, &[], |t| {
        assert_eq!(t.args::<(&str, u64, bool)>().unwrap(), ("y", 12, false));
    });
    // SAFETY: state is what ngx_threadpool_init made, freed only here, once,
    // as the module frees it.
    unsafe { ngx_threadpool_free(state) };
}

#[test]
fn the_default_update_refuses() {
    let (rc, state, _) = start::<Fixed>(None);
    assert_eq!(rc, status::OK);
    let p = payload(&[]);
    let update = ngx_tp_update_t {
        version: 1,
        args: bytes_of(&p),
    };
    let mut err = Out::new(usize::MAX);
    // SAFETY: state is what init::<Fixed> made, the update's payload
    // outlives the call, err is an empty writer; state is freed once.
    let rc = unsafe {
        let rc = crate::__private::update::<Fixed>(state, &update, err.ptr());
        crate::__private::free::<Fixed>(state);
        rc
    };
    assert_eq!(
        (rc, error_text(&err.buf)),
        (status::ERROR, NO_UPDATES.to_string())
    );
}
