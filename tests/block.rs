//! `thread_pool_init_by_lua_block` and `thread_pool_process_by_lua_block`
//! against the real nginx: Lua code in `{ ... }`, read by the module's own
//! scanner, with OpenResty's chunk names and line numbers.

mod common;

use common::{free_port, Case};

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in:\n{text}"))
        + 1
}

const ONE_POOL: &str = "thread_pool per_task threads=1;";

/// The line of `needle` in the nginx.conf the harness writes for
/// `ONE_POOL` and `http` (the port does not change the line count).
fn conf_line(http: &str, needle: &str) -> usize {
    line_of(&Case::new(ONE_POOL).http(http).conf_text(), needle)
}

/// A location that pushes `arg` to `pool` and prints the results or the
/// error.
fn push_location(path: &str, pool: &str, arg: &str) -> String {
    format!(
        r#"
        location = {path} {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local res, err = tp.{pool}:push_task({arg})
                if err then
                    ngx.say("error: ", err)
                else
                    ngx.say(res)
                end
            }}
        }}"#
    )
}

/// Runs `nginx -t` on `ONE_POOL` and `http`, which must fail; returns
/// what nginx printed.
fn nginx_t_fails(http: &str) -> String {
    let out = Case::new(ONE_POOL).http(http).nginx_t();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "nginx -t passed:\n{stderr}");
    stderr
}

const MAIN: &str = "thread_pool per_task threads=1;\nthread_pool factory threads=1;";

#[test]
fn both_block_directives_and_both_handler_styles() {
    let http = format!(
        r#"
    thread_pool_init_by_lua_block per_task {{
        -- a comment with a brace: }}
        greeting = "hello {{"
    }}
    thread_pool_process_by_lua_block per_task {{
        local arg = ...
        local t = {{ greeting, " ", arg:upper(), [[ }} ]] }}
        return table.concat(t)
    }}
    thread_pool_init_by_lua_block factory {{ prefix = '<}}' }}
    thread_pool_process_by_lua_block factory {{
        --[==[ a long comment: }} {{ ]] ]==]
        local close = "}}" .. '}}' .. [=[}}]]]=]
        return function(arg)
            return prefix .. arg .. close
        end
    }}
    server {{
        listen 127.0.0.1:$PORT;
        {}
        {}
    }}"#,
        push_location("/per-task", "per_task", r#""world""#),
        push_location("/factory", "factory", r#""x""#),
    );
    let nginx = Case::new(MAIN).http(&http).start();
    assert_eq!(nginx.get("/per-task").text(), "hello { WORLD } \n");
    assert_eq!(nginx.get("/factory").text(), "<}x}}}]]\n");
    nginx.assert_clean_log();
}

