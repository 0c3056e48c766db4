//! What a release publishes (docs/installation.md, "Publishing a
//! release"): one version, Cargo.toml's, in every place that must carry
//! it; the repository placeholders in agreement; dist.ini by opm's own
//! rules; the rockspec by LuaRocks, then installed with `luarocks make`
//! into a tree that an nginx uses. `make publish-check` (in `make test`)
//! packages and builds the two crates as crates.io would.

mod common;

use common::{lua_built_in, lua_module_lines, module_path, nginx, repo, user_line, Case};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The project's version: `[workspace.package]`'s, which every package of
/// the workspace that is released inherits.
const VERSION: &str = env!("CARGO_PKG_VERSION");
const ROCK: &str = "lua-resty-threadpool";
const DEB_PACKAGE: &str = "libnginx-mod-http-threadpool";
const MAIN_MODULE: &str = "lua/resty/threadpool.lua";

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of `[table]` in a TOML file (up to the next header).
fn toml_table<'a>(text: &'a str, table: &str) -> Vec<&'a str> {
    let header = format!("[{table}]");
    text.lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .collect()
}

/// `key = "value"` in `[table]`: the value.
fn toml_string(text: &str, table: &str, key: &str) -> Option<String> {
    toml_table(text, table).iter().find_map(|l| {
        let v = l.strip_prefix(key)?.trim_start().strip_prefix('=')?.trim();
        Some(v.strip_prefix('"')?.strip_suffix('"')?.to_string())
    })
}

/// The one rockspec at the top of the repository: its file name.
fn rockspec_name() -> String {
    let mut names: Vec<String> = std::fs::read_dir(repo())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(ROCK) && n.ends_with(".rockspec"))
        .collect();
    assert_eq!(names.len(), 1, "one rockspec: {names:?}");
    names.pop().unwrap()
}

/// The rockspec, run as LuaRocks reads it: its globals.
fn rockspec() -> (mlua::Lua, String) {
    let name = rockspec_name();
    let lua = mlua::Lua::new();
    lua.load(read(&name)).set_name(&name).exec().unwrap();
    (lua, name)
}

/// dist.ini as opm reads it (bin/opm's read_ini): `key = value` lines of
/// the default section, `#` and `;` comments. A section header, which
/// opm's build refuses ("unrecognized section names"), or a duplicate key
/// fails here.
fn dist_ini() -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for (n, line) in read("dist.ini").lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        let (k, v) = t
            .split_once('=')
            .unwrap_or_else(|| panic!("dist.ini:{}: not `key = value`: {line}", n + 1));
        let (k, v) = (k.trim(), v.trim());
        assert!(
            !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_'),
            "dist.ini:{}: bad key {k:?}",
            n + 1
        );
        assert!(
            !keys.iter().any(|(have, _)| have == k),
            "dist.ini:{}: duplicate key {k}",
            n + 1
        );
        keys.push((k.to_string(), v.to_string()));
    }
    keys
}

fn ini_value<'a>(ini: &'a [(String, String)], key: &str) -> Option<&'a str> {
    ini.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The version opm takes from `main_module`: bin/opm's own regex, run by
/// perl (the first line with `_VERSION`, `VERSION` or `version` `=` a
/// value with a digit, stripped of quotes, brackets and separators).
fn opm_code_version(main_module: &str) -> Option<String> {
    let out = Command::new("perl")
        .arg("-ne")
        .arg(
            r#"if (/\b(?:_?VERSION|version)\s*=\s*(\S+)/) { (my $ver = $1) =~ s/[;,'"{}()<>]|\[=*\[|\]=*\]|\s+$//g; if ($ver =~ /\d/) { print $ver; exit } }"#,
        )
        .arg(repo().join(main_module))
        .output()
        .expect("perl");
    assert!(out.status.success(), "{out:?}");
    let v = String::from_utf8(out.stdout).unwrap();
    (!v.is_empty()).then_some(v)
}

/// The first line of debian/changelog: (package, version).
fn debian_changelog() -> Option<(String, String)> {
    let text = std::fs::read_to_string(repo().join("debian/changelog")).ok()?;
    let first = text.lines().next()?;
    let (package, rest) = first.split_once(" (")?;
    let (version, _) = rest.split_once(") ")?;
    Some((package.to_string(), version.to_string()))
}

