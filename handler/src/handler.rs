//! The contract a handler library implements: the [`Handler`] trait.

use crate::{Error, Init, IntoResults, Task, Update};

/// What [`Handler::update`]'s default returns.
pub(crate) const NO_UPDATES: &str = "this handler takes no updates (Handler::update)";

/// A native handler: the state of one pool thread, built on that thread by
/// [`init`](Handler::init), which gets each of its tasks through
/// [`process`](Handler::process). [`export!`](crate::export)`(Type)`
/// makes an implementation the library's C exports.
///
/// * **One per thread.** `init` runs on each of the pool's threads, in
///   each nginx worker, when the worker starts (and again after a reload),
///   on the thread that will use the state; `process` runs that thread's
///   tasks one at a time. The state never leaves its thread: it need not
///   be `Send` or `Sync`, and needs no locks. It is dropped when the
///   thread exits (worker exit, reload); a panic in its `Drop` is logged.
/// * **Errors.** An `Err(e)` from `process` gives the task's caller
///   `nil, e` (its `Display` text). An `Err(e)` from `init` makes the pool
///   unusable on that thread: the error log says
///   `thread pool "NAME" thread #N: e`, and the thread's tasks get
///   `nil, 'thread pool "NAME" is not usable: e'`.
/// * **Panics** are caught: a panic in `process` gives the caller
///   `nil, "panic: <message>"`, and the thread keeps serving with the state
///   as the panic left it; a panic in `init` is `init`'s error
///   `panic: <message>` (so the tasks get
///   `nil, 'thread pool "NAME" is not usable: panic: <message>'`).
/// * **Stack overflow** is not caught: past its thread's stack
///   (`thread_pool_stack_size`, 64 MiB by default), a recursion hits the
///   guard page and Rust aborts the process, the nginx worker, as in any
///   Rust program. Bound recursion on user data (an explicit `Vec` as the
///   stack).
/// * **Live updates** (`tp.NAME:update(...)`, optional): `update` runs on
///   each thread's state between two of its tasks, on the thread that owns
///   it, with the update's version and arguments. An update carries the
///   whole new state, not a change to the previous one: a thread that
///   starts later gets `init` and then only the latest update. An `Err` or
///   a panic leaves the thread at its previous version, serving the state
///   as `update` left it, and the failure is reported: so check and build
///   everything first, and change the state only once nothing can fail.
///   The default refuses every update.
///
/// ```
/// use ngx_threadpool_handler::{export, Error, Handler, Init, Task};
///
/// struct Counter {
///     tasks: u64,
/// }
///
/// impl Handler for Counter {
///     type Output<'t> = (&'t str, u64);
///
///     fn init(_: &Init) -> Result<Self, Error> {
///         Ok(Counter { tasks: 0 })
///     }
///
///     /// `push_task(s)` returns `{s, tasks}`: `s` borrowed, not copied.
///     fn process<'t>(&mut self, task: &Task<'t>) -> Result<(&'t str, u64), Error> {
///         let s: &str = task.args()?;
///         self.tasks += 1;
///         Ok((s, self.tasks))
///     }
/// }
///
/// export!(Counter);
/// ```
///
/// A signature other than the trait's is the compiler's usual error on
/// the `impl` (here E0053, "method `process` has an incompatible type for
/// trait"):
///
/// ```compile_fail,E0053
/// # use ngx_threadpool_handler::{Error, Handler, Init, Task};
/// struct Counter;
///
/// impl Handler for Counter {
///     type Output<'t> = String;
///
///     fn init(_: &Init) -> Result<Self, Error> {
///         Ok(Counter)
///     }
///
///     fn process<'t>(&mut self, task: &mut Task<'t>) -> Result<String, Error> {
///         Ok(task.args()?)
///     }
/// }
/// ```
pub trait Handler: Sized {
    /// What `process` returns in `Ok`: any [`Serialize`](serde::Serialize)
    /// value is one result, [`Values`](crate::Values) several (see
    /// [`IntoResults`]). A bare tuple is one result, a Lua table: `(a, b)`
    /// gives the caller `{a, b}`, `Values((a, b))` gives `a, b`. It may borrow from the task's arguments (`'t`),
    /// as `&'t str` read with [`Task::args`] does.
    type Output<'t>: IntoResults;

    /// Builds the state of the thread `init` describes (its pool, CONFIG
    /// and index).
    fn init(init: &Init) -> Result<Self, Error>;

    /// Runs one task on this thread's state.
    fn process<'t>(&mut self, task: &Task<'t>) -> Result<Self::Output<'t>, Error>;

    /// Makes this thread's state the one `update` describes, between two
    /// tasks: `Ok` once it is, `Err` (before changing anything) to keep
    /// the previous one. The default returns
    /// `Err("this handler takes no updates (Handler::update)")`.
    fn update(&mut self, update: &Update<'_>) -> Result<(), Error> {
        let _ = update;
        Err(NO_UPDATES.into())
    }
}
