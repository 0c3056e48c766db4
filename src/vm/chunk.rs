//! Process and init chunks: compiling them, and telling the two process
//! styles apart.

use mlua::{Function, Lua};

/// Lua source with the chunk name its errors and `ngx.log` lines carry.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub code: Vec<u8>,
    /// `=thread_pool_process_by_lua(nginx.conf:12)` or `@/path/file.lua`.
    pub name: String,
}

/// How a process chunk handles tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// The chunk's top level uses `...`: it is run for every task with the
    /// task's arguments.
    PerTask,
    /// The chunk's top level does not use `...`: it is run once when the
    /// thread starts and returns the function that handles every task.
    Factory,
}

impl Chunk {
    /// Compiles the chunk in `lua`.
    pub fn load(&self, lua: &Lua) -> Result<Function, String> {
        lua.load(&self.code[..])
            .set_name(&self.name)
            .into_function()
            .map_err(|e| error_text(&e))
    }
}

/// Compiles `chunk` in a scratch state, so that `nginx -t` reports syntax
/// errors, and finds its style.
pub fn check(chunk: &Chunk) -> Result<Style, String> {
    // the jit library, for jit.util
    let lua = crate::luajit::scratch_state();
    let f = chunk.load(&lua)?;
    style_of(&lua, &f)
}

/// Whether the main function of `f` contains a VARG instruction. The VARG
/// opcode is read off `return ...` rather than hard-coded, so the check
/// holds for whatever bytecode numbering the loaded LuaJIT uses.
pub fn style_of(lua: &Lua, f: &Function) -> Result<Style, String> {
    let uses_varargs: bool = lua
        .load(
            r#"
            local f = ...
            local funcbc = require("jit.util").funcbc
            local band = require("bit").band
            local varg = band(funcbc(loadstring("return ..."), 1), 0xff)
            local pc = 1
            while true do
                local ins = funcbc(f, pc)
                if not ins then return false end
                if band(ins, 0xff) == varg then return true end
                pc = pc + 1
            end
            "#,
        )
        .set_name("=style")
        .call(f)
        .map_err(|e| error_text(&e))?;
    Ok(if uses_varargs {
        Style::PerTask
    } else {
        Style::Factory
    })
}

/// The message of a Lua error without mlua's decorations.
pub fn error_text(e: &mlua::Error) -> String {
    match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::CallbackError { cause, .. } => error_text(cause),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(code: &str) -> Chunk {
        Chunk {
            code: code.as_bytes().to_vec(),
            name: "=test".into(),
        }
    }

    #[test]
    fn per_task_when_top_level_uses_varargs() {
        assert_eq!(
            check(&chunk("local arg = ... return arg:upper()")),
            Ok(Style::PerTask)
        );
        assert_eq!(check(&chunk("return select('#', ...)")), Ok(Style::PerTask));
    }

    #[test]
    fn factory_when_varargs_only_in_nested_function() {
        assert_eq!(
            check(&chunk("local x = 1 return function(...) return ... end")),
            Ok(Style::Factory)
        );
        assert_eq!(
            check(&chunk("return function(a) return a end")),
            Ok(Style::Factory)
        );
    }

    #[test]
    fn syntax_error_names_chunk_and_line() {
        let err = check(&chunk("local x = \n  x +")).unwrap_err();
        assert!(err.starts_with("test:2:"), "{err}");
    }
}