/// The version in Cargo.toml's `[workspace.package]` is the one version
/// of everything a release publishes; each copy another tool needs
/// literally must say it. Every copy that says otherwise is named.
#[test]
fn one_version_everywhere() {
    let mut wrong: Vec<String> = Vec::new();
    let mut check = |what: &str, found: Option<String>, want: &str| {
        if found.as_deref() != Some(want) {
            wrong.push(format!("{what}: {found:?}, not {want:?}"));
        }
    };
    let root = read("Cargo.toml");
    check(
        "Cargo.toml [workspace.package] version",
        toml_string(&root, "workspace.package", "version"),
        VERSION,
    );
    // the packages inherit it: no version of their own
    for manifest in ["Cargo.toml", "handler/Cargo.toml", "wire/Cargo.toml"] {
        let text = read(manifest);
        let inherits = toml_table(&text, "package")
            .iter()
            .any(|l| l.trim() == "version.workspace = true");
        check(
            &format!("{manifest} [package] version.workspace = true"),
            Some(inherits.to_string()),
            "true",
        );
    }
    // the handler crate requires exactly its own release of the wire crate
    let wire = toml_table(&root, "workspace.dependencies")
        .iter()
        .find_map(|l| l.strip_prefix("ngx_threadpool_wire = "))
        .and_then(|l| l.split("version = \"").nth(1))
        .and_then(|l| l.split('"').next())
        .map(String::from);
    check(
        "Cargo.toml [workspace.dependencies] ngx_threadpool_wire's version",
        wire,
        &format!("={VERSION}"),
    );

    // the Lua shim: opm reads its _VERSION (and dist.ini has no version
    // of its own, which opm would compare)
    check(
        &format!("{MAIN_MODULE} _VERSION, as opm reads it"),
        opm_code_version(MAIN_MODULE),
        VERSION,
    );
    if let Some(v) = ini_value(&dist_ini(), "version") {
        check("dist.ini's version", Some(v.to_string()), VERSION);
    }

    // the rockspec: its file name, its version, the tag it fetches
    let (lua, name) = rockspec();
    let g = lua.globals();
    let version: String = g.get("version").unwrap();
    let (upstream, revision) = version.rsplit_once('-').expect("VERSION-REVISION");
    check(
        "the rockspec's version",
        Some(upstream.to_string()),
        VERSION,
    );
    check(
        "the rockspec's file name",
        Some(name.clone()),
        &format!("{ROCK}-{VERSION}-{revision}.rockspec"),
    );
    let tag: Option<String> = g.get::<mlua::Table>("source").unwrap().get("tag").unwrap();
    check("the rockspec's source.tag", tag, &format!("v{VERSION}"));

    // the Debian package's changelog (its version is VERSION-REVISION,
    // maybe with an epoch)
    let deb = debian_changelog();
    check(
        "debian/changelog's package",
        deb.as_ref().map(|(p, _)| p.clone()),
        DEB_PACKAGE,
    );
    let upstream = deb.as_ref().map(|(_, v)| {
        let v = v.split_once(':').map_or(v.as_str(), |(_, v)| v);
        v.rsplit_once('-').map_or(v, |(u, _)| u).to_string()
    });
    check("debian/changelog's first version", upstream, VERSION);

    // handler/README.md's dependency line: a requirement this version meets
    // (Cargo's default caret: "0.1" for 0.1.x, "1" for 1.x)
    let (major, rest) = VERSION.split_once('.').unwrap();
    let minor = rest.split('.').next().unwrap();
    let caret = if major == "0" {
        format!("0.{minor}")
    } else {
        major.to_string()
    };
    let readme = read("handler/README.md");
    let dep = readme
        .lines()
        .find_map(|l| l.strip_prefix("ngx_threadpool_handler = \""))
        .and_then(|l| l.strip_suffix('"'))
        .map(String::from);
    check("handler/README.md's ngx_threadpool_handler", dep, &caret);

    // the docs that name the rockspec name this one
    let mut docs = vec!["README.md".to_string()];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        if n.ends_with(".md") {
            docs.push(format!("docs/{n}"));
        }
    }
    for doc in docs {
        let text = read(&doc);
        for (at, _) in text.match_indices(&format!("{ROCK}-")) {
            let tail = &text[at..];
            if tail[ROCK.len() + 1..].starts_with(|c: char| c.is_ascii_digit()) {
                let end = tail.find(".rockspec").map_or(tail.len(), |e| e + 9);
                check(
                    &format!("{doc}'s rockspec"),
                    Some(tail[..end].to_string()),
                    &name,
                );
            }
        }
    }

    assert!(
        wrong.is_empty(),
        "Cargo.toml's version is {VERSION}; these copies disagree:\n  {}",
        wrong.join("\n  ")
    );
}

