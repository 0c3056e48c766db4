//! ngx.re in a pool thread gives what it gives in the event loop: every case
//! below runs in content_by_lua (OpenResty's lua-resty-core over
//! lua-nginx-module) and in a pool thread, both render the results with the
//! same serializer, and the renderings must be equal byte for byte. Then
//! regex-heavy loops run in two pool threads and the event loop at once.

mod common;

use common::{request, Case, Nginx};
use std::time::Duration;

/// `run(src)`: pcall of the chunk `src`, rendered deterministically: the
/// number of values, then each value (tables with sorted keys, numbers as
/// integers or %.17g, strings %q, metatables and __call noted).
const SERIALIZER: &str = r##"
local type, tostring, pairs, select, getmetatable = type, tostring, pairs, select, getmetatable
local concat, sort, fmt, floor = table.concat, table.sort, string.format, math.floor
local RANK = { boolean = 1, number = 2, string = 3 }

local function key_less(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then
        return RANK[ta] < RANK[tb]
    end
    if ta == "boolean" then
        return not a and b
    end
    return a < b
end

local ser
function ser(v, depth)
    local t = type(v)
    if t == "string" then
        return fmt("%q", v)
    elseif t == "number" then
        if v == floor(v) and v > -2^53 and v < 2^53 then
            return fmt("%d", v)
        end
        return fmt("%.17g", v)
    elseif t == "nil" or t == "boolean" then
        return tostring(v)
    elseif t == "table" then
        assert(depth < 20, "table too deep")
        local keys = {}
        for k in pairs(v) do
            assert(RANK[type(k)], "unsupported key type")
            keys[#keys + 1] = k
        end
        sort(keys, key_less)
        local out = {}
        for i, k in ipairs(keys) do
            out[i] = "[" .. ser(k, depth + 1) .. "]=" .. ser(v[k], depth + 1)
        end
        local mt = getmetatable(v)
        local tag = mt and (mt.__call and "<mt call>" or "<mt>") or ""
        return tag .. "{" .. concat(out, ",") .. "}"
    end
    return "<" .. t .. ">"
end

local function render(...)
    local out = {}
    for i = 1, select("#", ...) do
        out[i] = ser((select(i, ...)), 0)
    end
    return select("#", ...) .. ": " .. concat(out, ", ")
end

local function run(src)
    local f = assert(loadstring(src, "=case"))
    return render(pcall(f))
end
"##;

/// Work done the same way by the pool threads and the event loop in the
/// concurrency test: `jo` matches, plus a compile without `o` (and its
/// free) every few iterations, so both sides compile while the other does.
const WORK: &str = r#"
local function work(n)
    local total, names = 0, 0
    for i = 1, n do
        local s = "item-" .. i .. " qty=" .. (i % 97) .. " name=n" .. i
        local m = ngx.re.match(s, [[item-(\d+) qty=(\d+) name=(?<name>\w+)]], "jo")
        total = total + tonumber(m[1]) + tonumber(m[2])
        names = names + #m.name
        if i % 5 == 0 then
            local r, count = ngx.re.gsub(s, [[(\d)]], "<$1>")
            total = total + #r + count
        end
    end
    return total .. "/" .. names
end
"#;

/// Lua snippets, each returning values; they cover every option letter,
/// captures and named captures, find with nth and ctx, gmatch, sub/gsub with
/// templates and functions, the res parameter and the error paths.
const CASES: &[&str] = &[
    // match: captures
    r#"return ngx.re.match("hello 1234", [[(\d+)]], "jo")"#,
    r#"return ngx.re.match("hello, world", "HELLO", "i")"#,
    r#"return ngx.re.match("hello", "x")"#,
    r#"return ngx.re.match("hello", "(h)(x)?(e)")"#,
    r#"return ngx.re.match("hello", "(h)(e)(x)?")"#,
    r#"return ngx.re.match("hello", "(h)(e)(x)?(y)?")"#,
    r#"return ngx.re.match("abc", "b")"#,
    r#"return ngx.re.match("abab", [[(ab)\1]])"#,
    r#"return ngx.re.match("price: $42", [[(?<=\$)\d+]])"#,
    r#"return ngx.re.match("", "^$")"#,
    r#"return ngx.re.match("a\0b", "a\0b")"#,
    r#"return ngx.re.match("a\0b", [[a\x00(b)]])"#,
    // named captures, D and J
    r#"return ngx.re.match("hello 1234", [[(?<word>\w+) (?<num>\d+)]])"#,
    r#"return ngx.re.match("hello", [[(?<a>h)(?<b>x)?]])"#,
    r#"return ngx.re.match("ab", [[(?<n>a)(?<n>b)]])"#,
    r#"return ngx.re.match("ab", [[(?<n>a)(?<n>b)]], "D")"#,
    r#"return ngx.re.match("a", [[(?<n>a)|(?<n>b)]], "D")"#,
    r#"return ngx.re.match("b", [[(?:(?<n>a)|(?<n>b))(?<m>c)?]], "D")"#,
    r#"return ngx.re.match("ab", [[(?P<x>a)(?'y'b)]])"#,
    r#"return ngx.re.match("\n", "[^]", "J")"#,
    r#"return ngx.re.match("\n", "[^]")"#,
    r#"return ngx.re.match("u0041", [[\u0041]], "J")"#,
    // option letters
    r#"return ngx.re.match("a\nb\nc", "^b$", "m"), ngx.re.match("a\nb\nc", "^b$")"#,
    r#"return ngx.re.match("a\nb", "a.b", "s"), ngx.re.match("a\nb", "a.b")"#,
    r#"return ngx.re.match("abc", [[a b  c # comment]], "x")"#,
    r#"return ngx.re.match("héllo", "^h.l", "u"), ngx.re.match("héllo", "^h.l")"#,
    r#"return ngx.re.match("日本語abc", "(.)(.)", "u")"#,
    r#"return ngx.re.match("日本語", "..", "U")"#,
    r#"return ngx.re.match("\255", ".", "u")"#,
    r#"return ngx.re.match("a", "\255", "u")"#,
    r#"return ngx.re.match("ÉCOLE", "école", "iu")"#,
    r#"return ngx.re.match("hello", "l+", "a"), ngx.re.match("llo", "l+", "a")"#,
    r#"return ngx.re.match("hello", "l+|lo|llo", "d")"#,
    r#"return ngx.re.match("abcd", "(a)(b)", "d")"#,
    r#"return ngx.re.match("ab", "(?<x>a)b", "d")"#,
    r#"return ngx.re.match("ab", "(?<x>a)(?<x>b)", "dD")"#,
    r#"return ngx.re.match("AbC\ndef", "^DEF$", "jmi")"#,
    r#"return ngx.re.match("AbC\ndéf", [[^ d . f $ ]], "ijmsuxo")"#,
    r#"return ngx.re.match("aaa", "a", "iii")"#,
    r#"return ngx.re.match("aaa", "a", "")"#,
    r#"return ngx.re.match("xyz", "Y", "Ujo")"#,
    r#"local a = ngx.re.match("a1", [[\d]], "o") local b = ngx.re.match("b2", [[\d]], "o") return a, b"#,
    r#"return ngx.re.match("aXb", "x", "ao"), ngx.re.match("xb", "x", "aio")"#,
    // unknown option letters (OpenResty's error names a line in
    // resty/core/regex.lua: compare the text after the position)
    r#"local ok, e = pcall(ngx.re.match, "a", "a", "ik") return ok, (e:gsub("^.-:%d+: ", ""))"#,
    r#"local ok, e = pcall(ngx.re.find, "a", "a", "z") return ok, (e:gsub("^.-:%d+: ", ""))"#,
    r#"local ok, e = pcall(ngx.re.gmatch, "a", "a", "O") return ok, (e:gsub("^.-:%d+: ", ""))"#,
    r#"local ok, e = pcall(ngx.re.sub, "a", "a", "b", "jx-") return ok, (e:gsub("^.-:%d+: ", ""))"#,
    r#"local ok, e = pcall(ngx.re.gsub, "a", "a", "b", " ") return ok, (e:gsub("^.-:%d+: ", ""))"#,
    // bad patterns
    r#"return ngx.re.match("a", "(")"#,
    r#"return ngx.re.match("a", "[a")"#,
    r#"return ngx.re.match("a", "a{2,1}")"#,
    r#"return ngx.re.match("a", "(?<n")"#,
    r#"return ngx.re.match("a", "\\")"#,
    r#"return ngx.re.match("a", "*a")"#,
    r#"return ngx.re.match("a", "(?z)", "jo")"#,
    r#"return ngx.re.match("a", ("x"):rep(150) .. "(")"#,
    r#"return ngx.re.match("a", "(" .. ("x"):rep(150))"#,
    r#"return ngx.re.match("a", "a\0(")"#,
    r#"return ngx.re.find("a", "[")"#,
    r#"return ngx.re.gmatch("a", "(")"#,
    // find, nth
    r#"return ngx.re.find("hello 1234", [[\d+]])"#,
    r#"return ngx.re.find("hello 1234", [[(\w+) (\d+)]], "jo", nil, 2)"#,
    r#"return ngx.re.find("hello 1234", [[(\w+) (\d+)]], "jo", nil, 0)"#,
    r#"return ngx.re.find("hello 1234", [[(\w+) (\d+)]], "jo", nil, 3)"#,
    r#"return ngx.re.find("hello 1234", [[(\w+) (\d+)]], "jo", nil, -1)"#,
    r#"return ngx.re.find("a", "(a)|(b)", "", nil, 2)"#,
    r#"return ngx.re.find("b", "(a)?(b)", "", nil, 1)"#,
    r#"return ngx.re.find("abc", "x")"#,
    r#"return ngx.re.find("xxabcd", "ab|abc", "d")"#,
    r#"return ngx.re.find("ab", "(a)", "d", nil, 1)"#,
    r#"return ngx.re.find("héllo", "l+", "u")"#,
    r#"return ngx.re.find("", "")"#,
    // ctx.pos
    r#"local ctx = {} local f, t = ngx.re.find("a1b2", [[\d]], "", ctx) return f, t, ctx"#,
    r#"local ctx = {pos = 3} return ngx.re.match("a1b2c3", [[\d]], "", ctx), ctx"#,
    r#"local ctx = {pos = 0} return ngx.re.match("a1", [[\d]], "", ctx), ctx"#,
    r#"local ctx = {pos = -5} return ngx.re.match("a1", [[\d]], "", ctx), ctx"#,
    r#"local ctx = {pos = 3} return ngx.re.match("a1", [[\d]], "", ctx), ctx"#,
    r#"local ctx = {pos = 100} return ngx.re.match("a1", [[\d]], "", ctx), ctx"#,
    r#"local ctx = {pos = 2.7} return ngx.re.match("a1b2", [[\d]], "", ctx), ctx"#,
    r#"local ctx = {pos = 3} return ngx.re.match("hello", "l+", "a", ctx), ctx"#,
    r#"local ctx = {pos = 2} return ngx.re.find("hello", "l", "a", ctx), ctx"#,
    r#"local ctx, out = {}, {} while true do local m = ngx.re.match("a1b22c333", [[\d+]], "jo", ctx) if not m then break end out[#out + 1] = m[0] .. "@" .. ctx.pos end return out, ctx"#,
    r#"local ctx = {pos = 3} return ngx.re.match("héllo", ".", "u", ctx)"#,
    // the res parameter
    r#"local res = {} local m = ngx.re.match("a1", [[(\w)(\d)]], "", nil, res) return m == res, res"#,
    r#"local res = {[0] = "x", "y", "z", "w", extra = 1} ngx.re.match("ab", "(a)", "", nil, res) return res"#,
    r#"local res = {} ngx.re.match("ab", [[(?<n>a)(?<n>b)]], "D", nil, res) ngx.re.match("ab", [[(?<n>a)(?<n>b)]], "D", nil, res) return res"#,
    r#"local res = {"keep"} return ngx.re.match("a", "b", "", nil, res), res"#,
    r#"local res = {} return ngx.re.match("abc", "b+|abc", "d", nil, res), res"#,
    // subjects that are not strings
    r#"return ngx.re.match(12345, [[3(\d)]]), ngx.re.match(nil, "nil"), ngx.re.find(true, "ru")"#,
    r#"return ngx.re.gsub(1.5, [[\.]], ","), ngx.re.sub(false, "a", "A")"#,
    // gmatch
    r#"local out = {} for m in ngx.re.gmatch("hello world foo", [[(\w+)]]) do out[#out + 1] = m end return out"#,
    r#"local out = {} for m in ngx.re.gmatch("k1=v1, k2=v2", [[(?<k>\w+)=(?<v>\w+)]], "jo") do out[#out + 1] = m end return out"#,
    r#"local out = {} for m in ngx.re.gmatch("abc", "x*") do out[#out + 1] = m[0] end return out"#,
    r#"local out = {} for m in ngx.re.gmatch("ab", "$") do out[#out + 1] = m end return out"#,
    r#"local out = {} for m in ngx.re.gmatch("aaa bb", "a+|b", "d") do out[#out + 1] = m end return out"#,
    r#"local out = {} for m in ngx.re.gmatch("a1b2c3", [[\d]], "ao") do out[#out + 1] = m[0] end return out"#,
    r#"local it = ngx.re.gmatch("héllo", "", "u") local out = {} for i = 1, 5 do local m, err = it() out[i] = m and m[0] or tostring(err) end return out"#,
    r#"local it = ngx.re.gmatch("a", "a") return type(it), it(), it(), it()"#,
    r#"local it = ngx.re.gmatch("a1b2", [[\d]]) local a = it() local b = it() local c, e = it() return a, b, c, e"#,
    r#"local out = {} for m in ngx.re.gmatch("a1b2c3", [[\d]], "o") do out[#out + 1] = m[0] .. ngx.re.match("zz9", [[\d]], "o")[0] end return out"#,
    // sub/gsub with templates
    r#"return ngx.re.sub("hello, world", "([a-z])[a-z]+", "[$0,$1]", "o")"#,
    r#"return ngx.re.gsub("hello, world", "([a-z])[a-z]+", "[$0,$1]", "o")"#,
    r#"return ngx.re.gsub("a1b2", [[\d]], "$$")"#,
    r#"return ngx.re.gsub("a1b2", [[(\d)]], "${1}x$1y")"#,
    r#"return ngx.re.gsub("a1", [[(\d)]], "[$10][$2][${01}]")"#,
    r#"return ngx.re.gsub("b", [[(a)?(b)]], "[$1|$2]")"#,
    r#"return ngx.re.gsub("ab", "(a)", "[$18446744073709551616][$9223372036854775809]")"#,
    r#"return ngx.re.gsub("aaa", "a", "b")"#,
    r#"return ngx.re.gsub("abc", "b", "")"#,
    r#"return ngx.re.gsub("a1", [[\d]], 7)"#,
    r#"return ngx.re.sub("aaa", "a", "b")"#,
    r#"return ngx.re.sub("abc", "x", "y")"#,
    r#"return ngx.re.gsub("abc", "x*", "-")"#,
    r#"return ngx.re.gsub("abc", "", "-")"#,
    r#"return ngx.re.gsub("", "", "-"), ngx.re.gsub("", "x", "-")"#,
    r#"return ngx.re.gsub("héllo", "", "-", "u")"#,
    r#"return ngx.re.gsub("aaa bb", "a+|b", "<$0>", "d")"#,
    r#"return ngx.re.gsub("aab", "a", "x", "a")"#,
    r#"return ngx.re.gsub("a\nb\n", "^", "> ", "m")"#,
    r#"return ngx.re.gsub("a b c", [[ \s ]], "", "x")"#,
    r#"return ngx.re.gsub("ÀÉ", ".", "[$0]", "u")"#,
    r#"return ngx.re.gsub("ab", "(?<n>a)", "${n}")"#,
    r#"return ngx.re.gsub("ab", "(?<n>a)", "$n")"#,
    r#"return ngx.re.gsub("ab", "a", "x$")"#,
    r#"return ngx.re.gsub("ab", "a", "x${")"#,
    r#"return ngx.re.gsub("ab", "a", "${1")"#,
    r#"return ngx.re.gsub("ab", "a", "${1x}")"#,
    r#"return ngx.re.gsub("ab", "a", "${}")"#,
    r#"return ngx.re.gsub("ab", "a", "$-")"#,
    r#"return ngx.re.sub("a", "(", "x")"#,
    r#"return ngx.re.sub("a", "(", "$")"#,
    // sub/gsub with functions
    r#"return ngx.re.gsub("hello world", [[(\w+)]], function(m) return m[1]:upper() end)"#,
    r#"return ngx.re.sub("hello world", [[(?<w>\w+)]], function(m) return "<" .. m.w .. ">" end, "jo")"#,
    r#"return ngx.re.gsub("a1b2", [[\d]], function(m) return nil end)"#,
    r#"return ngx.re.gsub("a1b2", [[\d]], function(m) return tonumber(m[0]) * 1.5 end)"#,
    r#"return ngx.re.gsub("abc", "", function(m) return "|" end)"#,
    r#"return ngx.re.gsub("a", "[", function() end)"#,
    r#"local seen = {} local s, n = ngx.re.gsub("a1b2", [[(\w)(\d)]], function(m) seen[#seen + 1] = m return "" end) return s, n, seen"#,
    r#"return ngx.re.gsub("a1b2", [[\d]], function(m) return ngx.re.gsub(m[0], [[\d]], "<$0>", "o") end, "o")"#,
    r#"return ngx.re.gsub("a1b2c3", [[\d]], function(m) return ngx.re.match("999", [[\d]], "o")[0] end, "o")"#,
    r#"return pcall(ngx.re.gsub, "a1", [[\d]], function() error("boom") end)"#,
    // the `ngx.re` module: split
    r#"return require("ngx.re").split("a,b,c", ",")"#,
    r#"return require("ngx.re").split("a,b,,c,,", ",")"#,
    r#"return require("ngx.re").split(",,", ",")"#,
    r#"return require("ngx.re").split(",a,", ",")"#,
    r#"return require("ngx.re").split("", ",")"#,
    r#"return require("ngx.re").split("abc", "")"#,
    r#"return require("ngx.re").split("abc", "x*")"#,
    r#"return require("ngx.re").split("a1b22c333", [[\d+]], "jo")"#,
    r#"return require("ngx.re").split("a,b;c", "([,;])")"#,
    r#"return require("ngx.re").split("a,b;c", "(,)|(;)")"#,
    r#"return require("ngx.re").split("aXbxc", "x", "i")"#,
    r#"return require("ngx.re").split("héllo", "", "u")"#,
    r#"return require("ngx.re").split(12345, "3")"#,
    r#"return require("ngx.re").split("a,b,c,d", ",", nil, nil, 2)"#,
    r#"return require("ngx.re").split("a,b,c,d", ",", nil, nil, 3)"#,
    r#"return require("ngx.re").split("a,b,,", ",", nil, nil, 10)"#,
    r#"return require("ngx.re").split("a,b,c", ",", nil, nil, 1)"#,
    r#"return require("ngx.re").split("a,b,c", ",", nil, nil, -1)"#,
    r#"return require("ngx.re").split("abc", "", nil, nil, 2)"#,
    r#"local ctx = {pos = 3} return require("ngx.re").split("a,b,c,d", ",", nil, ctx), ctx"#,
    r#"local ctx = {} return require("ngx.re").split("a,b", ",", nil, ctx), ctx"#,
    r#"local ctx = {pos = 10} return require("ngx.re").split("a,b", ",", nil, ctx), ctx"#,
    r#"local res = {"x", "y", "z", "w"} return require("ngx.re").split("a,b", ",", nil, nil, nil, res), res"#,
    r#"return pcall(require("ngx.re").split, "a", ",", nil, nil, nil, "x")"#,
    r#"return require("ngx.re").split("a", "(")"#,
    r#"return require("ngx.re").split("aaa bb", "a+|b", "d")"#,
    r#"local ok, e = pcall(require("ngx.re").split, "a", ",", "k") return ok, (e:gsub("^.-:%d+: ", ""))"#,
    r#"return pcall(require("ngx.re").opt, "no_such_option", 1)"#,
    r#"local re = require "ngx.re" return type(re.split), type(re.opt), type(re.version)"#,
    // more `o` patterns than lua_regex_cache_max_entries (1024), twice
    r#"local n = 0 for round = 1, 2 do for i = 1, 1500 do n = n + ngx.re.match("k" .. i, "k(" .. i .. ")", "o")[1] end end return n"#,
    // PCRE limits: match limit, 32 KiB of JIT stack, and the C stack for
    // matching without JIT (4000 levels: more than 2 MiB of stack)
    r#"return ngx.re.match(("a"):rep(26) .. "d", "(a+)+(?:b|c)")"#,
    r#"return ngx.re.match(("a"):rep(26) .. "d", "(a+)+(?:b|c)", "j")"#,
    r#"return ngx.re.find(("ab"):rep(20000), "(a|b)*", "j")"#,
    r#"return ngx.re.find(("ab"):rep(2000), "(a|b)*")"#,
];

/// What differs between the PCRE APIs the event loop's ngx.re may run on
/// (lua-nginx-module 0.10.24 and later use PCRE2 where nginx does).
struct Pcre {
    /// The error for the pattern "(".
    missing_paren: &'static str,
    /// pcre_exec's code when the match limit is hit.
    match_limit: i32,
    /// pcre_exec's code when the JIT stack is too small.
    jit_stack_limit: i32,
}

/// The PCRE of the event loop's ngx.re, as lua-resty-core tells them
/// apart: by the version the lua module reports.
fn event_loop_pcre(ngx: &Nginx) -> Pcre {
    let version = run(
        ngx,
        "/el",
        r#"local ffi = require "ffi" return ffi.string(ffi.C.ngx_http_lua_ffi_pcre_version())"#,
    );
    if version.starts_with("2: true, \"8.") {
        Pcre {
            missing_paren: r#"pcre_compile() failed: missing ) in \"(\""#,
            match_limit: -8,
            jit_stack_limit: -27,
        }
    } else {
        assert!(version.starts_with("2: true, \"10."), "{version}");
        Pcre {
            missing_paren: r#"pcre2_compile() failed: missing closing parenthesis in \"(\""#,
            match_limit: -47,
            jit_stack_limit: -46,
        }
    }
}

fn start() -> Nginx {
    start_with_settings("", "")
}

/// As start, with `http_extra` in the http block and `pool_init` as the
/// pool's init chunk.
fn start_with_settings(http_extra: &str, pool_init: &str) -> Nginx {
    // A task is a case's source, or (nil, n) for the concurrency test.
    let pool_lua = format!(
        "{SERIALIZER}\n{WORK}\nreturn function(src, n) return n and work(n) or run(src) end\n"
    );
    let el_lua =
        format!("{SERIALIZER}\nngx.req.read_body()\nngx.print(run(ngx.req.get_body_data()))\n");
    let tp_lua = r#"
ngx.req.read_body()
local tp = require "resty.threadpool"
local out, err = tp.re_pool:push_task(ngx.req.get_body_data())
ngx.print(out or ("push_task failed: " .. tostring(err)))
"#;
    let stress_lua = format!(
        r#"{WORK}
local tp = require "resty.threadpool"
local n = tonumber(ngx.var.arg_n)
local function in_pool() return tp.re_pool:push_task(nil, n) end
local t1 = ngx.thread.spawn(in_pool)
local t2 = ngx.thread.spawn(in_pool)
local here = work(n)
local _, r1, e1 = ngx.thread.wait(t1)
local _, r2, e2 = ngx.thread.wait(t2)
ngx.print(here, " ", tostring(r1 or e1), " ", tostring(r2 or e2))
"#
    );
    let init = if pool_init.is_empty() {
        String::new()
    } else {
        format!("thread_pool_init_by_lua re_pool '{pool_init}';")
    };
    let http = format!(
        r#"
    {http_extra}
    {init}
    thread_pool_process_by_lua_file re_pool conf/pool.lua;
    server {{
        listen 127.0.0.1:$PORT;
        client_body_buffer_size 64k;
        location /el {{ content_by_lua_file conf/el.lua; }}
        location /tp {{ content_by_lua_file conf/tp.lua; }}
        location /stress {{ content_by_lua_file conf/stress.lua; }}
    }}
"#
    );
    Case::new("thread_pool re_pool threads=2;")
        .http(&http)
        .file("pool.lua", &pool_lua)
        .file("el.lua", &el_lua)
        .file("tp.lua", tp_lua)
        .file("stress.lua", &stress_lua)
        .start()
}

fn run(ngx: &Nginx, path: &str, src: &str) -> String {
    let resp = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        request(ngx.port, "POST", path, &[], src.as_bytes())
    }))
    .unwrap_or_else(|_| panic!("{path} {src}: no response\nerror.log:\n{}", ngx.error_log()));
    assert_eq!(resp.status, 200, "{path} {src}: {}", resp.text());
    resp.text()
}

