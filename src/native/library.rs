//! A native handler library, loaded when the configuration is read so
//! that `nginx -t` checks it: the file, its four exports, its ABI version.

use super::abi::{AbiVersionFn, FreeFn, InitFn, ProcessFn};
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
    /// Last: the functions above point into it.
    _dl: Dl,
}

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
        // SAFETY: the header declares these exports with these signatures;
        // a library exporting the names with other types breaks its
        // contract (as a C caller of it would find).
        let (version, init, process, free) = unsafe {
            (
                std::mem::transmute::<*mut std::ffi::c_void, AbiVersionFn>(version.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, InitFn>(init.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, ProcessFn>(process.as_ptr()),
                std::mem::transmute::<*mut std::ffi::c_void, FreeFn>(free.as_ptr()),
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
            _dl: dl,
        })
    }
}
