//! The Rust WAF (examples/waf-rust) against the Lua WAF (nginx-conf/waf.lua
//! on PCRE, through lua-nginx-module's ngx.re) under the real nginx: for each
//! request of the corpus, adversarial inputs included, nginx answers the Lua
//! WAF's verdict and the request table it scanned; the Rust WAF, built from
//! the same waf_rules.lua, scans that table and must give the same verdict.
//! The same again through a Rust pool running the WAF as a handler
//! (thread_pool_process_by_rust), the library cargo built beside this test.

mod common;
mod waf_corpus;

use std::collections::BTreeSet;

use common::Nginx;
use waf_corpus::{adversarial, corpus, send, Case};
use waf_rust::{Value, Waf};

/// The pool of the Rust WAF (`thread_pool_shadow`'s counterpart in demo.conf).
const MAIN: &str = "thread_pool waf_rust threads=2;";

/// /waf-verdict/ answers the Lua WAF's verdict and table; /waf-verdict-pool/
/// adds the waf_rust pool's verdict.
fn http() -> String {
    let lib = std::env::current_exe()
        .expect("test binary path")
        .with_file_name("libwaf_rust.so");
    assert!(lib.exists(), "{} missing", lib.display());
    let location = |path: &str, set: &str| {
        format!(
            r#"
        location {path} {{
            client_body_buffer_size 64k;
            client_max_body_size 64k;
            {set}
            content_by_lua_block {{ require("waf_verdict")() }}
        }}"#
        )
    };
    format!(
        r#"
    lua_package_path "{repo}/lua/?.lua;{repo}/nginx-conf/?.lua;{repo}/tests/fixtures/?.lua;;";
    lua_regex_cache_max_entries 4096;
    thread_pool_process_by_rust waf_rust {lib} {rules};
    server {{
        listen 127.0.0.1:$PORT;
        {plain}
        {pool}
    }}"#,
        repo = common::repo().display(),
        lib = lib.display(),
        rules = rules_path(),
        plain = location("/waf-verdict/", ""),
        pool = location("/waf-verdict-pool/", "set $waf_pool waf_rust;"),
    )
}

fn rules_path() -> String {
    common::repo()
        .join("nginx-conf/waf_rules.lua")
        .display()
        .to_string()
}

/// A Lua value as tests/fixtures/waf_verdict.lua writes it, owning its
/// strings (the WAF's `Value` borrows them).
enum Owned {
    Str(Vec<u8>),
    Num(f64),
    Bool(bool),
    Table(Vec<(Owned, Owned)>),
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
        .collect()
}

fn read<'a>(tokens: &mut impl Iterator<Item = &'a str>) -> Owned {
    let token = tokens.next().expect("a value");
    let (kind, text) = token.split_once(':').expect("kind:value");
    match kind {
        "s" => Owned::Str(unhex(text)),
        "n" => Owned::Num(text.parse().expect("number")),
        "b" => Owned::Bool(text == "true"),
        "t" => {
            let n: usize = text.parse().expect("count");
            Owned::Table((0..n).map(|_| (read(tokens), read(tokens))).collect())
        }
        _ => panic!("unknown token {token}"),
    }
}

fn view(o: &Owned) -> Value<'_> {
    match o {
        Owned::Str(s) => Value::Str(s),
        &Owned::Num(x) if x.fract() == 0.0 => Value::Int(x as i64),
        &Owned::Num(x) => Value::Float(x),
        &Owned::Bool(b) => Value::Bool(b),
        Owned::Table(pairs) => {
            Value::Table(pairs.iter().map(|(k, v)| (view(k), view(v))).collect())
        }
    }
}

fn parse_verdict(line: &str) -> Option<Vec<u32>> {
    match line {
        "passed" => None,
        v => Some(
            v.strip_prefix("blocked ")
                .unwrap_or_else(|| panic!("not a verdict: {v}"))
                .split(' ')
                .map(|id| id.parse().expect("rule id"))
                .collect(),
        ),
    }
}

/// What nginx answers for `case`: the Lua WAF's verdict, the request table
/// it scanned, and the verdict of the location's pool if it has one.
struct Answer {
    lua: Option<Vec<u32>>,
    req: Owned,
    pool: Option<Option<Vec<u32>>>,
}

