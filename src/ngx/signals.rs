//! Signal masks for threads the module starts.

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