/// `https://github.com/OWNER/NAME` (or `git+...NAME.git`): (OWNER, NAME).
fn github(url: &str) -> (String, String) {
    let path = url
        .trim_start_matches("git+")
        .strip_prefix("https://github.com/")
        .unwrap_or_else(|| panic!("not a GitHub https address: {url}"));
    let (owner, name) = path.split_once('/').expect(url);
    let name = name.trim_end_matches(".git").trim_end_matches('/');
    (owner.to_string(), name.to_string())
}

/// The repository address is not known before the first release: OWNER
/// stands for its GitHub account in Cargo.toml's `repository`, the
/// rockspec's `source.url` and dist.ini's `repo_link`, which the
/// maintainer fills in at release. The three must name the same account
/// (opm uploads only under the account of repo_link), and the rockspec
/// the crates' repository.
#[test]
fn repository_placeholders_agree() {
    let repository = toml_string(&read("Cargo.toml"), "workspace.package", "repository")
        .expect("Cargo.toml: [workspace.package] repository");
    let (owner, _) = github(&repository);
    let (lua, _) = rockspec();
    let url: String = lua
        .globals()
        .get::<mlua::Table>("source")
        .unwrap()
        .get("url")
        .unwrap();
    assert_eq!(url, format!("git+{repository}.git"));
    let ini = dist_ini();
    let (link_owner, _) = github(ini_value(&ini, "repo_link").expect("repo_link"));
    assert_eq!(link_owner, owner, "dist.ini's repo_link and Cargo.toml's");
    // the crates' READMEs name no repository of their own
    for readme in ["handler/README.md", "wire/README.md"] {
        assert!(!read(readme).contains("github.com/"), "{readme}");
    }
}

/// opm's licence names (bin/opm's %Licenses).
const OPM_LICENSES: &[&str] = &[
    "apache2",
    "3bsd",
    "2bsd",
    "gpl",
    "gpl2",
    "gpl3",
    "lgpl",
    "mit",
    "mozilla2",
    "cddl",
    "eclipse",
    "public",
    "artistic",
    "artistic2",
    "proprietary",
    "ccby",
    "ccbysa",
    "ccbynd",
    "ccbync",
    "ccbyncsa",
    "ccbyncnd",
];

/// A relative path without `..` (bin/opm's check_user_file_path).
fn user_path(key: &str, value: &str) -> PathBuf {
    assert!(
        !value.contains("..") && !Path::new(value).is_absolute(),
        "dist.ini: {key} {value}"
    );
    repo().join(value)
}

fn word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// One item of `requires` (bin/opm's parse_deps): `account/name`, or
/// one of opm's special names, optionally `OP VERSION` with OP `>=`, `=`
/// or `>`. Returns (name, version).
fn opm_dependency(item: &str) -> (String, Option<String>) {
    let name_end = item
        .find(|c: char| !(word(c) || c == '-' || c == '/'))
        .unwrap_or(item.len());
    let (name, rest) = item.split_at(name_end);
    let special = ["openresty", "luajit", "ngx_lua", "ngx_http_lua", "nginx"];
    let scoped = name.split_once('/').is_some_and(|(a, n)| {
        !a.is_empty()
            && !n.is_empty()
            && a.chars().all(|c| word(c) || c == '-')
            && n.chars().all(|c| word(c) || c == '-')
    });
    assert!(
        scoped || special.contains(&name),
        "dist.ini: requires: bad dependency name {name:?}"
    );
    let rest = rest.trim();
    if rest.is_empty() {
        return (name.to_string(), None);
    }
    let op_end = rest
        .find(|c: char| word(c) || c.is_whitespace())
        .expect(item);
    let (op, version) = (&rest[..op_end], rest[op_end..].trim());
    assert!(
        [">=", "=", ">"].contains(&op),
        "dist.ini: requires: bad operator in {item:?}"
    );
    assert!(
        version.starts_with(word)
            && version.contains(|c: char| c.is_ascii_digit())
            && version.chars().all(|c| word(c) || c == '-' || c == '.'),
        "dist.ini: requires: bad version in {item:?}"
    );
    (name.to_string(), Some(version.to_string()))
}

