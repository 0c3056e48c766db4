//! Loading this module before lua-nginx-module, or without it, is an emerg
//! at `nginx -t` that says what to do, not a failed dlopen.

mod common;
use common::*;

const HANDLER: &str = r#"thread_pool_process_by_lua p "return ...";"#;
const MAIN: &str = "thread_pool p threads=1;";

/// The harness's configuration with its three load_module lines (ndk,
/// lua, this module) replaced by those `reorder` keeps, in its order.
/// With the lua module built into nginx there is only this module's line.
fn with_modules(reorder: impl Fn(&[String]) -> Vec<String>) -> String {
    let conf = Case::new(MAIN).http(HANDLER).conf_text();
    let (load, rest): (Vec<&str>, Vec<&str>) =
        conf.lines().partition(|l| l.starts_with("load_module "));
    let expected = if lua_built_in() { 1 } else { 3 };
    assert_eq!(load.len(), expected, "ndk, lua, this module:\n{conf}");
    let load: Vec<String> = load.iter().map(|l| l.to_string()).collect();
    let mut lines = reorder(&load);
    lines.extend(rest.iter().map(|l| l.to_string()));
    lines.join("\n")
}

fn emerg_of(conf: &str) -> String {
    let out = Case::conf(conf).nginx_t();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "nginx -t passed:\n{conf}\n{err}");
    let line = err
        .lines()
        .find(|l| l.contains("[emerg]"))
        .unwrap_or_else(|| panic!("no emerg:\n{err}"))
        .to_string();
    assert!(
        line.contains("ngx_threadpool: ")
            && line.contains("load ngx_http_lua_module.so first")
            && line.contains("\"load_module modules/ngx_http_lua_module.so;\" must come before"),
        "{line}"
    );
    line
}

/// Whether the lua module is built into nginx, where it is always there,
/// before every dynamic module: the load-order mistakes cannot happen.
fn cannot_misorder() -> bool {
    let built_in = lua_built_in();
    if built_in {
        eprintln!(
            "lua-nginx-module is built into {}: no load order to get wrong",
            nginx()
        );
    }
    built_in
}

#[test]
fn loaded_before_the_lua_module() {
    if cannot_misorder() {
        return;
    }
    // this module first, then ndk and lua
    let line = emerg_of(&with_modules(|l| {
        vec![l[2].clone(), l[0].clone(), l[1].clone()]
    }));
    assert!(
        line.contains("ngx_http_lua_module.so is loaded after this module"),
        "{line}"
    );
    // the error names the http block, where the module first needs it
    assert!(line.contains("nginx.conf:"), "{line}");
}

#[test]
fn loaded_without_the_lua_module() {
    if cannot_misorder() {
        return;
    }
    let line = emerg_of(&with_modules(|l| vec![l[2].clone()]));
    assert!(
        line.contains("lua-nginx-module, which is not loaded"),
        "{line}"
    );
}

fn assert_passes(conf: &str) {
    let out = Case::conf(conf).nginx_t();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{conf}\n{err}");
}

#[test]
fn loaded_after_the_lua_module() {
    assert_passes(&with_modules(|l| l.to_vec()));
}

#[test]
fn without_an_http_block_the_module_needs_nothing() {
    // nginx -t on a main-only configuration: nothing of the module runs
    let conf = with_modules(|l| vec![l[l.len() - 1].clone()]);
    assert_passes(&conf[..conf.find("http {").unwrap()]);
}