#[test]
fn blocks_in_an_included_file_and_directives_after_them() {
    let pools = "\
thread_pool_process_by_lua_block factory {
    return function(s) return s .. '}' end
}
thread_pool_process_by_lua_block per_task { local s = ... return s .. '{' }
";
    let http = format!(
        r#"
    include pools.conf;
    server {{
        listen 127.0.0.1:$PORT;
        {}
        {}
    }}"#,
        push_location("/factory", "factory", r#""a""#),
        push_location("/per-task", "per_task", r#""b""#),
    );
    let nginx = Case::new(MAIN)
        .http(&http)
        .file("pools.conf", pools)
        .start();
    assert_eq!(nginx.get("/factory").text(), "a}\n");
    assert_eq!(nginx.get("/per-task").text(), "b{\n");
    nginx.assert_clean_log();
}

/// A process block of about 20 KiB, five times the 4 KiB buffer nginx
/// reads configuration files in, with braces in strings and comments all
/// along; what follows it must still parse.
#[test]
fn block_larger_than_the_configuration_buffer() {
    let mut block = String::from("thread_pool_process_by_lua_block factory {\n    local t = {\n");
    let mut n = 0;
    while block.len() < 20 * 1024 {
        block.push_str(&format!(
            "        {{ {n}, \"}}{{\", [==[ ]] }} ]==] }}, -- }} {{ {n}\n"
        ));
        n += 1;
    }
    block.push_str(
        "    }\n    return function(i)\n        return #t .. ':' .. t[i][1] .. t[i][2] .. t[i][3]\n    end\n}\n",
    );
    let http = format!(
        "{block}\n    server {{\n        listen 127.0.0.1:$PORT;\n        {}\n    }}",
        push_location("/", "factory", "tonumber(ngx.var.arg_i)"),
    );
    let nginx = Case::new("thread_pool factory threads=1;")
        .http(&http)
        .start();
    assert_eq!(nginx.get("/?i=1").text(), format!("{n}:0}}{{ ]] }} \n"));
    assert_eq!(
        nginx.get(&format!("/?i={n}")).text(),
        format!("{n}:{}}}{{ ]] }} \n", n - 1)
    );
    nginx.assert_clean_log();

    // nginx -T prints the configuration as read: the block's bytes, read by
    // the module rather than by nginx, must be in it once and whole.
    let case = Case::new("thread_pool factory threads=1;")
        .http(&http)
        .port(free_port());
    let conf = case.conf_text();
    let out = case.nginx_once(&["-T"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8_lossy(&out.stdout);
    assert!(
        dump.contains(&conf),
        "nginx -T output lacks the configuration:\n{dump}"
    );
}

/// Lua error lines count from the line of the block's `{`, as in
/// OpenResty's `*_by_lua_block` chunks: line N of the chunk is file line
/// `start + N - 1`.
#[test]
fn runtime_errors_name_the_block_like_openresty() {
    let http = format!(
        r#"
    thread_pool_process_by_lua_block per_task {{
        local arg = ...
        error("boom " .. arg)
    }}
    server {{
        listen 127.0.0.1:$PORT;
        {}
    }}"#,
        push_location("/", "per_task", r#""x""#),
    );
    let start = conf_line(&http, "thread_pool_process_by_lua_block per_task");
    let nginx = Case::new(ONE_POOL).http(&http).start();
    assert_eq!(
        nginx.get("/").text(),
        format!("error: thread_pool_process_by_lua(nginx.conf:{start}):3: boom x\n")
    );
}

#[test]
fn nginx_t_reports_a_lua_syntax_error_with_file_and_line() {
    let http = r#"
    thread_pool_process_by_lua_block per_task {
        local arg = ...
        local x = = arg
        return x
    }"#;
    let start = conf_line(http, "thread_pool_process_by_lua_block per_task");
    let stderr = nginx_t_fails(http);
    // The Lua message, as OpenResty names the chunk; nginx's " in file:line"
    // points at the very line of the error.
    let expected = format!(
        "\"thread_pool_process_by_lua_block\" directive failed to compile: \
         thread_pool_process_by_lua(nginx.conf:{start}):3: unexpected symbol near '='"
    );
    assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
    let place = format!("/conf/nginx.conf:{}\n", start + 2);
    assert!(stderr.contains(&place), "{place:?} not in:\n{stderr}");
}

#[test]
fn nginx_t_reports_an_init_block_syntax_error() {
    let http = r#"
    thread_pool_init_by_lua_block per_task { x = }
    thread_pool_process_by_lua_block per_task { return ... }"#;
    let start = conf_line(http, "thread_pool_init_by_lua_block per_task");
    let stderr = nginx_t_fails(http);
    let expected = format!(
        "\"thread_pool_init_by_lua_block\" directive failed to compile: \
         thread_pool_init_by_lua(nginx.conf:{start}):1: unexpected symbol near '<eof>' \
         in "
    );
    assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
    assert!(
        stderr.contains(&format!("/conf/nginx.conf:{start}\n")),
        "{stderr}"
    );
}

#[test]
fn nginx_t_accepts_good_blocks() {
    let http = r#"
    thread_pool_init_by_lua_block per_task {
        local s = "}"
    }
    thread_pool_process_by_lua_block per_task { return ... }"#;
    let out = Case::new(ONE_POOL).http(http).nginx_t();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unclosed_table_is_a_lua_error_at_its_line() {
    // The block's own `}` closes the table, the http block's `}` the block:
    // Lua finds the mistake.
    let http = r#"
    thread_pool_process_by_lua_block per_task {
        local t = { 1, 2
        return ...
    }"#;
    let start = conf_line(http, "thread_pool_process_by_lua_block per_task");
    let stderr = nginx_t_fails(http);
    let expected = format!(
        "thread_pool_process_by_lua(nginx.conf:{start}):3: '}}' expected (to close '{{' at \
         line 2) near 'return' in "
    );
    assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
    assert!(
        stderr.contains(&format!("/conf/nginx.conf:{}\n", start + 2)),
        "{stderr}"
    );
}

#[test]
fn unclosed_block_is_reported_at_its_first_line() {
    // Two `{` are never closed: the block's `}` and the http block's `}`
    // close them, and the file ends inside the Lua block.
    let http = r#"
    thread_pool_process_by_lua_block per_task {
        local t = { {
        return ...
    }"#;
    let start = conf_line(http, "thread_pool_process_by_lua_block per_task");
    let stderr = nginx_t_fails(http);
    let expected = "\"thread_pool_process_by_lua_block\" directive is not closed: \
                    unexpected end of file, expecting \"}\" in ";
    assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
    assert!(
        stderr.contains(&format!("/conf/nginx.conf:{start}\n")),
        "{stderr}"
    );
}

#[test]
fn unclosed_long_string_is_reported_where_it_opens() {
    let http = r#"
    thread_pool_process_by_lua_block per_task {
        local arg = ...
        local s = [==[ text ]] ]=]
        return s
    }"#;
    let line = conf_line(http, "local s = [==[");
    let stderr = nginx_t_fails(http);
    let expected = "directive is not closed: unexpected end of file inside the Lua long \
                    string opened by \"[==[\" in ";
    assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
    assert!(
        stderr.contains(&format!("/conf/nginx.conf:{line}\n")),
        "{stderr}"
    );
}

#[test]
fn extra_closing_brace_is_an_nginx_error() {
    // The block ends at the first `}` after `end`; the next `}` closes the
    // http block, and the harness's own `}` is then one too many.
    let http = r#"
    thread_pool_process_by_lua_block per_task { return function() end } }"#;
    let stderr = nginx_t_fails(http);
    // nginx's own message, after "[emerg] PID#TID: " (Debian's) or
    // "nginx: [emerg] " (OpenResty's): the prefix depends on the build's
    // error log before the configuration opens one
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("[emerg] ") && l.contains("unexpected \"}\" in ")),
        "{stderr}"
    );
}

#[test]
fn block_directive_needs_a_pool_and_a_block() {
    let out = Case::new("")
        .http("    thread_pool_process_by_lua_block { return ... }")
        .nginx_t();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid number of arguments in \"thread_pool_process_by_lua_block\""),
        "{stderr}"
    );
    let out = Case::new("")
        .http("    thread_pool_process_by_lua_block p;")
        .nginx_t();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("directive \"thread_pool_process_by_lua_block\" has no opening \"{\""),
        "{stderr}"
    );
}

/// Why the module reads its blocks itself rather than with the block parser
/// lua-nginx-module exports (ngx_http_lua_conf_lua_block_parse): that one
/// needs a Lua long string to fit in nginx's 4 KiB configuration buffer,
/// so a block holding a larger one (rules, a template) is refused. Ours
/// reads it; the lua module's own `content_by_lua_block` shows the limit.
#[test]
fn long_strings_larger_than_the_conf_buffer_are_read() {
    let text = "x".repeat(6000);
    let ours = format!(
        "    thread_pool_process_by_lua_block per_task {{\n        local s = [[{text}]]\n        return #s\n    }}"
    );
    let out = Case::new(ONE_POOL).http(&ours).nginx_t();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = format!(
        "    thread_pool_process_by_lua per_task \"return ...\";\n    server {{ listen 127.0.0.1:$PORT; location / {{ content_by_lua_block {{\n        local s = [[{text}]]\n        ngx.say(#s)\n    }} }} }}"
    );
    let stderr = nginx_t_fails(&theirs);
    assert!(
        stderr.contains("Lua code block missing the closing long bracket"),
        "{stderr}"
    );
}
