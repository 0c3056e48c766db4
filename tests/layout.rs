//! The map of the crate in src/lib.rs's module doc stays true: every folder
//! of src/ is on it, and for the folders it lists file by file, every file
//! but mod.rs is named in the folder's entry and every name is a file;
//! and imports run down the map, never up. And no function of src/ runs
//! longer than `LONGEST_FN` lines unless its doc says why.

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
    let folders = std::fs::read_dir(src())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(
        listed, folders,
        "lib.rs's map must name the files of every folder of src/"
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

/// The module path of a file relative to src/ (`worker/mod.rs` is
/// `worker`, `lib.rs` the crate's root, "").
fn module_of(file: &str) -> String {
    let path = file.trim_end_matches(".rs");
    let path = path.trim_end_matches("/mod").trim_end_matches("mod");
    if path == "lib" {
        String::new()
    } else {
        path.trim_end_matches('/').replace('/', "::")
    }
}

/// The files `code` (the file `file`) refers to by a path: `crate::a::b`
/// and, in a folder's mod.rs, its own children (`use a::b`), each resolved
/// to the longest prefix that is a module of `files`; in a folder's other
/// files, `super::sibling::…` too (its sibling file). Any other `super::`
/// is left out: a child reaching its folder's mod.rs is how a folder is
/// built, and inside `mod tests` it means the file itself.
fn imports(file: &str, code: &str, files: &BTreeSet<String>) -> BTreeSet<String> {
    let by_module: std::collections::BTreeMap<String, &String> =
        files.iter().map(|f| (module_of(f), f)).collect();
    let here = module_of(file);
    let is_folder = file.ends_with("mod.rs") || file == "lib.rs";
    let parent = here.rsplit_once("::").map_or("", |(p, _)| p);
    let mut out = BTreeSet::new();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    for line in code.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices("::") {
            // the whole path this `::` belongs to, once: from its start
            let start = code[..i]
                .rfind(|c: char| !(ident(c) || c == ':'))
                .map_or(0, |s| s + 1);
            if code[start..i].contains("::") {
                continue;
            }
            let path: String = code[start..]
                .chars()
                .take_while(|&c| ident(c) || c == ':')
                .collect();
            if path == "crate::" && code[start + path.len()..].starts_with('{') {
                // `crate::{a, b::c}`: each member, as `crate::a`, `crate::b::c`
                let group = &code[start + path.len() + 1..];
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for member in group.split(',') {
                    let member = member.split_whitespace().next().unwrap_or("");
                    let member = format!("crate::{member}");
                    out.extend(imports(file, &format!("use {member};"), files));
                }
                continue;
            }
            let mut words: Vec<&str> = path.split("::").filter(|w| !w.is_empty()).collect();
            let base = match words.first() {
                Some(&"crate") => String::new(),
                Some(w) if is_folder && by_module.contains_key(&join(&here, w)) => {
                    words.insert(0, "self");
                    here.clone()
                }
                Some(&"super")
                    if !is_folder
                        && words
                            .get(1)
                            .is_some_and(|w| by_module.contains_key(&join(parent, w))) =>
                {
                    parent.to_string()
                }
                _ => continue,
            };
            let mut target = None;
            let mut module = base;
            for w in &words[1..] {
                module = join(&module, w);
                match by_module.get(&module) {
                    Some(f) => target = Some((*f).clone()),
                    None => break,
                }
            }
            if let Some(t) = target.filter(|t| t != file) {
                out.insert(t);
            }
        }
    }
    out
}

fn join(module: &str, word: &str) -> String {
    if module.is_empty() {
        word.to_string()
    } else {
        format!("{module}::{word}")
    }
}

/// Pairs of files of src/ that import each other, directly or through
/// others: each cycle of the import graph, as the files on it.
fn import_cycles() -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let set: BTreeSet<String> = files.iter().cloned().collect();
    let graph: std::collections::BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|f| {
            let code = std::fs::read_to_string(src().join(f)).unwrap();
            (f.clone(), imports(f, &code, &set))
        })
        .collect();
    // a file is on a cycle when it reaches itself; its cycle is the files
    // that both reach it and are reached from it
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(f) = todo.pop() {
            for g in &graph[&f] {
                if seen.insert(g.clone()) {
                    todo.push(g.clone());
                }
            }
        }
        seen
    };
    let reached: std::collections::BTreeMap<&String, BTreeSet<String>> =
        files.iter().map(|f| (f, reach(f))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for f in &files {
        if !reached[f].contains(f) || cycles.iter().any(|c| c.contains(f)) {
            continue;
        }
        let cycle = reached[f]
            .iter()
            .filter(|g| reached[g].contains(f))
            .cloned()
            .collect();
        cycles.push(cycle);
    }
    cycles
}

