//! The nginx.conf the harness writes around a test's own directives.

use super::env::{lua_module_lines, module_path, repo, user_line};

/// A whole nginx.conf: the module lines, `main` at top level (thread_pool
/// declarations), and `http` inside the http block. An `http` that sets
/// its own `lua_package_path` replaces the harness's (it must then list
/// the repo's lua/ dir itself). `master` off: one process that serves and
/// runs the pools itself.
pub(super) fn harness_conf(workers: usize, master: bool, main: &str, http: &str) -> String {
    let path_line = if http.contains("lua_package_path") {
        String::new()
    } else {
        format!("lua_package_path \"{}/lua/?.lua;;\";", repo().display())
    };
    format!(
        r#"{lua_modules}load_module {module};
{user}
daemon off;
master_process {master};
worker_processes {workers};
error_log logs/error.log info;
pid logs/nginx.pid;
events {{ worker_connections 1024; }}
{main}
http {{
    access_log off;
    {path_line}
{http}
}}
"#,
        lua_modules = lua_module_lines(),
        module = module_path().display(),
        user = user_line(),
        master = if master { "on" } else { "off" },
    )
}
