//! README.md's synopsis, run as a newcomer would run it: its `http` block
//! as written (only the port is the test's), and the request its comment
//! names, which must get the answer the comment gives.

mod common;

use common::{repo, Nginx};

/// The synopsis's `http { ... }` block, without its braces.
fn synopsis_http() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = readme
        .find("## Synopsis")
        .expect("README.md has no Synopsis");
    let open = "```nginx\n";
    let start = at + readme[at..].find(open).expect("no nginx block") + open.len();
    let end = start + readme[start..].find("```").expect("unclosed block");
    let conf = &readme[start..end];
    let body = conf.find("http {").expect("no http block") + "http {".len();
    let close = conf.rfind('}').expect("http block not closed");
    conf[body..close].to_string()
}

#[test]
fn the_synopsis_configures_a_pool_and_calls_it() {
    let http = synopsis_http();
    assert!(
        http.contains("listen 8080;") && http.contains("FOO for /upper?s=foo"),
        "the synopsis no longer says where it listens or what it answers:\n{http}"
    );
    let n = Nginx::start("", &http.replace("listen 8080;", "listen 127.0.0.1:$PORT;"));
    let r = n.get("/upper?s=foo");
    assert_eq!((r.status, r.text().as_str()), (200, "FOO\n"));
    // no [error] or worse: a newcomer's first log stays clean
    n.assert_clean_log();
}
