//! What the machine and the environment choose: the nginx under test, its
//! lua module, this module's build, the user nginx runs as, a test's counts.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub const MODULES: &str = "/usr/lib/nginx/modules";

/// The nginx under test: `NGX_TP_NGINX` when set (`make test-openresty`
/// points it at OpenResty's nginx, the lua module compiled in), else Debian's.
pub fn nginx() -> &'static str {
    static NGINX: OnceLock<String> = OnceLock::new();
    NGINX.get_or_init(|| std::env::var("NGX_TP_NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".into()))
}

/// Whether lua-nginx-module is compiled into that nginx (OpenResty's
/// shape: its `-V` lists it among `--add-module`, as the release's source
/// directory, `lua-nginx-module-*` or, in OpenResty's own bundle,
/// `ngx_lua-*`), so that no `load_module` line loads it or ngx_devel_kit.
/// The Makefile's `make run` decides the same way (RUN_LUA_MODULES).
pub fn lua_built_in() -> bool {
    static BUILT_IN: OnceLock<bool> = OnceLock::new();
    *BUILT_IN.get_or_init(|| {
        let out = Command::new(nginx()).arg("-V").output().expect("nginx -V");
        String::from_utf8_lossy(&out.stderr)
            .split_whitespace()
            .filter_map(|flag| flag.strip_prefix("--add-module="))
            .any(|dir| dir.contains("lua-nginx-module") || dir.contains("ngx_lua-"))
    })
}

/// The dynamic lua module under test: `NGX_TP_LUA_MODULE` when set (`make
/// test-lua-releases` points it at a release that matrix/lua-module.sh
/// built for this nginx), else Debian's.
pub fn lua_module_path() -> &'static str {
    static LUA: OnceLock<String> = OnceLock::new();
    LUA.get_or_init(|| {
        std::env::var("NGX_TP_LUA_MODULE")
            .unwrap_or_else(|_| format!("{MODULES}/ngx_http_lua_module.so"))
    })
}

/// The lines that load ngx_devel_kit and lua-nginx-module before this
/// module: none when the lua module is built in. ngx_devel_kit is always
/// Debian's: matrix/lua-module.sh builds each release against its headers
/// (libnginx-mod-http-ndk-dev), as Debian builds its own lua module.
pub fn lua_module_lines() -> String {
    if lua_built_in() {
        String::new()
    } else {
        format!(
            "load_module {MODULES}/ndk_http_module.so;\nload_module {};\n",
            lua_module_path()
        )
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The module that `cargo test` built for this very test binary: the
/// cdylib beside it in target/<profile>/deps/. (target/release/ holds what
/// the last `cargo build` left, which `cargo test` does not refresh.)
pub fn module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let p = exe.with_file_name("libngx_threadpool.so");
    assert!(p.exists(), "{} missing", p.display());
    p
}

/// As root, nginx switches its workers to `nobody`, who may not read a
/// checkout in a private directory (mktemp -d makes it 0700): the workers
/// then keep the tests' user.
pub fn user_line() -> &'static str {
    match std::fs::metadata("/proc/self") {
        Ok(m) if m.uid() == 0 => "user root;",
        _ => "",
    }
}

/// The number in environment variable `name`, or `default` when it is not
/// set (a test's count or seed).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// What the harness adds to nginx's environment: with `NGX_TP_LUAJIT` (a
/// directory holding a `libluajit-5.1.so.2`, as `make test-luajit-assert`
/// builds one with LuaJIT's assertions), `LD_LIBRARY_PATH` naming it, so
/// that nginx, the lua module and this module load that LuaJIT; with
/// `NGX_TP_MALLOC_PERTURB` (a byte, as `make test-perturb` sets it),
/// glibc's `MALLOC_PERTURB_`, which the master reads at its first malloc
/// and its workers inherit by fork (nginx clears their environment, not
/// that). Only nginx gets them, not cargo or the tests themselves.
pub fn nginx_env() -> Vec<(String, String)> {
    let mut env = Vec::new();
    for (from, to) in [
        ("NGX_TP_LUAJIT", "LD_LIBRARY_PATH"),
        ("NGX_TP_MALLOC_PERTURB", "MALLOC_PERTURB_"),
    ] {
        if let Ok(v) = std::env::var(from) {
            if !v.is_empty() {
                env.push((to.to_string(), v));
            }
        }
    }
    env
}
