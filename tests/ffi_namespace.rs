//! A pool thread's C namespace behaves like the event loop's. A LuaJIT state
//! has one, where the first `ffi.cdef` of a name wins: the module's own
//! thread Lua (src/vm/*.lua) must leave free every name user code may
//! declare. The same chunk runs in a pool thread and on the event loop: it
//! notes which C names its state had already declared, then declares, with
//! types of its own, every libc function the module's thread Lua calls and
//! others handlers commonly declare, and calls them.

mod common;

use common::Case;
use std::collections::BTreeSet;

/// The prefix of the names the module's thread Lua keeps for itself.
const PREFIX: &str = "ngx_tp_";

/// Functions of lua-nginx-module, declared by lua-resty-core on the event
/// loop and by the module in threads.
const LUA_MODULE_PREFIX: &str = "ngx_http_lua_ffi_";

/// Functions the module exports itself (src/vm/cancel.rs), under a name
/// of its own.
const MODULE_PREFIX: &str = "ngx_threadpool_";

/// What user code declares and calls: (C symbol, cdef, body returning the
/// results), each with types of its own.
const USER: &[(&str, &str, &str)] = &[
    (
        "clock_gettime",
        "typedef struct { long s; long ns; } user_ts; int clock_gettime(int, user_ts *);",
        "local ts = ffi.new('user_ts') return C.clock_gettime(1, ts), ts.s > 0",
    ),
    (
        "snprintf",
        "typedef struct { char c[16]; } user_buf; int snprintf(user_buf *, size_t, const char *, ...);",
        "local b = ffi.new('user_buf') local n = C.snprintf(b, 16, '%d-%s', ffi.new('int', 42), 'x') return n, ffi.string(b.c, n)",
    ),
    (
        "free",
        "typedef struct { int x; } user_block; void *malloc(size_t); void free(user_block *);",
        "local p = ffi.cast('user_block *', C.malloc(4)) p.x = 7 local x = p.x C.free(p) return x",
    ),
    (
        "getpid",
        "int getpid(void);",
        "return C.getpid() == ngx.worker.pid()",
    ),
    (
        "gettimeofday",
        "typedef struct { long s; long us; } user_tv; int gettimeofday(user_tv *, void *);",
        "local tv = ffi.new('user_tv') return C.gettimeofday(tv, nil), tv.s > 0",
    ),
    (
        "nanosleep",
        "struct timespec { long tv_sec; long tv_nsec; }; int nanosleep(const struct timespec *, struct timespec *);",
        "return C.nanosleep(ffi.new('struct timespec', 0, 1000), nil)",
    ),
    ("usleep", "int usleep(unsigned int);", "return C.usleep(1)"),
    (
        "strlen",
        "size_t strlen(const char *);",
        "return tonumber(C.strlen('hello'))",
    ),
    (
        "memcpy",
        "typedef struct { int a, b; } user_pair; void *memcpy(user_pair *, const user_pair *, size_t);",
        "local a, b = ffi.new('user_pair', 1, 2), ffi.new('user_pair') C.memcpy(b, a, ffi.sizeof(a)) return b.a, b.b",
    ),
    (
        "time",
        "typedef long user_time; user_time time(user_time *);",
        "return C.time(nil) > 0",
    ),
];

/// One name an `ffi.cdef` of the module's thread Lua declares.
#[derive(Debug)]
struct Decl {
    file: String,
    /// A function (else a typedef or a struct, union or enum tag).
    function: bool,
    /// The name it takes in the state's C namespace.
    name: String,
    /// The C symbol a function calls (its `asm("...")`, or its name).
    symbol: String,
    /// The declaration without its `;`, spaces or comments.
    text: String,
}

/// Every `ffi.cdef [[...]]` of src/vm/*.lua; panics on other forms, so
/// that none is missed.
fn thread_declarations() -> Vec<Decl> {
    let dir = common::repo().join("src/vm");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lua") {
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            for block in cdef_blocks(&file, &text) {
                out.extend(declarations(&file, &block));
            }
        }
    }
    out
}

fn cdef_blocks(file: &str, text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("cdef") {
        let after = rest[at + 4..].trim_start();
        let after = after.strip_prefix('(').unwrap_or(after).trim_start();
        let body = after
            .strip_prefix("[[")
            .unwrap_or_else(|| panic!("{file}: a cdef this test cannot read: {after:.40}"));
        let end = body.find("]]").expect("unclosed [[");
        blocks.push(body[..end].to_string());
        rest = &body[end..];
    }
    blocks
}

fn identifiers(s: &str) -> Vec<&str> {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
        .collect()
}

/// `s` without whitespace.
fn squeeze(s: &str) -> String {
    s.split_whitespace().collect()
}

/// The cdefs of lua-resty-core as installed (Debian's lua-resty-core, which
/// the event loop loads), without whitespace.
fn resty_core_cdefs() -> String {
    let dir = std::path::Path::new("/usr/share/lua/5.1/resty/core");
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        all.push_str(&squeeze(
            &std::fs::read_to_string(entry.unwrap().path()).unwrap(),
        ));
    }
    all
}

