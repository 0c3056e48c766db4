//! Operating-system set-up of the threads the module starts.

use super::sys;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

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

/// Linux's scheduling policies for a thread that must not delay the event
/// loop (sched(7)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// SCHED_OTHER, the event loop's own.
    Normal,
    /// SCHED_BATCH: as Normal, but never preempts a running thread on
    /// waking up.
    Batch,
    /// SCHED_IDLE: runs only when no other thread of the CPU wants it.
    Idle,
}

/// A pool thread's policy, and how much higher than the worker's its nice
/// value is (ignored by SCHED_IDLE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scheduling {
    pub policy: Policy,
    pub nice: i32,
}

impl Scheduling {
    /// The directive's words: normal, batch, idle.
    pub fn parse_policy(word: &[u8]) -> Option<Policy> {
        match word {
            b"normal" => Some(Policy::Normal),
            b"batch" => Some(Policy::Batch),
            b"idle" => Some(Policy::Idle),
            _ => None,
        }
    }
}

impl std::fmt::Display for Scheduling {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let policy = match self.policy {
            Policy::Normal => "normal",
            Policy::Batch => "batch",
            Policy::Idle => "idle",
        };
        write!(f, "{policy} nice={}", self.nice)
    }
}

/// Applies `s` to the calling thread (Linux schedules threads
/// individually, so this leaves the event loop alone). Failure leaves the
/// thread as it was and is returned.
pub fn set_scheduling(s: Scheduling) -> std::io::Result<()> {
    let policy = match s.policy {
        Policy::Normal => sys::SCHED_OTHER,
        Policy::Batch => sys::SCHED_BATCH,
        Policy::Idle => sys::SCHED_IDLE,
    };
    // SAFETY: system calls on the calling thread's own id, with a
    // sched_param that outlives the call.
    unsafe {
        let tid = sys::gettid();
        let param = sys::sched_param { sched_priority: 0 };
        if sys::sched_setscheduler(tid, policy as std::ffi::c_int, &param) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let id = tid as sys::id_t;
        let now = sys::getpriority(sys::__priority_which_PRIO_PROCESS, id);
        if sys::setpriority(sys::__priority_which_PRIO_PROCESS, id, now + s.nice) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" {
    fn malloc_trim(pad: usize) -> std::ffi::c_int;
    fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
}

const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
const M_MMAP_THRESHOLD: std::ffi::c_int = -3;

/// Fixes glibc's thresholds for the worker. By default they adapt: once a
/// freed block was mapped on its own (a 16 MiB payload), blocks up to that
/// size come from the arenas, which then keep up to twice that free for
/// good, in every thread's arena. Fixed, blocks from 4 MiB are mapped on
/// their own and unmapped when freed, and an arena keeps at most 4 MiB
/// free: payloads up to a few MiB still reuse memory (fresh pages cost
/// more than the copy), larger ones give it back.
pub fn bound_retained_memory() {
    // SAFETY: mallopt only sets allocator parameters; called once per
    // worker before its threads start.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 4 << 20);
        mallopt(M_TRIM_THRESHOLD, 4 << 20);
    }
}

/// Returns the allocator's free memory to the system, in every thread's
/// arena (glibc): after a large payload, what was freed would otherwise
/// stay in the worker's RSS for good.
pub fn give_back_free_memory() {
    // SAFETY: malloc_trim only releases free pages; it is thread-safe.
    unsafe { malloc_trim(0) };
}

/// Waits while `word` holds `seen`, at most `timeout`, as another process
/// may wake it: `word` is in shared memory (a futex keyed by the memory,
/// not the process). Returns early on a wake-up, a change or a signal.
pub fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = sys::timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: the futex call reads the aligned u32 of `word`, alive across
    // the call, and the timespec; it changes no memory.
    unsafe {
        sys::syscall(
            sys::NGX_RS_SYS_FUTEX,
            word.as_ptr(),
            sys::FUTEX_WAIT as std::ffi::c_int,
            seen,
            &raw const ts,
        );
    }
}

/// Wakes every thread, of any process, waiting on `word` (futex_wait).
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: the futex call only reads the address of `word` as a key.
    unsafe {
        sys::syscall(
            sys::NGX_RS_SYS_FUTEX,
            word.as_ptr(),
            sys::FUTEX_WAKE as std::ffi::c_int,
            std::ffi::c_int::MAX,
        );
    }
}

/// Whether process `pid` exists (a worker that held a lock in shared
/// memory may have been killed).
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { sys::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(sys::ESRCH as i32)
}

