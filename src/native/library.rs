//! A native handler library, loaded when the configuration is read so
//! that `nginx -t` checks it: the file, its four exports and the optional
//! fifth (`ngx_threadpool_update`), its ABI version.

use super::abi::{AbiVersionFn, FreeFn, InitFn, ProcessFn, UpdateFn};
use crate::ngx::dl::Dl;
use ngx_threadpool_wire as wire;
use std::ffi::CStr;
use std::fmt;
use std::path::Path;

/// A loaded library and its exports. Held by its pool's configuration and
/// by each thread's handler spec (Arc): it is closed once the last of them
/// is gone, so never under a thread that still runs its code, a thread
/// left running at exit included.
pub struct Library {
    pub path: String,
    pub init: InitFn,
    pub process: ProcessFn,
    pub free: FreeFn,
    /// None when the library leaves it out: its pool takes no updates.
    pub update: Option<UpdateFn>,
    /// Last: the functions above point into it.
    _dl: Dl,
}

/// What an update of a pool whose library has no `ngx_threadpool_update`
/// gets, after `the library "PATH" ` (Library::no_updates).
pub const NO_UPDATES: &str = "has no ngx_threadpool_update: its pool takes no updates";

/// Why a library cannot be a handler; each names the library.
#[derive(Debug)]
pub enum LoadError {
    /// The file cannot be opened or loaded (dlerror's text).
    Open {
        path: String,
        text: String,
    },
    Symbol {
        path: String,
        symbol: &'static str,
    },
    Abi {
        path: String,
        found: u32,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            LoadError::Open { path, text } => write!(f, "cannot load \"{path}\": {text}"),
            LoadError::Symbol { path, symbol } => {
                write!(f, "cannot load \"{path}\": it has no symbol \"{symbol}\"")
            }
            LoadError::Abi { path, found } => write!(
                f,
                "cannot load \"{path}\": it is built for handler ABI version {found}, \
                 this module runs versions {} to {}",
                wire::ABI_VERSION_MIN,
                wire::ABI_VERSION
            ),
        }
    }
}

impl Library {
    pub fn load(path: &Path) -> Result<Library, LoadError> {
        let shown = path.display().to_string();
        let dl = Dl::open(path).map_err(|text| LoadError::Open {
            path: shown.clone(),
            text,
        })?;
        let symbol = |name: &'static CStr| {
            dl.symbol(name).map_err(|_| LoadError::Symbol {
                path: shown.clone(),
                symbol: name.to_str().unwrap_or("?"),
            })
        };
        let version = symbol(c"ngx_threadpool_abi_version")?;
        let (init, process, free) = (
            symbol(c"ngx_threadpool_init")?,
            symbol(c"ngx_threadpool_process")?,
            symbol(c"ngx_threadpool_free")?,
        );
        // optional: its absence is no error
        let update = dl.symbol(c"ngx_threadpool_update").ok();
        // SAFETY: the header declares these exports with these signatures;
        // a library exporting the names with other types breaks its
        // contract (as a C caller of it would find).
        let (version, init, process, free, update) = unsafe {
            (
                std::mem::transmute::<*mut std::ffi::c_void, AbiVersionFn>(version.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, InitFn>(init.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, ProcessFn>(process.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, FreeFn>(free.as_ptr()),
                update.map(|u| std::mem::transmute::<*mut std::ffi::c_void, UpdateFn>(u.as_ptr())),
            )
        };
        // SAFETY: the header declares ngx_threadpool_abi_version as taking
        // nothing and returning the ABI's version; the library stays loaded
        // (dl) across the call.
        let found = unsafe { version() };
        if !(wire::ABI_VERSION_MIN..=wire::ABI_VERSION).contains(&found) {
            return Err(LoadError::Abi { path: shown, found });
        }
        Ok(Library {
            path: shown,
            init,
            process,
            free,
            update,
            _dl: dl,
        })
    }

    /// Whether the library exports `ngx_threadpool_update`: without it,
    /// its pool takes no updates.
    pub fn takes_updates(&self) -> bool {
        self.update.is_some()
    }

    /// The error of an update sent to this library's pool when it takes
    /// none.
    pub fn no_updates(&self) -> String {
        format!("the library \"{}\" {NO_UPDATES}", self.path)
    }
}
