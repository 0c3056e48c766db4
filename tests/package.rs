//! The Debian package as debian/ makes it: its files, its dependencies,
//! its maintainer scripts, and the module it installs running in Debian's
//! stock configuration layout with the example of docs/configuration.md
//! (nginx-conf/debian/). The package is made by debian/rules around the
//! module cargo test built (make deb builds it from source in a chroot,
//! and CI installs that one). Nothing is installed on the machine: the
//! package is extracted under a temporary prefix and /etc/nginx copied
//! there.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGE: &str = "libnginx-mod-http-threadpool";
const MODULE_SO: &str = "usr/lib/nginx/modules/ngx_http_threadpool_module.so";
const SNIPPET: &str = "usr/share/nginx/modules-available/mod-http-threadpool.conf";
const LUA_DIR: &str = "usr/share/lua/5.1";

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the package of the module cargo test built, into `dir`: the
/// files debian/rules reads copied to `dir`/src, the build marked done (dh
/// skips the build steps when debian/debhelper-build-stamp exists) and
/// `debian/rules binary` run with that module, so that dh_install,
/// dh_nginx, dh_shlibdeps and dh_gencontrol do what they do in make deb's
/// build, without cargo. dh_builddeb writes the package to `dir`.
fn build_package(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut cp = Command::new("cp");
    cp.arg("-r");
    for name in [
        "debian",
        "Makefile",
        "Cargo.toml",
        "README.md",
        "CHANGELOG.md",
        "docs",
        "lua",
        "packaging",
    ] {
        cp.arg(repo().join(name));
    }
    run(cp.arg(&src));
    std::fs::write(
        src.join("debian/debhelper-build-stamp"),
        format!("{PACKAGE}\n"),
    )
    .unwrap();
    run(Command::new("debian/rules")
        .arg("binary")
        .env("DEB_BUILD_OPTIONS", "noautodbgsym")
        .arg(format!("MODULE={}", module_path().display()))
        .current_dir(&src));
    let debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "{debs:?}");
    debs.into_iter().next().unwrap()
}

/// `dpkg-deb -c`: path (without the leading "./") → (mode, owner).
fn contents(deb: &Path) -> BTreeMap<String, (String, String)> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let path = w[5].trim_start_matches("./").trim_end_matches('/');
            (path.to_string(), (w[0].to_string(), w[1].to_string()))
        })
        .collect()
}

fn field(deb: &Path, name: &str) -> String {
    run(Command::new("dpkg-deb").arg("-f").arg(deb).arg(name))
        .trim()
        .to_string()
}

/// The nginx ABI the installed nginx provides (e.g. nginx-abi-1.22.1-7).
fn nginx_abi() -> String {
    run(Command::new("dpkg-query")
        .arg("-W")
        .arg("-f=${Provides}")
        .arg("nginx"))
    .split(", ")
    .find(|p| p.starts_with("nginx-abi-"))
    .expect("nginx provides no nginx-abi-*")
    .to_string()
}

/// The package that ships the LuaJIT library the module links.
fn luajit_package() -> String {
    let owner = run(Command::new("dpkg-query")
        .arg("-S")
        .arg("libluajit-5.1.so.2"));
    owner.split(':').next().unwrap().trim().to_string()
}

/// Whether the nginx under test is not the one the package is for: the
/// package depends on Debian's dynamic lua module and nginx ABI, which an
/// nginx with the lua module built in (make test-openresty) does not have.
fn not_debian_nginx() -> bool {
    let built_in = lua_built_in();
    if built_in {
        eprintln!(
            "{} has the lua module built in: no Debian package for it",
            nginx()
        );
    }
    built_in
}