/// The calling thread's stack: its lowest address and its size (glibc's
/// pthread_getattr_np, which knows the stack of a thread it started).
pub fn own_stack() -> Option<(usize, usize)> {
    // SAFETY: attr is initialised by pthread_getattr_np before it is read
    // and destroyed once; addr and size are plain out-parameters.
    unsafe {
        let mut attr: sys::pthread_attr_t = std::mem::zeroed();
        if sys::pthread_getattr_np(sys::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let (mut addr, mut size) = (std::ptr::null_mut(), 0);
        let rc = sys::pthread_attr_getstack(&attr, &mut addr, &mut size);
        sys::pthread_attr_destroy(&mut attr);
        (rc == 0).then_some((addr as usize, size))
    }
}

/// The size of a page of memory.
pub const PAGE: usize = 4096;

/// Whether the page holding `addr`, of the caller's own stack, is in
/// memory (mincore).
pub fn resident(addr: usize) -> bool {
    let mut vec = 0u8;
    // SAFETY: mincore reads the page tables of one page-aligned page of
    // this process and writes one byte to vec.
    let rc = unsafe {
        sys::mincore(
            (addr & !(PAGE - 1)) as *mut std::ffi::c_void,
            PAGE,
            &mut vec,
        )
    };
    rc == 0 && vec & 1 == 1
}

/// Gives the pages from `from` to `to` (page-aligned, of the caller's own
/// stack, below any frame in use) back to the system: touched again, they
/// read as zero.
pub fn give_back(from: usize, to: usize) {
    if to > from {
        // SAFETY: the range is page-aligned and holds no frame in use
        // (the contract), so nothing reads what MADV_DONTNEED drops.
        unsafe {
            sys::madvise(
                from as *mut std::ffi::c_void,
                to - from,
                sys::MADV_DONTNEED as i32,
            );
        }
    }
}

/// The time of day in µs since the epoch, which every process reads alike.
pub fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

extern "C" {
    fn dlmopen(
        lmid: std::ffi::c_long,
        file: *const std::ffi::c_char,
        mode: std::ffi::c_int,
    ) -> *mut std::ffi::c_void;
    fn dlsym(
        handle: *mut std::ffi::c_void,
        symbol: *const std::ffi::c_char,
    ) -> *mut std::ffi::c_void;
    fn dlerror() -> *mut std::ffi::c_char;
}

const LM_ID_NEWLM: std::ffi::c_long = -1;
const RTLD_NOW: std::ffi::c_int = 2;

/// A shared library loaded into a link-map namespace of its own, so that
/// its globals are not the process's copy's (libpcre's allocator hooks,
/// which lua-nginx-module points at its pools while it compiles). Never
/// unloaded.
pub struct PrivateLib(usize);

impl PrivateLib {
    pub fn load(name: &std::ffi::CStr) -> Result<PrivateLib, String> {
        // SAFETY: dlmopen with a valid C string; the handle is never
        // closed, so it stays valid for the process.
        let handle = unsafe { dlmopen(LM_ID_NEWLM, name.as_ptr(), RTLD_NOW) };
        if handle.is_null() {
            // SAFETY: dlerror returns null or a C string valid until the
            // next dl call on this thread.
            let why = unsafe { dlerror() };
            let why = if why.is_null() {
                "unknown error".into()
            } else {
                // SAFETY: non-null, NUL-terminated (above).
                unsafe { std::ffi::CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("cannot load {}: {why}", name.to_string_lossy()));
        }
        Ok(PrivateLib(handle as usize))
    }

    /// The address of `name` in this copy.
    pub fn symbol(&self, name: &std::ffi::CStr) -> Option<std::ptr::NonNull<std::ffi::c_void>> {
        // SAFETY: a handle from dlmopen that is never closed.
        std::ptr::NonNull::new(unsafe { dlsym(self.0 as *mut std::ffi::c_void, name.as_ptr()) })
    }
}

/// The address of `name` in the process's global scope, where nginx loads
/// its modules.
pub fn global_symbol(name: &std::ffi::CStr) -> Option<std::ptr::NonNull<std::ffi::c_void>> {
    // SAFETY: RTLD_DEFAULT (null) with a valid C string.
    std::ptr::NonNull::new(unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_copy_has_its_own_globals() {
        // PCRE2, which nginx links on every Debian release
        let lib = PrivateLib::load(c"libpcre2-8.so.0").expect("libpcre2-8.so.0");
        let private = lib
            .symbol(c"pcre2_config_8")
            .expect("private pcre2_config_8");
        let shared = PrivateLib::load(c"libpcre2-8.so.0")
            .expect("libpcre2-8.so.0")
            .symbol(c"pcre2_config_8")
            .expect("second pcre2_config_8");
        // each namespace has its own copy of the library, data included
        assert_ne!(private, shared);
    }
}