/// dist.ini by the rules `opm build` and `opm upload` apply (bin/opm,
/// do_build and do_upload; opm itself needs a GitHub account and the
/// network, so its checks are restated here): the keys it requires and
/// knows, a dist name it accepts, licences it knows, repo_link's form and
/// its project name against the dist's, lib_dir, main_module and doc_dir
/// as relative paths that exist, the version it reads from main_module,
/// the requires syntax, a README at the top. Then this project's facts:
/// the rockspec's package name, Cargo.toml's oldest lua-nginx-module.
#[test]
fn dist_ini_follows_opm_rules() {
    let ini = dist_ini();
    let known = [
        "name",
        "abstract",
        "author",
        "is_original",
        "license",
        "lib_dir",
        "doc_dir",
        "repo_link",
        "main_module",
        "requires",
        "exclude_files",
        "version",
    ];
    for (k, _) in &ini {
        assert!(
            known.contains(&k.as_str()),
            "dist.ini: opm knows no key {k}"
        );
    }
    let get = |k: &str| {
        ini_value(&ini, k)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| panic!("dist.ini: {k} missing"))
    };

    let name = get("name");
    let lower = name.to_ascii_lowercase();
    assert!(
        name.len() >= 3
            && name.chars().all(|c| word(c) || c == '-')
            && !["nginx", "luajit", "resty", "openresty", "opm"].contains(&lower.as_str())
            && !lower.starts_with("restydoc")
            && !lower.starts_with("ngx_")
            && !lower.ends_with("-nginx-module"),
        "dist.ini: opm refuses the name {name}"
    );
    for author in get("author").split(',') {
        assert!(
            author.chars().any(|c| c.is_ascii_alphabetic()),
            "dist.ini: author {author:?}"
        );
    }
    assert!(["yes", "no"].contains(&get("is_original")));
    for license in get("license").split(',') {
        assert!(
            OPM_LICENSES.contains(&license.trim()),
            "dist.ini: opm knows no license {license:?}"
        );
    }
    assert!(
        get("license").split(',').any(|l| l.trim() != "proprietary"),
        "opm upload refuses proprietary code"
    );
    get("abstract");

    let link = get("repo_link");
    assert!(
        (link.starts_with("http://") || link.starts_with("https://"))
            && !link.contains(|c: char| "\"'<>{}".contains(c) || c.is_whitespace())
            && link.chars().all(|c| c.is_ascii_graphic()),
        "dist.ini: bad repo_link {link}"
    );
    if link.contains("github.com") {
        let (_, project) = github(link);
        let (p, n) = (project.to_ascii_lowercase(), lower.clone());
        assert!(
            p.contains(&n) || n.contains(&p),
            "dist.ini: opm build refuses the project {project:?} of repo_link for the name {name:?}"
        );
    }

    let lib_dir = get("lib_dir");
    assert!(user_path("lib_dir", lib_dir).is_dir(), "lib_dir {lib_dir}");
    let main_module = get("main_module");
    assert!(user_path("main_module", main_module).is_file());
    assert!(
        main_module.starts_with(&format!("{lib_dir}/")),
        "opm rebases main_module onto lib_dir"
    );
    // opm copies every .md, .markdown and .pod under doc_dir into the
    // package: not the checkout (its target/), only the library's
    let doc_dir = get("doc_dir");
    assert!(user_path("doc_dir", doc_dir).is_dir(), "doc_dir {doc_dir}");
    assert_eq!(
        doc_dir, lib_dir,
        "doc_dir: not a directory with target/ in it"
    );
    assert!(
        repo().join("README.md").is_file(),
        "opm build needs README.md"
    );

    let code = opm_code_version(main_module).expect("opm finds no version in main_module");
    assert!(
        code.chars().all(|c| word(c) || c == '.'),
        "opm's upload name takes [.\\w]+: {code}"
    );

    let deps: Vec<(String, Option<String>)> = get("requires")
        .split(',')
        .map(|d| opm_dependency(d.trim()))
        .collect();
    assert!(deps.len() < 100, "opm: too many dependencies");
    assert!(
        deps.contains(&(
            "ngx_http_lua".to_string(),
            Some(env!("NGX_TP_LUA_OLDEST").to_string())
        )),
        "dist.ini requires ngx_http_lua >= Cargo.toml's oldest: {deps:?}"
    );
    assert_eq!(name, ROCK, "the opm dist and the rock have one name");
}

