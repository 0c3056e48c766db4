//! A live update: what [`Handler::update`](crate::Handler::update) gets.

use crate::args::{ArgError, ArgList};
use crate::de::Spans;
use crate::ffi::{self, ngx_tp_update_t};
use serde::Deserialize;

/// A live update of the pool (`tp.NAME:update(...)` on the Lua side): a
/// version and the arguments it was sent with, the whole of the new state
/// (see [`Handler::update`](crate::Handler::update)).
///
/// `'a` is the call's life: strings read as `&'a str` or `&'a [u8]`
/// borrow from the module's copy of the arguments and cannot outlive it.
pub struct Update<'a> {
    version: u64,
    list: ArgList<'a>,
}

impl<'a> Update<'a> {
    /// Reads the payload's layout (not its values).
    ///
    /// # Safety
    /// `raw`'s payload must stay alive and unchanged for `'a`.
    pub(crate) unsafe fn new(raw: &'a ngx_tp_update_t) -> Result<Update<'a>, ArgError> {
        // SAFETY: raw's payload stays alive and unchanged for 'a (the
        // contract), as long as the slice borrows it.
        let payload = unsafe { ffi::bytes(raw.args) };
        Ok(Update {
            version: raw.version,
            // an update's arguments are copied: no borrowed strings
            list: ArgList::new(payload, Spans(&[]))?,
        })
    }

    /// The update's version: larger than that of any update before it.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The number of arguments the update was sent with, trailing nils
    /// included (Lua's `select('#', ...)`).
    pub fn nargs(&self) -> usize {
        self.list.nargs()
    }

    /// All the arguments, read as [`Task::args`](crate::Task::args) reads
    /// a task's: a tuple, a tuple struct or a `Vec` one per argument, any
    /// other type the first argument alone. The same errors, naming the
    /// argument.
    ///
    /// ```
    /// # use ngx_threadpool_handler::{ArgError, Update};
    /// fn limits(update: &Update) -> Result<(u32, Option<u32>), ArgError> {
    ///     update.args()
    /// }
    /// ```
    pub fn args<T: Deserialize<'a>>(&self) -> Result<T, ArgError> {
        self.list.args()
    }

    /// The argument at `position`, from 1, as [`Task::arg`](crate::Task::arg)
    /// reads a task's.
    pub fn arg<T: Deserialize<'a>>(&self, position: usize) -> Result<T, ArgError> {
        self.list.arg(position)
    }
}