fn declarations(file: &str, block: &str) -> Vec<Decl> {
    let mut text = String::new();
    let mut rest = block;
    while let Some(at) = rest.find("/*") {
        text.push_str(&rest[..at]);
        rest = &rest[at + rest[at..].find("*/").expect("unclosed comment") + 2..];
    }
    text.push_str(rest);
    // top-level declarations: split at `;` outside braces
    let mut decls = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ';' if depth == 0 => {
                decls.push(text[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    assert!(
        text[start..].trim().is_empty(),
        "{file}: no `;` after {:?}",
        &text[start..]
    );
    let decl = |function, name: &str, symbol: &str, d: &str| Decl {
        file: file.to_string(),
        function,
        name: name.to_string(),
        symbol: symbol.to_string(),
        text: squeeze(d),
    };
    let mut out = Vec::new();
    for d in decls.iter().filter(|d| !d.is_empty()) {
        let words = identifiers(d);
        let tagged = matches!(words[0], "struct" | "union" | "enum")
            || (words[0] == "typedef" && matches!(words[1], "struct" | "union" | "enum"));
        if tagged {
            // the tag, if the declaration names one
            let kw = if words[0] == "typedef" { 1 } else { 0 };
            let head = &d[..d.find('{').unwrap_or(d.len())];
            if let Some(tag) = identifiers(head).get(kw + 1) {
                out.push(decl(false, tag, "", d));
            }
        }
        if words[0] == "typedef" {
            let tail = &d[d.rfind('}').unwrap_or(0)..];
            assert!(
                !tail.contains('('),
                "{file}: a typedef this test cannot read: {d}"
            );
            out.push(decl(false, identifiers(tail).last().unwrap(), "", d));
        } else if !tagged {
            let paren = d
                .find('(')
                .unwrap_or_else(|| panic!("{file}: not a function: {d}"));
            let name = *identifiers(&d[..paren]).last().unwrap();
            let symbol = d
                .find("asm(\"")
                .map(|at| &d[at + 5..at + 5 + d[at + 5..].find('"').unwrap()])
                .unwrap_or(name);
            out.push(decl(true, name, symbol, d));
        }
    }
    out
}

/// The C names both states must have declared alike before user code runs
/// (LuaJIT shows a function's type without its parameters; the unit test
/// compares those): the unprefixed ones of the module's thread Lua, and
/// those user code declares.
fn compared_names(decls: &[Decl]) -> BTreeSet<String> {
    decls
        .iter()
        .filter(|d| !d.name.starts_with(PREFIX))
        .map(|d| d.name.clone())
        .chain(USER.iter().map(|(name, _, _)| name.to_string()))
        .collect()
}

/// The module's thread Lua declares names of its own and functions exactly
/// as lua-resty-core declares them, and user code here declares every libc
/// function it calls.
#[test]
fn thread_lua_declares_only_its_own_names() {
    let decls = thread_declarations();
    for file in [
        "ngx.lua",
        "ngx_require.lua",
        "ngx_re_pcre1.lua",
        "ngx_re_pcre2.lua",
        "ngx_ffi.lua",
        "cancel.lua",
    ] {
        assert!(
            decls.iter().any(|d| d.file == file),
            "no cdef read in {file}"
        );
    }
    let resty_core = resty_core_cdefs();
    for d in decls.iter().filter(|d| !d.name.starts_with(PREFIX)) {
        assert!(
            d.function && resty_core.contains(&format!("{};", d.text)),
            "{}: {} is neither {PREFIX}-prefixed nor declared so by lua-resty-core: {}",
            d.file,
            d.name,
            d.text
        );
    }
    for d in decls.iter().filter(|d| d.function) {
        assert!(
            d.symbol.starts_with(LUA_MODULE_PREFIX)
                || d.symbol.starts_with(MODULE_PREFIX)
                || USER.iter().any(|(name, _, _)| *name == d.symbol),
            "{}: user code here does not declare {}",
            d.file,
            d.symbol
        );
    }
}

/// The chunk both sides run: the C names already declared (before its own
/// cdefs), then each user call's results or error.
fn user_chunk(names: &BTreeSet<String>) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    let cdefs: String = USER
        .iter()
        .map(|(_, cdef, _)| format!("{cdef}\n"))
        .collect();
    let calls: String = USER
        .iter()
        .map(|(name, _, body)| format!("    {{ {name:?}, function() {body} end }},\n"))
        .collect();
    format!(
        r#"local ffi = require "ffi"
local C = ffi.C
local out = {{}}
for _, name in ipairs({{ {names} }}) do
    local ok, t = pcall(function() return tostring(ffi.typeof(C[name])) end)
    out[#out + 1] = name .. ": " .. (ok and t:gsub("struct %d+", "struct") or "undeclared")
end
ffi.cdef [[
{cdefs}]]
local calls = {{
{calls}}}
return function()
    for _, call in ipairs(calls) do
        local r = {{ pcall(call[2]) }}
        for i = 1, #r do r[i] = tostring(r[i]) end
        out[#out + 1] = call[1] .. "() " .. table.concat(r, " ")
    end
    return table.concat(out, "\n")
end
"#,
        names = names.join(", ")
    )
}

/// Fails with "cannot convert 'struct 322' to 'struct 314 *'" when the
/// thread Lua declares clock_gettime itself.
#[test]
fn user_declarations_work_in_threads_as_on_the_event_loop() {
    let chunk = user_chunk(&compared_names(&thread_declarations()));
    let http = r#"
    thread_pool_process_by_lua_file ns conf/user.lua;
    server {
        listen 127.0.0.1:$PORT;
        location = /loop {
            content_by_lua_block {
                ngx.print(dofile(ngx.config.prefix() .. "conf/user.lua")())
            }
        }
        location = /thread {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                ngx.print(assert(tp.ns:push_task()))
            }
        }
    }
"#;
    let n = Case::new("thread_pool ns threads=1;")
        .http(http)
        .file("user.lua", &chunk)
        .start();
    let thread = n.get("/thread").text();
    let event_loop = n.get("/loop").text();
    assert!(
        event_loop.contains("clock_gettime() true 0 true"),
        "{event_loop}"
    );
    assert!(
        event_loop.contains("ngx_http_lua_ffi_md5: ctype<"),
        "{event_loop}"
    );
    assert_eq!(thread, event_loop);
    n.assert_clean_log();
}