#[test]
fn no_two_files_import_each_other() {
    let cycles = import_cycles();
    assert!(
        cycles.is_empty(),
        "files of src/ that import each other: {cycles:?}"
    );
}

#[test]
fn imports_are_read_from_crate_super_and_child_paths() {
    let files: BTreeSet<String> = [
        "lib.rs",
        "worker/mod.rs",
        "worker/gate.rs",
        "worker/tasks.rs",
        "pool/thread.rs",
    ]
    .map(String::from)
    .into();
    let got = |file: &str, code: &str| imports(file, code, &files).into_iter().collect::<Vec<_>>();
    assert_eq!(
        got("pool/thread.rs", "use crate::worker::tasks::{A, B};"),
        ["worker/tasks.rs"]
    );
    assert_eq!(
        got("pool/thread.rs", "let x = crate::worker::with_worker(f);"),
        ["worker/mod.rs"]
    );
    assert!(got("worker/tasks.rs", "use super::Thing;").is_empty());
    assert!(got("worker/tasks.rs", "    use super::*;").is_empty());
    assert_eq!(
        got("worker/tasks.rs", "use super::gate::{Gate, Slot};"),
        ["worker/gate.rs"]
    );
    assert!(got("worker/mod.rs", "use super::gate::Gate;").is_empty());
    assert_eq!(
        got("pool/thread.rs", "use crate::{worker::tasks, pool};"),
        ["worker/tasks.rs"]
    );
    assert_eq!(
        got("worker/tasks.rs", "use crate::{self as c, worker};"),
        ["worker/mod.rs"]
    );
    assert_eq!(
        got("worker/mod.rs", "use tasks::Tasks;"),
        ["worker/tasks.rs"]
    );
    assert!(got("worker/tasks.rs", "// crate::pool::thread in a comment").is_empty());
    assert!(got("worker/tasks.rs", "use std::sync::Arc;").is_empty());
}

/// The folders of the map's entries, in its order: the top first.
fn layers() -> Vec<String> {
    entries()
        .iter()
        .filter_map(|e| {
            quoted(e)
                .first()
                .and_then(|w| w.strip_suffix('/'))
                .map(String::from)
        })
        .filter(|f| src().join(f).is_dir())
        .collect()
}

/// The imports of src/ that point up lib.rs's map: (file, what it imports).
fn upward_imports(layers: &[String]) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let set: BTreeSet<String> = files.iter().cloned().collect();
    let rank = |f: &str| {
        let folder = f.split('/').next().unwrap();
        layers.iter().position(|l| l == folder)
    };
    let mut up = Vec::new();
    for f in &files {
        let code = std::fs::read_to_string(src().join(f)).unwrap();
        // lib.rs is the root: it wires every folder
        let Some(mine) = rank(f) else { continue };
        for g in imports(f, &code, &set) {
            if rank(&g).is_some_and(|theirs| theirs < mine) {
                up.push((f.clone(), g));
            }
        }
    }
    up
}

#[test]
fn imports_run_down_the_map() {
    let layers = layers();
    assert!(layers.len() >= 10, "the map's folders: {layers:?}");
    let up = upward_imports(&layers);
    assert!(
        up.is_empty(),
        "imports against the map's direction ({}): {up:?}",
        layers.join(" > ")
    );
}

#[test]
fn an_upward_import_is_seen() {
    // the map with two folders swapped: what one imports from the other
    // now points up
    let mut layers = layers();
    let (a, b) = (
        layers.iter().position(|l| l == "worker").unwrap(),
        layers.iter().position(|l| l == "thread").unwrap(),
    );
    layers.swap(a, b);
    let up = upward_imports(&layers);
    assert!(
        up.iter()
            .any(|(f, g)| f.starts_with("worker/") && g.starts_with("thread/")),
        "{up:?}"
    );
}

/// The most lines a function of src/ takes, from its `fn` line to its
/// closing brace, unless its doc says why it takes more.
const LONGEST_FN: usize = 80;

/// How a function's doc says why it is longer: a line that starts so and
/// goes on with the reason.
const LONG_REASON: &str = "/// Long:";

