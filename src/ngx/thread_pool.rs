//! nginx's `thread_pool NAME threads=N max_queue=M` declarations.
//!
//! `ngx_thread_pool_t` is private to ngx_thread_pool.c; the mirror below
//! repeats its layout (nginx 1.22, stable since 1.7.11) and every read is
//! checked by comparing the mirrored `name` with the name asked for.

use super::sys;

#[repr(C)]
struct Mirror {
    mtx: sys::ngx_thread_mutex_t,
    queue_first: *mut sys::ngx_thread_task_t,
    queue_last: *mut *mut sys::ngx_thread_task_t,
    waiting: sys::ngx_int_t,
    cond: sys::ngx_thread_cond_t,
    log: *mut sys::ngx_log_t,
    name: sys::ngx_str_t,
    threads: sys::ngx_uint_t,
    max_queue: sys::ngx_int_t,
    file: *mut u8,
    line: sys::ngx_uint_t,
}

/// A declared pool, as `ngx_thread_pool_add` returns it.
pub struct ThreadPool(*mut sys::ngx_thread_pool_t);

impl ThreadPool {
    /// Finds or adds the pool `name`, as `aio threads=NAME` does: an
    /// undeclared name makes nginx fail with "unknown thread pool" and the
    /// directive's file and line.
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed.
    pub unsafe fn add(cf: *mut sys::ngx_conf_t, name: &[u8]) -> Option<ThreadPool> {
        let mut s = sys::ngx_str_t {
            len: name.len(),
            data: name.as_ptr() as *mut u8,
        };
        // SAFETY: nginx copies nothing and keeps s.data; name comes from the
        // directive's arguments, which live in the cycle's pool.
        let tp = unsafe { sys::ngx_thread_pool_add(cf, &mut s) };
        (!tp.is_null()).then_some(ThreadPool(tp))
    }

    fn mirror(&self, expect: &[u8]) -> Result<*mut Mirror, String> {
        let m = self.0.cast::<Mirror>();
        // SAFETY: tp points to a live ngx_thread_pool_t in the cycle's pool;
        // if the layout differed, the name check below fails instead of
        // trusting the other fields.
        let name = unsafe { super::str_bytes(&(*m).name) };
        if name != expect {
            return Err(format!(
                "thread pool layout mismatch: expected name \"{}\", found \"{}\"",
                String::from_utf8_lossy(expect),
                String::from_utf8_lossy(name)
            ));
        }
        Ok(m)
    }

    /// Takes the pool from nginx: returns (threads, max_queue) as declared.
    /// nginx keeps the struct but no thread of its own ever serves it, so a
    /// task nginx posted to it would wait forever. Hence:
    /// - its thread count becomes 0: the worker starts no idle threads;
    /// - its name becomes empty: what looks pools up by name at run time
    ///   (`aio threads=$var`, `ngx.run_worker_thread`) finds no such pool
    ///   and fails at once (`aio threads=NAME` is refused at `nginx -t`);
    /// - its queue bound becomes 0: a post that still reaches it fails at
    ///   once with nginx's "queue overflow" error.
    pub fn take(&self, name: &[u8]) -> Result<(usize, usize), String> {
        let m = self.mirror(name)?;
        // SAFETY: checked by mirror(); runs in the master before workers
        // fork, when nothing else reads the struct.
        unsafe {
            let threads = (*m).threads;
            let max_queue = (*m).max_queue.max(1) as usize;
            (*m).threads = 0;
            (*m).max_queue = 0;
            (*m).name.len = 0;
            Ok((threads, max_queue))
        }
    }

    /// The threads declared so far (None before the declaration).
    pub fn declared_threads(&self, name: &[u8]) -> Option<usize> {
        let m = self.mirror(name).ok()?;
        // SAFETY: checked by mirror(); the configuration is being read in
        // the master, where nothing else writes the struct.
        let threads = unsafe { (*m).threads };
        (threads > 0).then_some(threads)
    }

    /// Declares the pool as nginx's `thread_pool NAME threads=N
    /// max_queue=M` would, from the http block; an error if it already is.
    pub fn declare(&self, name: &[u8], threads: usize, max_queue: usize) -> Result<(), String> {
        let m = self.mirror(name)?;
        // SAFETY: checked by mirror(); the configuration is being parsed in
        // the master, where nothing else reads the struct.
        unsafe {
            if (*m).threads != 0 {
                return Err(format!(
                    "thread pool \"{}\" is already declared",
                    String::from_utf8_lossy(name)
                ));
            }
            (*m).threads = threads as sys::ngx_uint_t;
            (*m).max_queue = max_queue as sys::ngx_int_t;
        }
        Ok(())
    }

    /// Whether `other` (an `aio threads` setting) is this pool.
    pub fn is(&self, other: *mut sys::ngx_thread_pool_t) -> bool {
        self.0 == other
    }
}
