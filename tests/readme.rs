//! README.md's synopsis, run as a newcomer would run it: its `http` block
//! as written (only the port is the test's), and the request its comment
//! names, which must get the answer the comment gives.

mod common;

use common::{lua_module_lines, module_path, repo, user_line, Case};

/// The synopsis: a whole nginx.conf.
fn synopsis() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = readme
        .find("## Synopsis")
        .expect("README.md has no Synopsis");
    let open = "```nginx\n";
    let start = at + readme[at..].find(open).expect("no nginx block") + open.len();
    let end = start + readme[start..].find("```").expect("unclosed block");
    readme[start..end].to_string()
}

#[test]
fn the_synopsis_configures_a_pool_and_calls_it() {
    let conf = synopsis();
    assert!(
        conf.contains("listen 8080;") && conf.contains("FOO for /upper?s=foo"),
        "the synopsis no longer says where it listens or what it answers:\n{conf}"
    );
    // The file as written, but for the port, the module cargo built and,
    // where the lua module is not Debian's dynamic one, its load lines;
    // logs and pid under the test's prefix.
    let module = "load_module /usr/lib/nginx/modules/ngx_http_threadpool_module.so;";
    let lua_lines = "load_module /usr/lib/nginx/modules/ndk_http_module.so;\n\
                     load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;\n";
    assert!(
        conf.contains(module) && conf.contains(lua_lines),
        "the synopsis no longer loads the modules:\n{conf}"
    );
    let conf = conf
        .replace(lua_lines, &lua_module_lines())
        .replace(module, &format!("load_module {};", module_path().display()))
        .replace("listen 8080;", "listen 127.0.0.1:$PORT;")
        .replace(
            "events {}",
            "events {}\nerror_log logs/error.log info;\npid logs/nginx.pid;",
        )
        .replace(
            "http {",
            &format!(
                "http {{\n    access_log off;\n    lua_package_path \"{}/lua/?.lua;;\";",
                repo().display()
            ),
        );
    let n = Case::conf(&conf)
        .args(&["-g", &format!("daemon off; {}", user_line())])
        .start();
    let r = n.get("/upper?s=foo");
    assert_eq!((r.status, r.text().as_str()), (200, "FOO\n"));
    // no [error] or worse: a newcomer's first log stays clean
    n.assert_clean_log();
}