/// The name of the function whose signature `line` starts, if it starts
/// one (after its visibility and qualifiers).
fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().skip_while(|w| {
        *w == "pub"
            || w.starts_with("pub(")
            || ["const", "async", "unsafe", "extern"].contains(w)
            || w.starts_with('"')
    });
    if words.next() != Some("fn") {
        return None;
    }
    let name = words.next()?;
    Some(&name[..name.find(['(', '<']).unwrap_or(name.len())])
}

/// The functions of `code` longer than `LONGEST_FN` lines whose doc does
/// not say why in a `LONG_REASON` line: (line, name, lines). Read from
/// rustfmt's layout: a body ends at the first line indented as its `fn`
/// that starts with `}`; a declaration has no such line before the next
/// item. The functions of a `#[cfg(test)]` module are tests: left out.
fn long_functions(code: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    // the line that closes the item starting at `start`, if it has a body
    let end = |start: usize| {
        let at = indent(lines[start]);
        let next = (start + 1..lines.len()).find(|&j| {
            let l = lines[j].trim_start();
            // what continues a signature: its last lines, a where clause
            let signature = l.starts_with([')', '>', '{']) || l.starts_with("where");
            !l.is_empty() && indent(lines[j]) == at && !signature
        })?;
        lines[next].trim_start().starts_with('}').then_some(next)
    };
    let mut tests = Vec::new();
    for (i, pair) in lines.windows(2).enumerate() {
        let module = pair[1].trim_start();
        if pair[0].trim() == "#[cfg(test)]" && module.contains("mod ") && module.ends_with('{') {
            tests.extend(end(i + 1).map(|e| i + 1..e));
        }
    }
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        if tests.iter().any(|t| t.contains(&i)) {
            continue;
        }
        let Some(e) = end(i) else { continue };
        let doc = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("///") || l.starts_with("#["));
        let why = doc
            .filter_map(|l| l.strip_prefix(LONG_REASON))
            .any(|reason| !reason.trim().is_empty());
        if e - i + 1 > LONGEST_FN && !why {
            out.push((i + 1, name.to_string(), e - i + 1));
        }
    }
    out
}

/// No function of src/ runs longer than `LONGEST_FN` lines unless its doc
/// says why in a line starting `LONG_REASON` (a state machine's one match,
/// say). Tests are left out: the functions of `#[cfg(test)]` modules and
/// the files of src/'s `tests/` folders (src/codec/tests/).
#[test]
fn long_functions_say_why() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long = Vec::new();
    for f in files.iter().filter(|f| !f.split('/').any(|p| p == "tests")) {
        let code = std::fs::read_to_string(src().join(f)).unwrap();
        for (line, name, n) in long_functions(&code) {
            long.push(format!("  src/{f}:{line} {name}: {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "functions longer than {LONGEST_FN} lines: split them, or say why in a doc line \
         starting `{LONG_REASON}`\n{}",
        long.join("\n")
    );
}

#[test]
fn long_functions_are_seen_from_fn_to_closing_brace() {
    let body = |n: usize| "        x();\n".repeat(n);
    // 2 lines of signature, `n` of body and the brace
    let item = |doc: &str, n: usize| {
        format!(
            "    {doc}\n    pub(crate) unsafe fn f<T>(\n    ) -> T {{\n{}    }}\n",
            body(n)
        )
    };
    let named = |code: &str| long_functions(code);
    assert!(named(&item("/// Short.", LONGEST_FN - 3)).is_empty());
    assert_eq!(
        named(&item("/// Short.", LONGEST_FN - 2)),
        [(2, "f".to_string(), LONGEST_FN + 1)]
    );
    assert!(named(&item("/// Long: one match.", LONGEST_FN)).is_empty());
    assert_eq!(named(&item("/// Long:", LONGEST_FN)).len(), 1);
    let tests = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", item("", LONGEST_FN));
    assert!(named(&tests).is_empty());
    // declarations have no body: the next item is not theirs
    let declared = format!(
        "extern \"C\" {{\n    fn g(\n        a: i32,\n    );\n}}\n{}",
        item("", LONGEST_FN)
    );
    assert_eq!(named(&declared).len(), 1);
    assert_eq!(
        fn_name("pub(crate) const unsafe extern \"C\" fn h<'a>(x: u8) {"),
        Some("h")
    );
    assert_eq!(fn_name("let f = |x| x; // fn not"), None);
}