#[test]
fn package_files_and_dependencies() {
    if not_debian_nginx() {
        return;
    }
    let dir = prefix("deb");
    let deb = build_package(&dir);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("{PACKAGE}_{version}-1_amd64.deb")
    );
    assert_eq!(field(&deb, "Package"), PACKAGE);
    assert_eq!(field(&deb, "Version"), format!("{version}-1"));
    let depends = field(&deb, "Depends");
    // the range of lua module releases of Cargo.toml, with the epoch
    // Debian gives libnginx-mod-http-lua; LuaJIT by the package of this
    // release that ships it (Debian 12: libluajit2-5.1-2, 13: libluajit-5.1-2)
    let oldest = format!("libnginx-mod-http-lua (>= 1:{})", env!("NGX_TP_LUA_OLDEST"));
    let (newest_minor, newest_patch) = env!("NGX_TP_LUA_NEWEST").rsplit_once('.').unwrap();
    let after = format!(
        "libnginx-mod-http-lua (<< 1:{newest_minor}.{}~)",
        newest_patch.parse::<u32>().unwrap() + 1
    );
    for dep in [
        nginx_abi().as_str(),
        &oldest,
        &after,
        "lua-resty-core",
        &luajit_package(),
    ] {
        assert!(depends.contains(dep), "{dep} not in Depends: {depends}");
    }

    assert!(!depends.contains("${"), "a substvar left: {depends}");

    let files = contents(&deb);
    // the documentation as dh_compress leaves it: compressed above 4 KiB
    let doc = "usr/share/doc/libnginx-mod-http-threadpool";
    let regular: Vec<&str> = files
        .iter()
        .filter(|(_, (mode, _))| mode.starts_with('-'))
        .map(|(p, _)| match p.strip_prefix(doc) {
            Some(_) => p.strip_suffix(".gz").unwrap_or(p),
            None => p.as_str(),
        })
        .collect();
    // the README, the reference it links to, the changelogs (upstream's
    // CHANGELOG.md as changelog), the copyright and lintian's overrides
    let mut want = vec![
        MODULE_SO.to_string(),
        format!("usr/share/lintian/overrides/{PACKAGE}"),
        format!("{doc}/README.md"),
        format!("{doc}/changelog"),
        format!("{doc}/changelog.Debian"),
        format!("{doc}/copyright"),
        "usr/share/lua/5.1/resty/threadpool.lua".to_string(),
        SNIPPET.to_string(),
    ];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            want.push(format!("{doc}/docs/{name}"));
        }
    }
    want.sort();
    let mut regular = regular;
    regular.sort();
    assert_eq!(regular, want);
    // readable by nginx's worker user; owned by root whoever built it
    for (path, (mode, owner)) in &files {
        let want = if mode.starts_with('d') {
            "drwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert_eq!(
            (mode.as_str(), owner.as_str()),
            (want, "root/root"),
            "{path}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A maintainer script of the extracted package, run against the layout
/// under `conf` instead of /etc/nginx (dpkg's trigger call disabled).
fn maintainer_script(dir: &Path, script: &str, args: &[&str]) {
    let text = std::fs::read_to_string(dir.join("DEBIAN").join(script)).unwrap();
    let text = text
        .replace("/etc/nginx/", &format!("{}/conf/", dir.display()))
        .replace(
            "/usr/share/nginx/modules-available/",
            &format!("{}/root/usr/share/nginx/modules-available/", dir.display()),
        )
        .replace("dpkg-trigger", "true");
    assert!(
        !text.contains("/etc/"),
        "{script} still names /etc:\n{text}"
    );
    run(Command::new("sh")
        .arg("-c")
        .arg(&text)
        .arg(script)
        .args(args));
}

fn enabled(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("conf/modules-enabled"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Debian's /etc/nginx copied to `dir`/conf with its paths rewritten to
/// `dir`, no site enabled (the stock default site listens on port 80) and
/// the stock modules directory as `dir`/modules, plus the package's module.
fn stock_layout(dir: &Path) {
    run(Command::new("cp")
        .arg("-a")
        .arg("/etc/nginx/.")
        .arg(dir.join("conf")));
    for sub in ["sites-enabled", "conf.d"] {
        let _ = std::fs::remove_dir_all(dir.join("conf").join(sub));
        std::fs::create_dir(dir.join("conf").join(sub)).unwrap();
    }
    // only the stock modules: not this package, should it be installed
    for name in enabled(dir) {
        if name.contains("threadpool") {
            std::fs::remove_file(dir.join("conf/modules-enabled").join(name)).unwrap();
        }
    }
    let conf = std::fs::read_to_string(dir.join("conf/nginx.conf")).unwrap();
    let conf = conf
        .replace("/etc/nginx/", &format!("{}/conf/", dir.display()))
        .replace("/var/log/nginx/", &format!("{}/logs/", dir.display()))
        .replace(
            "/run/nginx.pid",
            &format!("{}/logs/nginx.pid", dir.display()),
        );
    std::fs::write(dir.join("conf/nginx.conf"), conf).unwrap();
    // `load_module modules/...` is relative to the prefix (-p)
    std::fs::create_dir(dir.join("modules")).unwrap();
    for entry in std::fs::read_dir(MODULES).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().contains("threadpool") {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), dir.join("modules").join(entry.file_name()))
            .unwrap();
    }
    std::os::unix::fs::symlink(
        dir.join("root").join(MODULE_SO),
        dir.join("modules/ngx_http_threadpool_module.so"),
    )
    .unwrap();
}

/// docs/configuration.md's example (nginx-conf/debian/: one conf.d
/// snippet) in the layout, with its paths and port rewritten; the
/// package's Lua files come first in the path.
fn example(dir: &Path, port: u16) {
    let src = repo().join("nginx-conf/debian");
    let site = std::fs::read_to_string(src.join("threadpool.conf")).unwrap();
    assert!(site.contains(";;\";") && site.contains("127.0.0.1:8080"));
    let site = site
        .replace("/etc/nginx/", &format!("{}/conf/", dir.display()))
        .replace(
            ";;\";",
            &format!(";{}/root/{LUA_DIR}/?.lua;;\";", dir.display()),
        )
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    std::fs::write(dir.join("conf/conf.d/threadpool.conf"), site).unwrap();
    // -T: the stock layout may have a lua/ of its own already
    run(Command::new("cp")
        .arg("-rT")
        .arg(src.join("lua"))
        .arg(dir.join("conf/lua")));
}

#[test]
fn package_runs_in_the_stock_layout() {
    if not_debian_nginx() {
        return;
    }
    let dir = prefix("deb");
    let deb = build_package(&dir);
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(dir.join("root")));
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(dir.join("DEBIAN")));
    stock_layout(&dir);

    // dpkg's configure step enables the module after the lua module
    maintainer_script(&dir, "postinst", &["configure"]);
    let names = enabled(&dir);
    let ours = "60-mod-http-threadpool.conf";
    assert!(names.contains(&ours.to_string()), "{names:?}");
    let lua_at = names.iter().position(|n| n == "50-mod-http-lua.conf");
    let ours_at = names.iter().position(|n| n == ours);
    assert!(lua_at.is_some() && lua_at < ours_at, "{names:?}");
    assert_eq!(
        std::fs::read_link(dir.join("conf/modules-enabled").join(ours)).unwrap(),
        dir.join("root").join(SNIPPET)
    );

    let port = free_port();
    example(&dir, port);
    let nginx = Case::laid_out(dir.clone(), port)
        .args(&["-g", "daemon off;"])
        .start();
    let r = nginx.get("/upper?s=debian");
    assert_eq!((r.status, r.text()), (200, "DEBIAN (thread_pool)\n".into()));
    let r = nginx.get("/upper-inline?s=debian");
    assert_eq!((r.status, r.text()), (200, "DEBIAN (content)\n".into()));
    nginx.assert_clean_log();

    // remove: the link is set aside as Debian's modules do; purge: gone
    maintainer_script(&dir, "prerm", &["remove"]);
    maintainer_script(&dir, "postrm", &["remove"]);
    let names = enabled(&dir);
    assert!(!names.contains(&ours.to_string()), "{names:?}");
    assert!(names.contains(&format!("{ours}.removed")), "{names:?}");
    maintainer_script(&dir, "postrm", &["purge"]);
    assert!(
        !enabled(&dir).iter().any(|n| n.contains("threadpool")),
        "{:?}",
        enabled(&dir)
    );
    // dropping nginx stops it and removes the prefix
}

