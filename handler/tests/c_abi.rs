//! The C header against a library built with this crate: a C program
//! built with `cc` against include/ngx_threadpool.h loads the example
//! handler (examples/upper.rs, built here so that it is never stale) by
//! its five export names and calls them with the header's structs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the example handler with this test's profile: its path.
fn build_example(manifest: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile dir>/deps/c_abi-<hash>
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--example", "upper"])
        .current_dir(manifest);
    if profile_dir.ends_with("release") {
        cargo.arg("--release");
    }
    let build = cargo.output().expect("cargo runs");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    profile_dir.join("examples/libupper.so")
}

/// As the C program prints a payload.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A msgpack fixstr.
fn str_value(s: &str) -> Vec<u8> {
    [&[0xa0 | s.len() as u8][..], s.as_bytes()].concat()
}

#[test]
fn a_c_program_drives_the_exports_through_the_header() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = build_example(manifest);
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_abi");
    let cc = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&bin)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c_abi.c"))
        .arg("-ldl")
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&bin).arg(&lib).output().expect("runs");
    std::fs::remove_file(&bin).unwrap();
    let stdout = String::from_utf8(run.stdout).unwrap();
    assert!(run.status.success(), "{stdout}");

    // Values(("HELLO", 1, true)): uint32(3) map32(3) {1: "HELLO", 2: 1, 3: true}
    let ok = [
        &[0xce, 0, 0, 0, 3, 0xdf, 0, 0, 0, 3, 0x01][..],
        &str_value("HELLO"),
        &[0x02, 0x01, 0x03, 0xc3],
    ]
    .concat();
    // one error value: uint(1) map(1) {1: "panic: ..."}
    let panic = [
        &[0x01, 0x81, 0x01][..],
        &str_value("panic: asked to, in cpool"),
    ]
    .concat();
    // the update's failure: uint(1) map(1) {1: "update 8 refused"}
    let refused = [&[0x01, 0x81, 0x01][..], &str_value("update 8 refused")].concat();
    // after update 7: Values(("HELLO!", 3, true))
    let updated = [
        &[0xce, 0, 0, 0, 3, 0xdf, 0, 0, 0, 3, 0x01][..],
        &str_value("HELLO!"),
        &[0x02, 0x03, 0x03, 0xc3],
    ]
    .concat();
    let want = format!(
        "abi 2\n\
         log L 7 cpool #2 config Some(\"c\")\n\
         init 0 \n\
         log L 5 task 1\n\
         process 0 {}\n\
         panic 1 {}\n\
         log L 7 version 7 suffix !\n\
         update 0 \n\
         update 1 {}\n\
         log L 5 task 3\n\
         process 0 {}\n\
         freed\n",
        hex(&ok),
        hex(&panic),
        hex(&refused),
        hex(&updated)
    );
    assert_eq!(stdout, want);
}
