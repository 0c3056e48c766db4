//! Operating-system set-up of the threads the module starts.

use super::sys;

/// Blocks every asynchronous signal in the calling thread, as nginx's own
/// thread pools do: nginx's handlers only set flags that the event loop
/// reads when epoll_wait is interrupted, so a QUIT or HUP delivered to a
/// pool thread instead would go unnoticed until the next event.
pub fn block_async_signals() {
    // SAFETY: plain libc calls on a local, zero-initialised sigset_t.
    unsafe {
        let mut set: sys::sigset_t = std::mem::zeroed();
        sys::sigfillset(&mut set);
        for sig in [sys::SIGILL, sys::SIGFPE, sys::SIGSEGV, sys::SIGBUS] {
            sys::sigdelset(&mut set, sig as i32);
        }
        sys::pthread_sigmask(sys::SIG_BLOCK as i32, &set, std::ptr::null_mut());
    }
}

/// Raises the calling thread's nice value by `by` (Linux schedules threads
/// individually, so this leaves the event loop's priority alone).
pub fn lower_priority(by: i32) {
    // SAFETY: get/setpriority on the calling thread's own id; failure only
    // leaves the priority as it was.
    unsafe {
        let tid = sys::gettid() as sys::id_t;
        let now = sys::getpriority(sys::__priority_which_PRIO_PROCESS, tid);
        sys::setpriority(sys::__priority_which_PRIO_PROCESS, tid, now + by);
    }
}
