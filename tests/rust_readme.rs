//! handler/README.md's complete example, tried as a new user would: its
//! Cargo.toml and src/lib.rs blocks, the dependency on the crate pointed
//! at this repository's handler/ (as the README says to from a checkout),
//! built offline as a new crate in a temporary directory outside the
//! repository, loaded with the README's `thread_pool_process_by_rust`
//! line, and called with the README's Lua lines, whose comments are the
//! results it documents.

mod common;

use common::{repo, Case};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The body of the first fenced block of `lang` after `from` in `text`.
fn block<'a>(text: &'a str, from: &str, lang: &str) -> &'a str {
    let at = text
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} not in the README"));
    let open = format!("```{lang}\n");
    let start = at + text[at..].find(&open).expect("no such block") + open.len();
    let end = start + text[start..].find("```").expect("unclosed block");
    &text[start..end]
}

/// A directory removed with its contents when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The README's crate, built: its library.
fn build(readme: &str, dir: &Path) -> PathBuf {
    // the crates.io dependency as the README's prose says to write it
    // from a checkout: this repository's handler/
    let toml: String = block(readme, "## A handler, complete", "toml")
        .lines()
        .map(|l| {
            if l.starts_with("ngx_threadpool_handler = ") {
                format!(
                    "ngx_threadpool_handler = {{ path = \"{}\" }}\n",
                    repo().join("handler").display()
                )
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert!(
        readme.contains("ngx_threadpool_handler = { path = \"/path/to/ngx_threadpool/handler\" }")
            && toml.contains(&repo().join("handler").display().to_string()),
        "the README no longer says how to depend on a checkout:\n{toml}"
    );
    let lib = block(readme, "`src/lib.rs`:", "rust");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), &toml).unwrap();
    std::fs::write(dir.join("src/lib.rs"), lib).unwrap();
    // the workspace's target dir: its built dependencies are reused
    let target = repo().join("target/readme-trial");
    let out = Command::new(env!("CARGO"))
        .args(["build", "--release", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "the README's example does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = toml
        .lines()
        .find_map(|l| l.strip_prefix("name = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("a package name");
    target.join(format!("release/lib{name}.so"))
}

#[test]
fn the_readmes_example_builds_and_serves() {
    let readme = std::fs::read_to_string(repo().join("handler/README.md")).unwrap();
    let dir =
        TempDir(std::env::temp_dir().join(format!("ngx_threadpool-readme-{}", std::process::id())));
    let lib = build(&readme, &dir.0);
    // the README's directive, its path the built library's
    let directive = block(&readme, "In nginx.conf", "nginx").trim();
    let (pool, rest) = directive
        .strip_prefix("thread_pool_process_by_rust ")
        .and_then(|d| d.split_once(' '))
        .expect(directive);
    let config = rest.split_once(' ').map_or("", |(_, c)| c);
    // its Lua lines: each call, and the result its comment documents
    let lua = block(&readme, "```lua\nlocal tp", "lua");
    let lines: Vec<&str> = lua.lines().collect();
    let mut calls = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(at) = line.find("tp.upper:push_task(") else {
            continue;
        };
        let call = line[at..].split("   --").next().unwrap().trim();
        let want = match line.split_once("-- ") {
            Some((_, want)) => want,
            None => lines[i + 1]
                .trim()
                .strip_prefix("-- ")
                .expect("a result comment"),
        };
        calls.push((
            call.replace("tp.upper", &format!("tp.{pool}")),
            want.to_string(),
        ));
    }
    assert_eq!(calls.len(), 2, "{lua}");
    let http = format!(
        r#"thread_pool_process_by_rust {pool} {} {config}
    server {{
        listen 127.0.0.1:$PORT;
        location /call {{
            content_by_lua_block {{
                local res, err = loadstring("local tp = require 'resty.threadpool' return "
                    .. ngx.unescape_uri(ngx.var.arg_c))()
                if res == nil then
                    ngx.print("nil, ", string.format("%q", err))
                else
                    ngx.print(string.format("%q", res))
                end
            }}
        }}
    }}"#,
        lib.display()
    );
    let n = Case::new(&format!("thread_pool {pool} threads=1;"))
        .http(&http)
        .start();
    for (call, want) in calls {
        let path = format!("/call?c={}", percent(&call));
        assert_eq!(n.get(&path).text(), want, "{call}");
    }
    n.assert_clean_log();
}

/// `s` for a query string.
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