/// The rockspec installs every file of lua/ as the module its path names.
#[test]
fn the_rockspec_lists_every_lua_file() {
    let mut lua_files: Vec<String> = std::fs::read_dir(repo().join("lua/resty"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            p.strip_prefix(repo()).unwrap().display().to_string()
        })
        .collect();
    lua_files.sort();
    let (lua, _) = rockspec();
    let g = lua.globals();
    assert_eq!(g.get::<String>("package").unwrap(), ROCK);
    let modules: mlua::Table = g
        .get::<mlua::Table>("build")
        .unwrap()
        .get("modules")
        .unwrap();
    let mut listed: Vec<(String, String)> = modules.pairs().map(|kv| kv.unwrap()).collect();
    listed.sort();
    for (module, file) in &listed {
        assert_eq!(file, &format!("lua/{}.lua", module.replace('.', "/")));
    }
    let files: Vec<String> = listed.into_iter().map(|(_, f)| f).collect();
    assert_eq!(files, lua_files);
}

/// A directory removed with its contents when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `luarocks ARGS` in the repository, with `home` as its HOME (no user
/// configuration read, nothing written outside the temporary directory).
fn luarocks(home: &Path, args: &[&str]) -> String {
    let out = Command::new("luarocks")
        .args(args)
        .current_dir(repo())
        .env("HOME", home)
        .output()
        .expect("luarocks (make deps installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "luarocks {args:?}:\n{text}");
    text
}

/// The directory of the lua-resty-core that the nginx under test uses:
/// Debian's, or the lualib beside an nginx with the lua module built in
/// (OpenResty's layout, make test-openresty).
fn resty_core_dir() -> PathBuf {
    let nginx = Path::new(nginx());
    let mut candidates = Vec::new();
    if lua_built_in() {
        for up in nginx.ancestors().skip(2).take(2) {
            candidates.push(up.join("lualib"));
        }
    }
    candidates.push(PathBuf::from("/usr/share/lua/5.1"));
    candidates
        .into_iter()
        .find(|d| d.join("resty/core.lua").is_file())
        .expect("no lua-resty-core found")
}

/// `luarocks lint` accepts the rockspec, and `luarocks make` installs the
/// rock into a tree of its own, from which an nginx whose
/// lua_package_path names only that tree and lua-resty-core's directory
/// requires resty.threadpool, pushes a task, and finds the version in
/// both the event loop's library and a pool thread's.
#[test]
fn the_rock_installs_and_nginx_uses_it() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("ngx_threadpool-rock-{}", std::process::id())));
    let home = dir.0.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let name = rockspec_name();
    luarocks(&home, &["lint", &name]);
    let tree = dir.0.join("tree");
    let tree_arg = tree.display().to_string();
    luarocks(
        &home,
        &["--lua-version=5.1", "--tree", &tree_arg, "make", &name],
    );
    let lua_dir = tree.join("share/lua/5.1");
    let installed = lua_dir.join("resty/threadpool.lua");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(repo().join(MAIN_MODULE)).unwrap()
    );

    let conf = format!(
        r#"{lua_lines}load_module {module};
error_log logs/error.log info;
pid logs/nginx.pid;
events {{}}
http {{
    access_log off;
    lua_package_path "{lua_dir}/?.lua;{core}/?.lua";
    lua_thread_pool p threads=1;
    thread_pool_process_by_lua_block p {{
        local s = ...
        return s:upper(), require("resty.threadpool")._VERSION
    }}
    server {{
        listen 127.0.0.1:$PORT;
        location / {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                local up, thread_version = tp.p:push_task("rock")
                ngx.say(up, " ", thread_version, " ", tp._VERSION, " ",
                        package.searchpath("resty.threadpool", package.path))
            }}
        }}
    }}
}}
"#,
        lua_lines = lua_module_lines(),
        module = module_path().display(),
        lua_dir = lua_dir.display(),
        core = resty_core_dir().display(),
    );
    let n = Case::conf(&conf)
        .args(&["-g", &format!("daemon off; {}", user_line())])
        .start();
    let r = n.get("/");
    assert_eq!(
        (r.status, r.text()),
        (
            200,
            format!("ROCK {VERSION} {VERSION} {}\n", installed.display())
        )
    );
    n.assert_clean_log();
}
