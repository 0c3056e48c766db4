//! What [`Handler::init`](crate::Handler::init) gets.

use crate::ffi::{self, ngx_tp_bytes_t};
use std::borrow::Cow;
use std::ffi::c_uint;

/// The thread a state is built for: [`Handler::init`](crate::Handler::init)
/// runs once on each of the pool's threads, in each nginx worker, when the
/// worker starts (and again after a reload), on the thread that will use
/// the state.
#[derive(Debug)]
pub struct Init<'a> {
    pool: Cow<'a, str>,
    config: Option<Cow<'a, str>>,
    thread: u32,
}

impl<'a> Init<'a> {
    /// # Safety
    /// `config`, unless its data is null, must be valid for `'a`.
    pub(crate) unsafe fn new(pool: &'a [u8], config: ngx_tp_bytes_t, thread: c_uint) -> Init<'a> {
        let config = (!config.data.is_null()).then(|| {
            // SAFETY: config's data is non-null (checked just above) and valid
            // for 'a (the contract).
            String::from_utf8_lossy(unsafe { ffi::bytes(config) })
        });
        Init {
            pool: String::from_utf8_lossy(pool),
            config,
            thread,
        }
    }

    /// The pool's name (`thread_pool_process_by_rust POOL ...`).
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The CONFIG argument of `thread_pool_process_by_rust POOL PATH
    /// CONFIG`, if given: any text the handler reads its settings from.
    /// Bytes that are not UTF-8 are replaced by U+FFFD.
    pub fn config(&self) -> Option<&str> {
        self.config.as_deref()
    }

    /// This thread's index in the pool, from 0.
    pub fn thread(&self) -> u32 {
        self.thread
    }
}
