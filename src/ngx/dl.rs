//! Shared objects loaded at run time (native handlers): dlopen, dlsym,
//! dlclose, with dlerror's text as the error.
//!
//! A library is opened by file descriptor, as `/proc/self/fd/N`. glibc's
//! dlopen returns an object already loaded under the same name
//! (elf/dl-load.c, `_dl_map_object` compares the name with each loaded
//! object's before opening anything), and during a reload the master still
//! holds the old cycle's library: a new file renamed over the old path
//! would not be loaded under that path. A descriptor's number is unique
//! among the open ones, so the name is new.
//!
//! But when a new name's file has the device and inode of a loaded object,
//! glibc shares that object (`_dl_file_id_match_p`) and adds the name to
//! its aliases; once that descriptor is closed, its number comes back for
//! another file, whose name then matches the alias: the old library again
//! (seen after three reloads without a change, then a rename). So each
//! file loaded is recorded (`LOADED`) with the descriptor it was first
//! loaded through, and opened again under that name: glibc matches the
//! name, adds no alias, and the number stays taken while the object is
//! loaded.

use super::sys;
use std::ffi::{c_void, CStr, CString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

/// A loaded shared object. dlclose'd on drop: its owner keeps it while
/// any code of it may run.
pub struct Dl {
    handle: NonNull<c_void>,
    file: Arc<Loaded>,
}

// SAFETY: a dlopen handle is process-wide; dlsym and dlclose may be called
// from any thread (glibc serializes them under its loader lock).
unsafe impl Send for Dl {}
// SAFETY: &Dl only allows dlsym, which glibc serializes under its loader lock,
// on a process-wide handle.
unsafe impl Sync for Dl {}

/// A file loaded through `/proc/self/fd/N`, N being `file`'s descriptor,
/// kept open while the object may be loaded.
struct Loaded {
    dev: u64,
    ino: u64,
    file: File,
}

impl Loaded {
    fn name(&self) -> String {
        format!("/proc/self/fd/{}", self.file.as_raw_fd())
    }
}

/// Every file loaded and not known to be unloaded (see the module
/// comment). The loader's own callers: configuration reading (one thread)
/// and the drops of handles (any thread).
static LOADED: Mutex<Vec<Arc<Loaded>>> = Mutex::new(Vec::new());

const FLAGS: i32 = (sys::RTLD_NOW | sys::RTLD_LOCAL) as i32;

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
        let meta = file.metadata().map_err(|e| e.to_string())?;
        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        let known = loaded
            .iter()
            .find(|l| l.dev == meta.dev() && l.ino == meta.ino())
            .cloned();
        // a file loaded before: under its first name (this descriptor
        // closes on return)
        let entry = known.unwrap_or_else(|| {
            Arc::new(Loaded {
                dev: meta.dev(),
                ino: meta.ino(),
                file,
            })
        });
        let name = entry.name();
        let c_name = CString::new(name.clone()).map_err(|e| e.to_string())?;
        // SAFETY: c_name is a NUL-terminated path; loading runs the
        // library's constructors, which is what loading a handler means.
        let handle = unsafe { sys::dlopen(c_name.as_ptr(), FLAGS) };
        let Some(handle) = NonNull::new(handle) else {
            return Err(last_error().replace(&name, &path.display().to_string()));
        };
        if !loaded.iter().any(|l| Arc::ptr_eq(l, &entry)) {
            loaded.push(entry.clone());
        }
        Ok(Dl {
            handle,
            file: entry,
        })
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
        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: handle is live and dropped once; its owner guarantees no
        // code of the library runs any more (see the struct's doc).
        unsafe { sys::dlclose(self.handle.as_ptr()) };
        // The record goes with the last handle, unless the object stays
        // loaded anyway (glibc keeps one whose thread-local destructors
        // are pending): then its name and descriptor stay taken for good.
        if Arc::strong_count(&self.file) > 2 {
            return;
        }
        let still = CString::new(self.file.name()).is_ok_and(|name| {
            // SAFETY: a NUL-terminated name; RTLD_NOLOAD loads nothing and
            // takes a reference only to an object still loaded, given back
            // at once.
            let h = unsafe { sys::dlopen(name.as_ptr(), FLAGS | sys::RTLD_NOLOAD as i32) };
            if !h.is_null() {
                // SAFETY: the reference just taken.
                unsafe { sys::dlclose(h) };
            }
            !h.is_null()
        });
        if !still {
            loaded.retain(|l| !Arc::ptr_eq(l, &self.file));
        }
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
    // SAFETY: e is the non-null string dlerror just returned, valid until the
    // next dl call on this thread, which comes after the copy.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}
