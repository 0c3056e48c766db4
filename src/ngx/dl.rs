//! Shared objects loaded at run time (native handlers): dlopen, dlsym,
//! dlclose, with dlerror's text as the error.
//!
//! A library is opened by file descriptor, as `/proc/self/fd/N`, with the
//! descriptor held for the handle's life. glibc's dlopen returns an object
//! already loaded under the same name (elf/dl-load.c, `_dl_map_object`
//! compares the name with each loaded object's before opening anything),
//! and during a reload the master still holds the old cycle's library: a
//! new file renamed over the old path would not be loaded under that path.
//! An open descriptor's number is unique among the open ones, so the name
//! is new; glibc then still shares the mapping of an object whose device
//! and inode match one loaded (`_dl_file_id_match_p`), which is right: the
//! same file is the same code.

use super::sys;
use std::ffi::{c_void, CStr, CString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

/// A loaded shared object. dlclose'd on drop: its owner keeps it while
/// any code of it may run.
pub struct Dl {
    handle: NonNull<c_void>,
    /// The descriptor behind the handle's name (see the module comment).
    _file: File,
}

// SAFETY: a dlopen handle is process-wide; dlsym and dlclose may be called
// from any thread (glibc serializes them under its loader lock).
unsafe impl Send for Dl {}
// SAFETY: as above; &Dl only allows dlsym.
unsafe impl Sync for Dl {}

impl Dl {
    /// Opens `path` (RTLD_NOW: missing symbols are found now, not at a
    /// task; RTLD_LOCAL: two handler libraries exporting the same names do
    /// not bind to each other's). The error names `path`, not the
    /// descriptor.
    pub fn open(path: &Path) -> Result<Dl, String> {
        let file = File::open(path).map_err(|e| {
            // io::Error's text without its " (os error N)".
            let text = e.to_string();
            match text.find(" (os error") {
                Some(i) => text[..i].to_string(),
                None => text,
            }
        })?;
        let name = format!("/proc/self/fd/{}", file.as_raw_fd());
        let c_name = CString::new(name.clone()).map_err(|e| e.to_string())?;
        // SAFETY: c_name is a NUL-terminated path; loading runs the
        // library's constructors, which is what loading a handler means.
        let handle =
            unsafe { sys::dlopen(c_name.as_ptr(), (sys::RTLD_NOW | sys::RTLD_LOCAL) as i32) };
        match NonNull::new(handle) {
            Some(handle) => Ok(Dl {
                handle,
                _file: file,
            }),
            None => Err(last_error().replace(&name, &path.display().to_string())),
        }
    }

    /// The address of `symbol`, or dlerror's text.
    pub fn symbol(&self, symbol: &CStr) -> Result<NonNull<c_void>, String> {
        // SAFETY: handle is a live dlopen handle; symbol is NUL-terminated.
        let p = unsafe { sys::dlsym(self.handle.as_ptr(), symbol.as_ptr()) };
        NonNull::new(p).ok_or_else(last_error)
    }
}

impl Drop for Dl {
    fn drop(&mut self) {
        // SAFETY: handle is live and dropped once; its owner guarantees no
        // code of the library runs any more (see the struct's doc).
        unsafe { sys::dlclose(self.handle.as_ptr()) };
    }
}

/// dlerror's text. Configuration is read on one thread, and the library's
/// calls run only after it is loaded, so no other dl call comes between.
fn last_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until
    // the next dl call on this thread.
    let e = unsafe { sys::dlerror() };
    if e.is_null() {
        return "unknown dlerror".into();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}
