//! Generates the nginx bindings from the nginx that will load the module,
//! and the native handlers' ABI from its C header.
//!
//! Debian's nginx-dev ships the source tree and the exact configure flags of
//! the packaged binary; configuring a copy of it yields `objs/ngx_auto_config.h`
//! and friends, so struct layouts and the module signature match the binary.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let src = PathBuf::from(env::var("NGX_SRC").unwrap_or_else(|_| "/usr/share/nginx/src".into()));
    println!("cargo:rerun-if-env-changed=NGX_SRC");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!(
        "cargo:rerun-if-changed={}",
        src.join("src/core/nginx.h").display()
    );
    if src.join("conf_flags").exists() {
        println!(
            "cargo:rerun-if-changed={}",
            src.join("conf_flags").display()
        );
    }

    lua_module_range();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let tree = out.join("nginx");
    configure(&src, &tree);

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_item("ngx_.*|NGX_.*|nginx_version|NGINX_.*")
        .allowlist_function(
            "sigfillset|sigdelset|pthread_sigmask|setpriority|getpriority|gettid|eventfd|write|close|sched_setscheduler|dlopen|dlsym|dlerror|dlclose|syscall|kill|pthread_self|pthread_getattr_np|pthread_attr_getstack|pthread_attr_destroy|madvise|mincore",
        )
        .allowlist_item("EFD_CLOEXEC|EFD_NONBLOCK|RTLD_NOW|RTLD_LOCAL|RTLD_NOLOAD|FUTEX_WAIT|FUTEX_WAKE|ESRCH|timespec|MADV_DONTNEED")
        .allowlist_var("SIGILL|SIGFPE|SIGSEGV|SIGBUS|SIG_BLOCK|SCHED_OTHER|SCHED_BATCH|SCHED_IDLE")
        .layout_tests(false)
        .derive_default(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for inc in include_dirs(&tree) {
        builder = builder.clang_arg(format!("-I{}", inc.display()));
    }
    builder
        .generate()
        .expect("bindgen failed on wrapper.h")
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");
    handler_abi(&out);
}

/// The C ABI of native handlers (src/native/abi.rs includes it): the
/// header's types, its exports' function types and its constants, as
/// handler libraries are built against them.
fn handler_abi(out: &Path) {
    const HEADER: &str = "handler/include/ngx_threadpool.h";
    println!("cargo:rerun-if-changed={HEADER}");
    bindgen::Builder::default()
        .header(HEADER)
        .allowlist_type("ngx_tp_.*|ngx_threadpool_.*")
        .allowlist_var("NGX_TP_.*|NGX_THREADPOOL_.*")
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on the handler header")
        .write_to_file(out.join("handler_abi.rs"))
        .expect("cannot write handler_abi.rs");
}

/// Hands Cargo.toml's `[package.metadata.lua-nginx-module]` range to the
/// crate as NGX_TP_LUA_OLDEST and NGX_TP_LUA_NEWEST ("0.10.23"), where the
/// start-up check reads them.
fn lua_module_range() {
    println!("cargo:rerun-if-changed=Cargo.toml");
    let manifest = fs::read_to_string("Cargo.toml").expect("Cargo.toml");
    let mut in_table = false;
    let mut found = 0;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_table = line == "[package.metadata.lua-nginx-module]";
        } else if let Some((key, value)) = line.split_once(" = ").filter(|_| in_table) {
            let key = key.trim().to_uppercase();
            println!(
                "cargo:rustc-env=NGX_TP_LUA_{key}={}",
                value.trim_matches('"')
            );
            found += 1;
        }
    }
    assert_eq!(
        found, 2,
        "Cargo.toml: [package.metadata.lua-nginx-module] needs oldest and newest"
    );
}

/// Copies the nginx source tree and runs its configure with Debian's flags,
/// once per tree: the copy keeps where it came from (the path, nginx.h,
/// the flags), and a build against another NGX_SRC or an upgraded one (in
/// the same target directory) configures that instead of reusing the first.
fn configure(src: &Path, tree: &Path) {
    const ORIGIN: &str = "ngx_threadpool.origin";
    let path = fs::canonicalize(src).unwrap_or_else(|e| panic!("NGX_SRC {}: {e}", src.display()));
    let read = |file: &str| fs::read_to_string(path.join(file)).unwrap_or_default();
    let origin = format!(
        "{}\n{}\n{}",
        path.display(),
        read("src/core/nginx.h"),
        read("conf_flags")
    );
    if tree.join("objs/ngx_auto_config.h").exists()
        && fs::read_to_string(tree.join(ORIGIN)).is_ok_and(|o| o == origin)
    {
        return;
    }
    let _ = fs::remove_dir_all(tree);
    run(Command::new("cp").arg("-r").arg(src).arg(tree));
    // Third-party modules (`--add-module`, as in `openresty -V` or an nginx
    // with the lua module built in) change none of nginx's own structures,
    // and their relative paths rarely exist beside the copy: left out.
    let flags = if tree.join("conf_flags").exists() {
        "source ./conf_flags && flags=() && for f in \"${NGX_CONF_FLAGS[@]}\"; do \
         case $f in --add-module=*|--add-dynamic-module=*) ;; *) flags+=(\"$f\") ;; esac; \
         done && ./configure \"${flags[@]}\""
    } else {
        "./configure --with-threads --with-compat"
    };
    run(Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{flags} >configure.log 2>&1 || {{ cat configure.log >&2; exit 1; }}"
        ))
        .current_dir(tree));
    fs::write(tree.join(ORIGIN), origin).expect("cannot write the tree's origin");
}

/// The -I directories of the configured tree, read from objs/Makefile.
fn include_dirs(tree: &Path) -> Vec<PathBuf> {
    let makefile = fs::read_to_string(tree.join("objs/Makefile")).expect("objs/Makefile");
    let mut dirs = Vec::new();
    let mut in_incs = false;
    for line in makefile.lines() {
        if line.starts_with("ALL_INCS") {
            in_incs = true;
        } else if in_incs && !line.starts_with('\t') {
            break;
        }
        if in_incs {
            let mut words = line.split_whitespace();
            while let Some(w) = words.next() {
                if w == "-I" {
                    if let Some(dir) = words.next() {
                        dirs.push(tree.join(dir));
                    }
                }
            }
        }
    }
    assert!(!dirs.is_empty(), "no ALL_INCS in objs/Makefile");
    dirs
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}
