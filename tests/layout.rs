//! The map of the crate in src/lib.rs's module doc stays true: every folder
//! of src/ is on it, and for the folders it lists file by file, every file
//! but mod.rs is named in the folder's entry and every name is a file.

use std::collections::BTreeSet;
use std::path::Path;

/// The map's entries: each bullet of lib.rs's module doc, as text.
fn entries() -> Vec<String> {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mut out: Vec<String> = Vec::new();
    for line in lib.lines().take_while(|l| l.starts_with("//!")) {
        let text = line.trim_start_matches("//!").trim();
        if let Some(rest) = text.strip_prefix("- ") {
            out.push(rest.to_string());
        } else if !text.is_empty() && line.starts_with("//!   ") {
            if let Some(last) = out.last_mut() {
                last.push(' ');
                last.push_str(text);
            }
        } else {
            // a paragraph ends the list's current entry
            out.push(String::new());
        }
    }
    out.retain(|e| !e.is_empty());
    out
}

/// The words in backquotes of `text`.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_folder_is_on_the_map() {
    let named: BTreeSet<String> = entries()
        .iter()
        .flat_map(|e| {
            quoted(e)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|q| q.strip_suffix('/').map(str::to_string))
        .collect();
    for entry in std::fs::read_dir(src()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            assert!(named.contains(&name), "src/{name}/ is not on lib.rs's map");
        }
    }
    for name in &named {
        assert!(
            src().join(name).is_dir(),
            "lib.rs's map names {name}/, which is not a folder of src/"
        );
    }
}

#[test]
fn listed_folders_name_each_of_their_files() {
    let mut listed = 0;
    for entry in entries() {
        let words = quoted(&entry);
        // an entry that lists files starts with its folder and names them
        let Some(folder) = words.first().and_then(|w| w.strip_suffix('/')) else {
            continue;
        };
        let files: BTreeSet<&str> = words
            .iter()
            .copied()
            .filter(|w| w.ends_with(".rs"))
            .collect();
        if files.is_empty() {
            continue;
        }
        listed += 1;
        let dir = src().join(folder);
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_str().unwrap().to_string())
            // mod.rs says what its folder is; the entry names the rest
            .filter(|n| n.ends_with(".rs") && n != "mod.rs")
            .collect();
        for file in &on_disk {
            assert!(
                files.contains(file.as_str()),
                "src/{folder}/{file} is not named in lib.rs's map entry for {folder}/"
            );
        }
        for file in files.iter().filter(|f| **f != "mod.rs") {
            assert!(
                on_disk.contains(*file),
                "lib.rs's map names {folder}/{file}, which does not exist"
            );
        }
    }
    assert!(
        listed >= 5,
        "lib.rs's map lists the files of {listed} folders"
    );
}

/// How many `unsafe` blocks, fns, impls and extern blocks `code` holds,
/// comments aside (an `unsafe fn` pointer type holds no code: not counted).
fn unsafe_count(code: &str) -> usize {
    let mut n = 0;
    for line in code.lines() {
        // a `//` inside a string literal does not start a comment
        let code = line
            .match_indices("//")
            .find(|(i, _)| line[..*i].matches('"').count() % 2 == 0)
            .map_or(line, |(i, _)| &line[..i]);
        for (i, _) in code.match_indices("unsafe") {
            let word_char = |c: char| c.is_alphanumeric() || c == '_';
            if code[..i].ends_with(word_char) {
                continue;
            }
            let mut rest = &code[i + "unsafe".len()..];
            if rest.starts_with(word_char) {
                continue;
            }
            rest = rest.trim_start();
            if let Some(abi) = rest.strip_prefix("extern") {
                // `extern "C"`: skip the ABI's string
                let abi = abi.trim_start();
                rest = abi
                    .strip_prefix('"')
                    .and_then(|a| a.split_once('"'))
                    .map_or(abi, |(_, r)| r)
                    .trim_start();
            }
            let named_fn = rest
                .strip_prefix("fn")
                .is_some_and(|r| r.starts_with(' ') && r.trim_start().starts_with(word_char));
            if rest.starts_with('{') || rest.starts_with("impl ") || named_fn {
                n += 1;
            }
        }
    }
    n
}

/// The files of src/ below `dir`, as paths relative to src/.
fn rust_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src()).unwrap();
            out.push(rel.to_str().unwrap().to_string());
        }
    }
}

/// The files lib.rs's table says hold `unsafe`, relative to src/: each
/// row is "| `folder/` (or (root)) | `file` ... | why |".
fn documented_unsafe() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut files = BTreeSet::new();
    for line in lib.lines().take_while(|l| l.starts_with("//!")) {
        let cells: Vec<&str> = line.trim_start_matches("//!").trim().split('|').collect();
        // "", folder, files, why, ""
        if cells.len() != 5 || cells[1].trim() == "folder" || cells[1].contains("---") {
            continue;
        }
        let folder = quoted(cells[1]).first().copied().unwrap_or("");
        for file in quoted(cells[2]) {
            assert!(
                files.insert(format!("{folder}{file}")),
                "lib.rs's unsafe table names {folder}{file} twice"
            );
        }
    }
    files
}

#[test]
fn the_unsafe_table_names_every_file_that_holds_unsafe() {
    let mut all = Vec::new();
    rust_files(&src(), &mut all);
    let counts: Vec<(String, usize)> = all
        .into_iter()
        .map(|f| {
            let n = unsafe_count(&std::fs::read_to_string(src().join(&f)).unwrap());
            (f, n)
        })
        .collect();
    let holding: BTreeSet<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(f, _)| f.clone())
        .collect();
    let documented = documented_unsafe();
    let report = || {
        let mut r = String::from("unsafe blocks, fns, impls and extern blocks per file:\n");
        for (f, n) in counts.iter().filter(|(_, n)| *n > 0) {
            r.push_str(&format!("  {f}: {n}\n"));
        }
        r
    };
    let unlisted: Vec<_> = holding.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&holding).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "lib.rs's unsafe table disagrees with the code: {unlisted:?} hold unsafe but are not in \
         it, {stale:?} are in it but hold none\n{}",
        report()
    );
    assert!(holding.len() > 20, "{}", report());
}

#[test]
fn unsafe_count_sees_what_holds_code_and_nothing_else() {
    let code = r#"
        unsafe { a() }
        let x = unsafe { *p };
        unsafe impl Send for T {}
        pub unsafe fn f() {}
        unsafe extern "C" fn g(l: *mut L) -> c_int {}
        unsafe extern "C" { fn h(); }
        type F = unsafe extern "C" fn(x: i32);
        // SAFETY: unsafe { in a comment }
        let s = "http://x"; // unsafe { }
        deny(clippy::undocumented_unsafe_blocks)
    "#;
    assert_eq!(unsafe_count(code), 6);
}