fn ask(nginx: &Nginx, prefix: &str, case: &Case) -> Answer {
    let res = send(nginx, prefix, case);
    let text = res.text();
    assert_eq!(res.status, 200, "{} {}: {text}", case.method, case.target);
    let mut lines = text.lines();
    let lua = parse_verdict(lines.next().expect("a verdict"));
    let req = read(&mut lines.next().expect("a table").split_ascii_whitespace());
    let pool = lines.next().map(parse_verdict);
    Answer { lua, req, pool }
}

/// The rules whose PCRE match failed at run time (waf.lua logs "waf rule
/// ID: pcre_exec() failed: ..." and counts the rule as matched) in `log`.
fn pcre_failures(log: &str) -> BTreeSet<u32> {
    log.lines()
        .filter_map(|line| {
            line.split_once("waf rule ")?
                .1
                .split_once(": pcre_exec() failed")
        })
        .map(|(id, _)| id.parse().expect("rule id"))
        .collect()
}

/// Sends the corpus and the adversarial inputs to `prefix` and checks,
/// for each, the Lua WAF's verdict against the Rust WAF's on the same
/// request table, and the location's pool's verdict (if `pool`) against
/// the Rust WAF's. Where PCRE gave up on a rule (its JIT stack or match
/// limit: backtracking the regex crate does not do), the Lua WAF blocks by
/// that rule and the Rust WAF gives the rule's true answer; there the Lua
/// verdict must be the Rust one plus exactly those rules. The corpus proper
/// (benign and malicious) has no such failure.
fn check(nginx: &Nginx, prefix: &str, pool: bool) {
    let waf = Waf::from_file(&rules_path()).unwrap_or_else(|e| panic!("{e}"));
    let proper = corpus().len();
    let cases: Vec<Case> = corpus().into_iter().chain(adversarial()).collect();
    let mut differ = Vec::new();
    let mut gave_up = Vec::new();
    let mut fired = BTreeSet::new();
    let mut blocked = 0;
    for (i, case) in cases.iter().enumerate() {
        let logged = nginx.error_log().len();
        let answer = ask(nginx, prefix, case);
        let failed = pcre_failures(&nginx.error_log()[logged..]);
        let lua = answer.lua;
        let rust = waf.scan(&view(&answer.req)).expect("a table");
        let mut expected: BTreeSet<u32> = rust.iter().flatten().copied().collect();
        expected.extend(&failed);
        let what = format!(
            "{} {} ({} bytes of body)",
            case.method,
            &case.target[..case.target.len().min(100)],
            case.body.len()
        );
        if lua.iter().flatten().copied().collect::<BTreeSet<u32>>() != expected
            || (failed.is_empty() && lua != rust)
            || (i < proper && !failed.is_empty())
        {
            differ.push(format!(
                "{what}: Lua {lua:?}, Rust {rust:?}, PCRE failed on {failed:?}"
            ));
        }
        if pool && answer.pool.as_ref() != Some(&rust) {
            differ.push(format!("{what}: Rust {rust:?}, its pool {:?}", answer.pool));
        }
        if !failed.is_empty() {
            gave_up.push(format!("{what}: {} rules", failed.len()));
        }
        blocked += usize::from(lua.is_some());
        fired.extend(rust.into_iter().flatten());
    }
    assert!(
        differ.is_empty(),
        "{} of {} verdicts differ:\n{}",
        differ.len(),
        cases.len(),
        differ.join("\n")
    );
    eprintln!(
        "{} requests ({blocked} blocked by Lua) with equal verdicts; {} distinct rules \
         fired in Rust; PCRE gave up on {}",
        cases.len(),
        fired.len(),
        if gave_up.is_empty() {
            "none".into()
        } else {
            gave_up.join("; ")
        }
    );
    nginx.assert_clean_log();
}

/// The Rust WAF called directly, on the tables nginx built.
#[test]
fn rust_verdicts_equal_the_lua_wafs() {
    let nginx = common::Case::new(MAIN).http(&http()).start();
    check(&nginx, "/waf-verdict/", false);
}

/// The Rust WAF in a pool: the request table crosses as the Lua WAF's
/// argument would, and the pool's verdict is the one called directly.
#[test]
fn pool_verdicts_equal_the_lua_wafs() {
    let nginx = common::Case::new(MAIN).http(&http()).start();
    check(&nginx, "/waf-verdict-pool/", true);
    let log = nginx.error_log();
    assert!(log.contains("1505 rules from"), "{log}");
}
