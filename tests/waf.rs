//! The example WAF of nginx-conf/ (waf.lua over waf_rules.lua, waf_http.lua
//! on the event loop) against a corpus of benign and malicious requests.
//!
//! `pool_verdicts_match_inline` needs ngx.re in pool threads: it checks for
//! it first and fails, saying so, in a build without it.

mod common;
mod waf_corpus;

use common::{Case, Nginx, Response};
use waf_corpus::{benign, corpus, malicious, send, Expect};

/// The WAF locations of nginx-conf/demo.conf: `/waf/` scans in the `waf`
/// pool, `/waf-inline/` on the event loop.
const MAIN: &str = "thread_pool waf threads=2;";

fn http(extra: &str) -> String {
    format!(
        r#"
    lua_package_path "{repo}/lua/?.lua;{repo}/nginx-conf/?.lua;;";
    lua_regex_cache_max_entries 4096;
    thread_pool_process_by_lua_file waf {repo}/nginx-conf/waf.lua;
    {extra}
    server {{
        listen 127.0.0.1:$PORT;

        location /waf/ {{
            client_body_buffer_size 64k;
            client_max_body_size 64k;
            access_by_lua_block {{
                local waf_http = require "waf_http"
                local tp = require "resty.threadpool"
                local blocked, err = tp.waf:push_task(waf_http.request())
                if err then
                    ngx.log(ngx.ERR, "waf: ", err)
                    return ngx.exit(ngx.HTTP_SERVICE_UNAVAILABLE)
                end
                waf_http.enforce(blocked)
            }}
            content_by_lua_block {{ ngx.say("passed") }}
        }}

        location /waf-inline/ {{
            client_body_buffer_size 64k;
            client_max_body_size 64k;
            access_by_lua_block {{
                local waf_http = require "waf_http"
                waf_http.enforce(require("waf")(waf_http.request()))
            }}
            content_by_lua_block {{ ngx.say("passed") }}
        }}

        location = /rules {{
            content_by_lua_block {{
                local rules = require "waf_rules"
                local ids, problems = {{}}, {{}}
                for i, r in ipairs(rules) do
                    if type(r.id) ~= "number" or ids[r.id] then
                        problems[#problems + 1] = "rule #" .. i .. ": bad or duplicate id"
                    end
                    ids[r.id] = true
                    if type(r.pattern) ~= "string" or type(r.msg) ~= "string"
                       or type(r.targets) ~= "table" or #r.targets == 0
                    then
                        problems[#problems + 1] = "rule " .. tostring(r.id) .. ": bad fields"
                    elseif ngx.re.find("Hello, world 123", r.pattern, "jo") then
                        problems[#problems + 1] = "rule " .. r.id .. ": matches plain text"
                    end
                end
                ngx.say(#rules, " rules")
                ngx.say(table.concat(problems, "\n"))
            }}
        }}

        location = /probe {{
            content_by_lua_block {{
                local tp = require "resty.threadpool"
                ngx.say(tostring(tp.probe:push_task("abc")))
            }}
        }}
    }}"#,
        repo = common::repo().display(),
    )
}

/// The WAF's verdict from a response: None when passed, the rule ids when
/// blocked; Err for anything else.
fn verdict(res: &Response) -> Result<Option<Vec<u32>>, String> {
    let text = res.text();
    match res.status {
        200 if text == "passed\n" => Ok(None),
        403 => text
            .strip_prefix("blocked by rules ")
            .and_then(|ids| {
                ids.trim_end()
                    .split(' ')
                    .map(|id| id.parse().ok())
                    .collect()
            })
            .map(Some)
            .ok_or_else(|| format!("403 without rule ids: {text:?}")),
        status => Err(format!("status {status}: {text:?}")),
    }
}

/// Whether `got` is what `expect` asks for.
fn agrees(expect: Expect, got: &Option<Vec<u32>>) -> bool {
    match (expect, got) {
        (Expect::Pass, None) => true,
        (Expect::Block(family), Some(ids)) => ids.iter().any(|id| id / 10000 * 10000 == family),
        _ => false,
    }
}

/// Sends the corpus to `prefix`; returns each case's verdict, after
/// checking them against the expectations (all mismatches at once).
fn check_corpus(nginx: &Nginx, prefix: &str) -> Vec<Option<Vec<u32>>> {
    let mut wrong = Vec::new();
    let mut verdicts = Vec::new();
    for case in corpus() {
        let res = send(nginx, prefix, &case);
        let got = verdict(&res)
            .unwrap_or_else(|e| panic!("{} {prefix}{}: {e}", case.method, case.target));
        if !agrees(case.expect, &got) {
            wrong.push(format!(
                "{} {prefix}{} {:?}: expected {:?}, got {:?}",
                case.method, case.target, case.headers, case.expect, got
            ));
        }
        verdicts.push(got);
    }
    assert!(
        wrong.is_empty(),
        "{} wrong verdicts:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    verdicts
}

#[test]
fn corpus_is_large_enough() {
    let (good, bad) = (benign(), malicious());
    assert!(
        good.len() >= 50 && bad.len() >= 50,
        "{} benign, {} malicious",
        good.len(),
        bad.len()
    );
    assert!(good.iter().all(|c| c.expect == Expect::Pass));
    assert!(bad.iter().all(|c| c.expect != Expect::Pass));
}

#[test]
fn rule_file_has_over_1000_well_formed_rules() {
    let nginx = Case::new(MAIN).http(&http("")).start();
    let text = nginx.get("/rules").text();
    let count: usize = text.split(' ').next().unwrap().parse().unwrap();
    assert!(count >= 1000, "{text}");
    assert_eq!(
        text,
        format!("{count} rules\n\n"),
        "problems in waf_rules.lua"
    );
}

#[test]
fn inline_verdicts_match_the_corpus() {
    let nginx = Case::new(MAIN).http(&http("")).start();
    check_corpus(&nginx, "/waf-inline/");
    // No rule hit a PCRE error at run time (waf.lua logs those).
    let log = nginx.error_log();
    assert!(!log.contains("waf rule"), "{log}");
}

/// The same corpus through the `waf` pool: the same verdicts as inline.
/// Needs ngx.re in pool threads, and says so if it is missing.
#[test]
fn pool_verdicts_match_inline() {
    let probe = r#"
    thread_pool_process_by_lua_block probe {
        return function(s)
            if not (ngx.re and ngx.re.find) then
                return "no ngx.re"
            end
            return ngx.re.find(s, "b", "jo")
        end
    }"#;
    let nginx = Case::new(&format!("{MAIN}\nthread_pool probe threads=1;"))
        .http(&http(probe))
        .start();
    let probed = nginx.get("/probe").text();
    assert_eq!(
        probed, "2\n",
        "ngx.re is not available in pool threads (the probe answered {probed:?}): \
         the pool-side WAF cannot run without it"
    );
    let inline = check_corpus(&nginx, "/waf-inline/");
    let pool = check_corpus(&nginx, "/waf/");
    let differ: Vec<String> = corpus()
        .iter()
        .zip(inline.iter().zip(&pool))
        .filter(|(_, (i, p))| i != p)
        .map(|(c, (i, p))| format!("{} {}: inline {i:?}, pool {p:?}", c.method, c.target))
        .collect();
    assert!(
        differ.is_empty(),
        "pool and inline verdicts differ:\n{}",
        differ.join("\n")
    );
    nginx.assert_clean_log();
}
