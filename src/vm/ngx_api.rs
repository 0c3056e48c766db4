//! Installs the thread's `ngx` table: Rust primitives, the rest in ngx.lua.

use crate::ngx::log::Log;
use mlua::{Lua, Table, Value};

/// Sets the globals `ngx` and `print` in `lua`. Log lines go to `log` with
/// the pool's name, or to stderr when there is none (unit tests).
pub fn install(lua: &Lua, pool: &str, log: Option<Log>) -> mlua::Result<()> {
    let prim = lua.create_table()?;
    let suffix = format!(", thread pool: {pool}");
    prim.set(
        "log_write",
        lua.create_function(
            move |_, (level, place, msg): (u32, mlua::LuaString, mlua::LuaString)| {
                let mut line = Vec::with_capacity(
                    6 + place.as_bytes().len() + msg.as_bytes().len() + suffix.len(),
                );
                line.extend_from_slice(b"[lua] ");
                line.extend_from_slice(&place.as_bytes());
                line.extend_from_slice(&msg.as_bytes());
                line.extend_from_slice(suffix.as_bytes());
                match log {
                    Some(log) => log.write(level, &line),
                    None => eprintln!("{}", String::from_utf8_lossy(&line)),
                }
                Ok(())
            },
        )?,
    )?;
    prim.set("null", Value::NULL)?;
    let (ngx, print): (Table, Value) = lua
        .load(include_str!("ngx.lua"))
        .set_name("=ngx_threadpool.ngx")
        .call(prim)?;
    super::ngx_re::install(lua, &ngx)?;
    lua.globals().set("ngx", ngx)?;
    lua.globals().set("print", print)?;
    Ok(())
}
