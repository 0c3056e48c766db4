//! `ngx.re` of a pool thread (ngx_re.lua) and the PCRE it runs on.
//!
//! The PCRE is the one lua-nginx-module's ngx.re uses, PCRE1's libpcre.so.3
//! or PCRE2's libpcre2-8.so.0 (a backend each: ngx_re_pcre1.lua,
//! ngx_re_pcre2.lua), so results are the event loop's. But not the
//! process's copy of it: while the event loop compiles or frees a pattern,
//! lua-nginx-module points libpcre's global `pcre_malloc`/`pcre_free` at an
//! allocator on one of its pools; a pool thread compiling at that moment
//! would allocate from that pool. So the threads use a second copy, loaded
//! once per process with dlmopen into a link-map namespace of its own,
//! which has its own globals. PCRE2 has no such globals (allocators come
//! with contexts), but one way for both keeps one code path.

use crate::ngx::lua_inject::regex_cache_max_entries;
use crate::ngx::os::PrivateLib;
use mlua::{LightUserData, Lua, Table, Value};
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// lua-nginx-module's default of lua_regex_cache_max_entries.
const DEFAULT_CACHE_ENTRIES: u32 = 1024;

/// The longest error text of lua-resty-core's ngx.re when it cannot be
/// asked (0.1.25's error buffer of 128 bytes, less the NUL).
pub const DEFAULT_REGEX_MAX_ERR_LEN: usize = 127;

/// The PCRE API lua-nginx-module's ngx.re runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pcre {
    One,
    Two,
}

impl Pcre {
    /// The API of the PCRE whose version is `version` (as
    /// `ngx_http_lua_ffi_pcre_version()` reports it: "8.39 2016-06-14",
    /// "10.42 2022-12-11"): PCRE1 is 8.x, PCRE2 10.x on. lua-resty-core
    /// tells them apart by the same report to choose its option bits, so
    /// the thread follows the event loop whatever links what (the lua
    /// module 0.10.23 uses PCRE1 even where nginx links PCRE2).
    pub fn of_version(version: &str) -> Option<Pcre> {
        let major: u32 = version.split('.').next()?.trim().parse().ok()?;
        Some(if major >= 10 { Pcre::Two } else { Pcre::One })
    }

    fn library(self) -> &'static CStr {
        match self {
            Pcre::One => c"libpcre.so.3",
            Pcre::Two => c"libpcre2-8.so.0",
        }
    }

    fn backend(self) -> (&'static str, &'static str) {
        match self {
            Pcre::One => (include_str!("ngx_re_pcre1.lua"), "=ngx_threadpool.pcre1"),
            Pcre::Two => (include_str!("ngx_re_pcre2.lua"), "=ngx_threadpool.pcre2"),
        }
    }

    /// The private copy of the library, loaded once per process, or why
    /// it did not load.
    fn private_lib(self) -> &'static Result<PrivateLib, String> {
        static LIBS: [OnceLock<Result<PrivateLib, String>>; 2] = [OnceLock::new(), OnceLock::new()];
        LIBS[self as usize].get_or_init(|| PrivateLib::load(self.library()))
    }
}

/// What a thread's ngx.re needs to know of the event loop's.
#[derive(Clone, Copy, Debug)]
pub struct RegexEnv {
    /// None when lua-nginx-module was built without PCRE.
    pub pcre: Option<Pcre>,
    /// lua_regex_match_limit (0: none).
    pub match_limit: u64,
    /// The longest error text lua-resty-core returns (its error buffer
    /// less the NUL).
    pub max_err_len: usize,
}

/// Sets `ngx.re` in `lua`'s state; returns the helpers the `ngx.re` module
/// (split, opt) is built on.
pub fn install(lua: &Lua, ngx: &Table, env: RegexEnv) -> mlua::Result<Table> {
    let backend = match env.pcre.map(|pcre| (pcre, pcre.private_lib())) {
        Some((pcre, Ok(lib))) => {
            let sym = lua.create_function(move |_, name: String| {
                let c_name = CString::new(name.as_str()).map_err(mlua::Error::external)?;
                // The Lua side casts the address to the symbol's C type.
                lib.symbol(&c_name)
                    .map(|p| LightUserData(p.as_ptr()))
                    .ok_or_else(|| {
                        let lib = pcre.library().to_string_lossy();
                        mlua::Error::runtime(format!("{lib} has no {name}"))
                    })
            })?;
            let (src, name) = pcre.backend();
            Value::Table(lua.load(src).set_name(name).call((sym, env.match_limit))?)
        }
        Some((_, Err(why))) => Value::String(lua.create_string(why)?),
        None => Value::String(lua.create_string("lua-nginx-module has no PCRE")?),
    };
    let (re, internal): (Table, Table) = lua
        .load(include_str!("ngx_re.lua"))
        .set_name("=ngx_threadpool.ngx_re")
        .call((
            backend,
            regex_cache_max_entries().unwrap_or(DEFAULT_CACHE_ENTRIES),
            env.max_err_len,
            ngx.clone(),
        ))?;
    ngx.set("re", re)?;
    Ok(internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_choose_the_api() {
        assert_eq!(Pcre::of_version("8.39 2016-06-14"), Some(Pcre::One));
        assert_eq!(Pcre::of_version("10.42 2022-12-11"), Some(Pcre::Two));
        assert_eq!(Pcre::of_version("11.0"), Some(Pcre::Two));
        assert_eq!(Pcre::of_version("garbage"), None);
    }

    #[test]
    fn matches_outside_nginx_with_each_pcre_installed() {
        let mut tried = 0;
        for pcre in [Pcre::One, Pcre::Two] {
            if pcre.private_lib().is_err() {
                continue; // not installed on this release (PCRE1 on Debian 13)
            }
            tried += 1;
            // ffi is needed by ngx_re.lua, as in a pool thread
            let lua = crate::luajit::scratch_state();
            let ngx = lua.create_table().unwrap();
            let env = RegexEnv {
                pcre: Some(pcre),
                match_limit: 0,
                max_err_len: DEFAULT_REGEX_MAX_ERR_LEN,
            };
            let internal = install(&lua, &ngx, env).unwrap();
            lua.globals().set("ngx", ngx).unwrap();
            // an unset group reads -1 in the ovector, as in the lua
            // module's (split takes its offsets as they are)
            let unset: (i32, i32) = lua
                .load(
                    r#"local internal = ...
                       local c = internal.compile("(a)|(b)")
                       assert(internal.exec(c, "b", 1, 0) == 3)
                       return c.ovec[2], c.ovec[3]"#,
                )
                .call(internal)
                .unwrap();
            assert_eq!(unset, (-1, -1), "{pcre:?}");
            let (m, s, d, e): (String, String, String, String) = lua
                .load(
                    r#"return ngx.re.match("hello 1234", [[(?<n>\d+)]], "jo").n,
                              (ngx.re.gsub("a1b2", [[\d]], "<$0>", "o")),
                              ngx.re.match("aXb", "(x)(y)?B", "id")[0],
                              select(2, ngx.re.match("a", "("))"#,
                )
                .eval()
                .unwrap();
            assert_eq!(
                (m.as_str(), s.as_str(), d.as_str()),
                ("1234", "a<1>b<2>", "Xb"),
                "{pcre:?}"
            );
            assert!(e.starts_with("pcre"), "{pcre:?}: {e}");
        }
        assert!(tried > 0, "neither libpcre.so.3 nor libpcre2-8.so.0 loads");
    }
}
