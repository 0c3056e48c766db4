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
