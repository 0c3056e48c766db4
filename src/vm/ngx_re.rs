//! `ngx.re` of a pool thread (ngx_re.lua) and the PCRE it runs on.
//!
//! The PCRE is libpcre.so.3, the one lua-nginx-module uses, so results are
//! the event loop's. But not the process's copy of it: while the event loop
//! compiles or frees a pattern, lua-nginx-module points libpcre's global
//! `pcre_malloc`/`pcre_free` at an allocator on one of its pools; a pool
//! thread compiling at that moment would allocate from that pool. So the
//! threads use a second copy, loaded once per process with dlmopen into a
//! link-map namespace of its own, which has its own globals.

use crate::ngx::lua_api::regex_cache_max_entries;
use crate::ngx::os::PrivateLib;
use mlua::{LightUserData, Lua, Table, Value};
use std::ffi::CString;
use std::sync::OnceLock;

/// lua-nginx-module's default of lua_regex_cache_max_entries.
const DEFAULT_CACHE_ENTRIES: u32 = 1024;

/// The private copy of libpcre.so.3, loaded once per process, or why it
/// did not load.
fn private_pcre() -> &'static Result<PrivateLib, String> {
    static PCRE: OnceLock<Result<PrivateLib, String>> = OnceLock::new();
    PCRE.get_or_init(|| PrivateLib::load(c"libpcre.so.3"))
}

/// Sets `ngx.re` in `lua`'s state; returns the helpers the `ngx.re` module
/// (split, opt) is built on. `match_limit` is lua_regex_match_limit (0: none).
pub fn install(lua: &Lua, ngx: &Table, match_limit: u64) -> mlua::Result<Table> {
    let lib = match private_pcre() {
        Ok(pcre) => Value::Function(lua.create_function(move |_, name: String| {
            let name = CString::new(name).map_err(mlua::Error::external)?;
            // The Lua side casts the address to the symbol's C type.
            Ok(pcre.symbol(&name).map(|p| LightUserData(p.as_ptr())))
        })?),
        Err(why) => Value::String(lua.create_string(why)?),
    };
    let (re, internal): (Table, Table) = lua
        .load(include_str!("ngx_re.lua"))
        .set_name("=ngx_threadpool.ngx_re")
        .call((
            lib,
            regex_cache_max_entries().unwrap_or(DEFAULT_CACHE_ENTRIES),
            match_limit,
            ngx.clone(),
        ))?;
    ngx.set("re", re)?;
    Ok(internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_outside_nginx() {
        // ffi is needed by ngx_re.lua, as in a pool thread
        let lua = crate::lua::scratch_state();
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