#[test]
fn pool_thread_results_equal_event_loop_results() {
    assert!(CASES.len() >= 80);
    let mut ngx = start();
    let mut diffs = Vec::new();
    let mut results = Vec::new();
    for src in CASES {
        let here = run(&ngx, "/el", src);
        let pool = run(&ngx, "/tp", src);
        if here != pool {
            diffs.push(format!(
                "case {src}\n  event loop: {here}\n  pool:       {pool}"
            ));
        }
        results.push(here);
    }
    assert!(
        diffs.is_empty(),
        "{} of {} cases differ:\n{}",
        diffs.len(),
        CASES.len(),
        diffs.join("\n")
    );

    // The cases test what they are meant to (spot checks of the event
    // loop's own results).
    let pcre = event_loop_pcre(&ngx);
    let result_of = |src: &str| &results[CASES.iter().position(|c| *c == src).unwrap()];
    assert_eq!(result_of(CASES[0]), r#"2: true, {[0]="1234",[1]="1234"}"#);
    assert_eq!(
        result_of(r#"return ngx.re.match("ab", [[(?<n>a)(?<n>b)]], "D")"#),
        r#"2: true, {[0]="ab",[1]="a",[2]="b",["n"]={[1]="a",[2]="b"}}"#
    );
    assert_eq!(
        result_of(r#"return ngx.re.match("a", "(")"#),
        &format!(r#"3: true, nil, "{}""#, pcre.missing_paren)
    );
    assert_eq!(
        result_of(r#"return ngx.re.gsub("ab", "(?<n>a)", "${n}")"#),
        r#"4: true, nil, nil, "failed to compile the replacement template""#
    );
    assert!(
        result_of(r#"return ngx.re.find(("ab"):rep(20000), "(a|b)*", "j")"#)
            .contains(&format!("pcre_exec() failed: {}", pcre.jit_stack_limit))
    );
    assert_eq!(
        result_of(
            r#"local ok, e = pcall(ngx.re.match, "a", "a", "ik") return ok, (e:gsub("^.-:%d+: ", ""))"#
        ),
        r#"3: true, false, "unknown flag \"k\" (flags \"ik\")""#
    );
    assert_eq!(
        result_of(r#"return ngx.re.find(("ab"):rep(2000), "(a|b)*")"#),
        "3: true, 1, 4000"
    );
    assert_eq!(
        result_of(r#"return ngx.re.match(("a"):rep(26) .. "d", "(a+)+(?:b|c)")"#),
        &format!(
            r#"3: true, nil, "pcre_exec() failed: {}""#,
            pcre.match_limit
        )
    );
    // lua-nginx-module logs why a template is bad; so does the pool thread
    // (the cases' bad templates).
    let why = r#"attempt to use named capturing variable "n" (named captures not supported yet)"#;
    ngx.expect_errors(&[
        &format!("[error]*{why}"),
        "[error]*lua script: invalid capturing variable name found in \"",
        "[error]*the closing bracket in \"1\" variable is missing",
    ]);
    ngx.assert_clean_log();
    let log = ngx.error_log();
    assert!(
        log.contains(&format!("{why}, thread pool: re_pool")),
        "{log}"
    );
}

#[test]
fn match_limit_and_jit_stack_size_apply_in_pool_threads() {
    let set_jit_stack = r#"require("ngx.re").opt("jit_stack_size", 8388608)"#;
    let ngx = start_with_settings(
        &format!("lua_regex_match_limit 1000; init_by_lua_block {{ {set_jit_stack} }}"),
        set_jit_stack,
    );
    let over_limit = format!(
        r#"3: true, nil, "pcre_exec() failed: {}""#,
        event_loop_pcre(&ngx).match_limit
    );
    for (src, want) in [
        // over the configured limit, well under PCRE's default
        (
            r#"return ngx.re.match(("a"):rep(12) .. "d", "(a+)+(?:b|c)")"#,
            over_limit.as_str(),
        ),
        // under it
        (
            r#"return ngx.re.match("aad", "(a+)+(?:b|c)")"#,
            "2: true, nil",
        ),
        // deeper than the default 32 KiB JIT stack allows
        (
            r#"return ngx.re.find(("ab"):rep(20000), "(a|b)*", "j")"#,
            "3: true, 1, 40000",
        ),
        (
            r#"ngx.re.match("a", "a", "o") return pcall(require("ngx.re").opt, "jit_stack_size", 65536)"#,
            r#"3: true, false, "changing jit stack size is not allowed when some regexs have already been compiled and cached""#,
        ),
    ] {
        let here = run(&ngx, "/el", src);
        let pool = run(&ngx, "/tp", src);
        assert_eq!(here, want, "event loop: {src}");
        assert_eq!(pool, want, "pool thread: {src}");
    }
    ngx.assert_clean_log();
}

/// A JIT stack replaced by `opt("jit_stack_size")` stays alive while
/// patterns may still match on it: with PCRE2 the stack belongs to the
/// thread's one match context, not to the patterns compiled with it, and
/// the one assigned last may have no pattern left to hold it.
#[test]
fn replaced_jit_stacks_stay_alive_while_in_use() {
    let ngx = start();
    let src = r#"
        local re = require "ngx.re"
        local subj = ("ab"):rep(20000)
        local it = ngx.re.gmatch(subj, "(a|b)*", "j")
        re.opt("jit_stack_size", 65536)
        assert(ngx.re.find("x", "x", "j"))
        re.opt("jit_stack_size", 8388608)
        for _ = 1, 3 do collectgarbage() end
        local m, err = it()
        return m and #m[0], err
    "#;
    let out = run(&ngx, "/tp", src);
    assert!(out.starts_with("3: true, "), "{out}");
    ngx.assert_clean_log();
}

#[test]
fn concurrent_regex_loops_in_pool_threads_and_event_loop() {
    let mut ngx = start();
    for _ in 0..3 {
        let out = ngx.get("/stress?n=10000").text();
        let parts: Vec<&str> = out.split(' ').collect();
        assert_eq!(parts.len(), 3, "{out}");
        assert!(
            parts[0].contains('/') && !parts[0].starts_with("0/"),
            "{out}"
        );
        assert_eq!(parts[1], parts[0], "{out}");
        assert_eq!(parts[2], parts[0], "{out}");
    }
    // The threads' states (and their compiled patterns) close cleanly.
    assert!(ngx.quit(Duration::from_secs(10)), "nginx did not quit");
    ngx.assert_clean_log();
}