/// `make install` and `make uninstall` under DESTDIR: the same files as
/// the package, plus the modules-enabled link; uninstall takes them all.
#[test]
fn make_install_and_uninstall() {
    let dir = prefix("install");
    let make = |target: &str| {
        run(Command::new("make")
            .arg("-s")
            .arg("--no-print-directory")
            .arg("-C")
            .arg(repo())
            .arg(target)
            .arg(format!("MODULE={}", module_path().display()))
            .arg(format!("DESTDIR={}", dir.display())))
    };
    let files = |dir: &Path| {
        let out = run(Command::new("find")
            .arg(".")
            .arg("-not")
            .arg("-type")
            .arg("d")
            .arg("-printf")
            .arg("%p %m %l\n")
            .current_dir(dir));
        let mut lines: Vec<String> = out.lines().map(String::from).collect();
        lines.sort();
        lines
    };
    make("install");
    assert_eq!(
        files(&dir),
        [
            "./etc/nginx/modules-enabled/60-mod-http-threadpool.conf 777 \
             /usr/share/nginx/modules-available/mod-http-threadpool.conf",
            "./usr/lib/nginx/modules/ngx_http_threadpool_module.so 644 ",
            "./usr/share/lua/5.1/resty/threadpool.lua 644 ",
            "./usr/share/nginx/modules-available/mod-http-threadpool.conf 644 ",
        ]
    );
    assert_eq!(
        std::fs::read_to_string(
            dir.join("usr/share/nginx/modules-available/mod-http-threadpool.conf")
        )
        .unwrap(),
        "load_module modules/ngx_http_threadpool_module.so;\n"
    );
    make("uninstall");
    assert_eq!(files(&dir), Vec::<String>::new());
    std::fs::remove_dir_all(&dir).unwrap();
}
