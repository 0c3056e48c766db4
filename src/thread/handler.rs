//! The seam between a pool thread's loop (thread/run.rs) and its
//! handler, of whichever kind its pool runs: a Lua state (vm/) or a
//! native library's state (native/). The loop
//! builds one handler per thread, runs tasks on it, lets go of result
//! strings the event loop read in place, collects garbage when idle and
//! rebuilds it after it ran out of memory; it never asks which kind it
//! has.

use crate::codec::Span;
use crate::conf::settings::Settings;
use crate::handoff::outcome::{Cancel, PinKey, Ran};
use crate::handoff::update::Code;
use crate::native;
use crate::ngx::log::Log;
use crate::vm::{self, ThreadVm};

/// What a thread needs to build its handler; cloned into every thread.
#[derive(Clone)]
pub struct Spec {
    /// The pool's name, as configured.
    pub name: String,
    pub log: Option<Log>,
    pub settings: Settings,
    pub kind: Kind,
}

/// The kind of handler a pool runs, with what building it takes.
#[derive(Clone)]
pub enum Kind {
    Lua(Box<vm::Spec>),
    Native(native::Spec),
}

/// The error of an update with code to a native pool.
pub const NATIVE_CODE: &str = "a native pool's code is its library: an update cannot replace it";

/// One thread's handler; only that thread uses it.
pub enum Handler {
    Lua(ThreadVm),
    Native(native::State),
}

impl Handler {
    /// Builds thread `thread`'s handler, with the handler `code` an update
    /// set instead of the configuration's if given: the error text when
    /// the pool cannot serve.
    pub fn build(spec: &Spec, thread: usize, code: Option<&Code>) -> Result<Handler, String> {
        match (&spec.kind, code) {
            (Kind::Lua(lua), None) => {
                ThreadVm::new(lua, &spec.name, spec.log, spec.settings.zero_copy).map(Handler::Lua)
            }
            (Kind::Lua(lua), Some(code)) => {
                let process = vm::chunk::Chunk {
                    code: code.code.to_vec(),
                    name: format!("=update {}", code.version),
                };
                let style = vm::chunk::check(&process)?;
                let lua = vm::Spec {
                    process,
                    style,
                    ..lua.as_ref().clone()
                };
                ThreadVm::new(&lua, &spec.name, spec.log, spec.settings.zero_copy).map(Handler::Lua)
            }
            (Kind::Native(_), Some(_)) => Err(NATIVE_CODE.into()),
            (Kind::Native(native), None) => {
                native::State::new(native, &spec.name, spec.log, thread).map(Handler::Native)
            }
        }
    }

    /// Applies update `version`, whose arguments are `args` (encoded), to
    /// this state: its error, if it failed.
    pub fn update(&self, version: u64, args: &[u8]) -> Result<(), String> {
        match self {
            Handler::Lua(vm) => vm.update(args),
            Handler::Native(state) => state.update(version, args),
        }
    }

    /// Runs one task with the encoded arguments `args` (borrowing
    /// `spans`): its results, or its error value, go to `out` and
    /// `out_spans`. `cancel` tells whether the task's caller gave up.
    ///
    /// # Safety
    /// The bytes of `spans` must be alive until this returns.
    pub unsafe fn run(
        &self,
        args: &[u8],
        spans: &[Span],
        out: &mut Vec<u8>,
        out_spans: &mut Vec<Span>,
        cancel: &Cancel,
    ) -> Ran {
        match self {
            // SAFETY: the bytes of `spans` are alive until this returns (the
            // contract), and the VM is this thread's.
            Handler::Lua(vm) => unsafe { vm.run(args, spans, out, out_spans, cancel) },
            // SAFETY: the bytes of `spans` are alive until this returns (the
            // contract), and the state is this thread's. Its results borrow
            // nothing: out_spans stays empty.
            Handler::Native(state) => Ran::from(unsafe { state.run(args, spans, out, cancel) }),
        }
    }

    /// Whether the handler applies updates' arguments (a Lua pool's
    /// update chunk, a native library's ngx_threadpool_update).
    pub fn takes_updates(&self) -> bool {
        match self {
            Handler::Lua(vm) => vm.takes_updates(),
            Handler::Native(state) => state.takes_updates(),
        }
    }

    /// Lets go of the result strings pinned under `key`; false if this
    /// handler holds none under it.
    pub fn unpin(&self, key: PinKey) -> bool {
        match self {
            Handler::Lua(vm) => vm.unpin(key),
            Handler::Native(_) => false,
        }
    }

    /// Whether some result strings of this handler are still read in
    /// place.
    pub fn has_pins(&self) -> bool {
        match self {
            Handler::Lua(vm) => vm.has_pins(),
            Handler::Native(_) => false,
        }
    }

    /// Gives back what the handler no longer uses, when the thread goes
    /// idle after large payloads: an error it met, if any.
    pub fn collect(&self) -> Result<(), String> {
        match self {
            Handler::Lua(vm) => vm.collect_garbage(),
            // Its memory is the library's own business.
            Handler::Native(_) => Ok(()),
        }
    }
}
