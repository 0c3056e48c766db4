//! `ngx.re` of a pool thread (ngx_re.lua) and the PCRE it runs on.
//!
//! The PCRE is libpcre.so.3, the one lua-nginx-module uses, so results are
//! the event loop's. But not the process's copy of it: while the event loop
//! compiles or frees a pattern, lua-nginx-module points libpcre's global
//! `pcre_malloc`/`pcre_free` at an allocator on one of its pools; a pool
//! thread compiling at that moment would allocate from that pool. So the
//! threads use a second copy, loaded once per process with dlmopen into a
//! link-map namespace of its own, which has its own globals.

use mlua::{LightUserData, Lua, Table, Value};
use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::sync::OnceLock;

extern "C" {
    fn dlmopen(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}

const LM_ID_NEWLM: c_long = -1;
const RTLD_NOW: c_int = 2;
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();
const LIBPCRE: &CStr = c"libpcre.so.3";
/// lua-nginx-module's default of lua_regex_cache_max_entries.
const DEFAULT_CACHE_ENTRIES: u32 = 1024;

/// The private copy's handle (an address: raw pointers are not Sync), or
/// why it did not load.
fn private_pcre() -> &'static Result<usize, String> {
    static PCRE: OnceLock<Result<usize, String>> = OnceLock::new();
    PCRE.get_or_init(|| {
        // SAFETY: dlmopen with a valid C string; the handle is never
        // closed, so it stays valid for the process.
        let handle = unsafe { dlmopen(LM_ID_NEWLM, LIBPCRE.as_ptr(), RTLD_NOW) };
        if handle.is_null() {
            // SAFETY: dlerror returns null or a C string valid until the
            // next dl call on this thread.
            let why = unsafe { dlerror() };
            let why = if why.is_null() {
                "unknown error".into()
            } else {
                // SAFETY: non-null, NUL-terminated (above).
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("cannot load libpcre.so.3: {why}"));
        }
        Ok(handle as usize)
    })
}

/// lua_regex_cache_max_entries when lua-nginx-module is loaded (in nginx),
/// else its default (unit tests).
fn cache_entries() -> u32 {
    // SAFETY: looks up a symbol in the global scope, where nginx loads its
    // modules.
    let f = unsafe {
        dlsym(
            RTLD_DEFAULT,
            c"ngx_http_lua_ffi_max_regex_cache_size".as_ptr(),
        )
    };
    if f.is_null() {
        return DEFAULT_CACHE_ENTRIES;
    }
    // SAFETY: lua-nginx-module's `uint32_t (void)` function; it reads the
    // cycle's http lua main conf, which is set before the pool threads
    // start (they start in init_process) and read-only afterwards.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(f) };
    f()
}

/// Sets `ngx.re` in `lua`'s state; returns the helpers the `ngx.re` module
/// (split, opt) is built on. `match_limit` is lua_regex_match_limit (0: none).
pub fn install(lua: &Lua, ngx: &Table, match_limit: u64) -> mlua::Result<Table> {
    let lib = match private_pcre() {
        Ok(handle) => {
            let handle = *handle as *mut c_void;
            Value::Function(lua.create_function(move |_, name: String| {
                let name = CString::new(name).map_err(mlua::Error::external)?;
                // SAFETY: a handle from dlmopen that is never closed; the
                // Lua side casts the address to the symbol's C type.
                let p = unsafe { dlsym(handle, name.as_ptr()) };
                Ok((!p.is_null()).then_some(LightUserData(p)))
            })?)
        }
        Err(why) => Value::String(lua.create_string(why)?),
    };
    let (re, internal): (Table, Table) = lua
        .load(include_str!("ngx_re.lua"))
        .set_name("=ngx_threadpool.ngx_re")
        .call((lib, cache_entries(), match_limit, ngx.clone()))?;
    ngx.set("re", re)?;
    Ok(internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    }

    #[test]
    fn private_copy_has_its_own_allocator_hooks() {
        let handle = *private_pcre().as_ref().expect("libpcre.so.3") as *mut c_void;
        // SAFETY: dlopen/dlsym with valid C strings; the handles stay open.
        let (private, shared) = unsafe {
            let global = dlopen(LIBPCRE.as_ptr(), RTLD_NOW);
            assert!(!global.is_null());
            (
                dlsym(handle, c"pcre_malloc".as_ptr()),
                dlsym(global, c"pcre_malloc".as_ptr()),
            )
        };
        assert!(!private.is_null() && !shared.is_null());
        assert_ne!(private, shared);
    }

    #[test]
    fn matches_outside_nginx() {
        // SAFETY: ffi is needed by ngx_re.lua, as in a pool thread.
        let lua = unsafe { Lua::unsafe_new() };
        let ngx = lua.create_table().unwrap();
        install(&lua, &ngx, 0).unwrap();
        lua.globals().set("ngx", ngx).unwrap();
        let (m, s): (String, String) = lua
            .load(
                r#"return ngx.re.match("hello 1234", [[(?<n>\d+)]], "jo").n,
                          (ngx.re.gsub("a1b2", [[\d]], "<$0>", "o"))"#,
            )
            .eval()
            .unwrap();
        assert_eq!((m.as_str(), s.as_str()), ("1234", "a<1>b<2>"));
    }
}
