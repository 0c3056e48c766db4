//! The request-free ngx API in pool threads gives what it gives on the event
//! loop: every snippet below runs in content_by_lua and in a pool thread
//! (the same source, compiled as "=snippet" on both sides), and the two
//! serialized results must be the same bytes. Also: shared dicts under
//! concurrent incr from two threads and the event loop, and the APIs that
//! cannot work in a thread raising an error that names them.

mod common;

use common::Nginx;

const MAIN: &str = "thread_pool parity threads=1;\nthread_pool conc threads=2;";

const HTTP: &str = r#"
    lua_shared_dict dict 1m;
    lua_shared_dict small 64k;
    client_body_buffer_size 64k;
    thread_pool_process_by_lua_file parity conf/parity_run.lua;
    thread_pool_process_by_lua conc "
        local n = ...
        local d = ngx.shared.dict
        for _ = 1, n do
            local v, err = d:incr('counter', 1, 0)
            if not v then
                error(err)
            end
        end
        return true
    ";
    server {
        listen 127.0.0.1:$PORT;
        default_type text/plain;
        location = /loop {
            content_by_lua_block {
                ngx.req.read_body()
                local run = dofile(ngx.config.prefix() .. "conf/parity_run.lua")
                ngx.print(run(ngx.req.get_body_data()))
            }
        }
        location = /thread {
            content_by_lua_block {
                ngx.req.read_body()
                local tp = require "resty.threadpool"
                local res, err = tp.parity:push_task(ngx.req.get_body_data())
                ngx.print(res or ("push_task failed: " .. tostring(err)))
            }
        }
        location = /conc {
            content_by_lua_block {
                local tp = require "resty.threadpool"
                local d = ngx.shared.dict
                d:delete("counter")
                local function push()
                    return tp.conc:push_task(10000)
                end
                local t1 = ngx.thread.spawn(push)
                local t2 = ngx.thread.spawn(push)
                for _ = 1, 10000 do
                    assert(d:incr("counter", 1, 0))
                end
                local _, r1, e1 = ngx.thread.wait(t1)
                local _, r2, e2 = ngx.thread.wait(t2)
                ngx.print(tostring(r1), " ", tostring(e1), " ", tostring(r2),
                          " ", tostring(e2), " ", d:get("counter"))
            }
        }
    }
"#;

/// Runs a snippet compiled as "=snippet" and serializes the results of
/// pcall(snippet): "<count>: v1, v2, ...", table keys sorted, strings with
/// every control or non-ASCII byte escaped, numbers exact. Where an error
/// was raised inside the API's implementation its position names a file
/// that differs by construction (resty/core/*.lua or ngx_threadpool.*);
/// it is replaced by "<impl>".
const RUNNER: &str = r##"
local type, tostring, pairs, ipairs, select = type, tostring, pairs, ipairs, select
local format, byte, concat, sort = string.format, string.byte, table.concat, table.sort
local null = ngx.null

local function quote(s)
    return '"' .. (s:gsub('[%c"\\\128-\255]', function(c)
        return format("\\%03d", byte(c))
    end)) .. '"'
end

local function number(n)
    if n ~= n then return "nan" end
    if n == 1/0 then return "inf" end
    if n == -1/0 then return "-inf" end
    if n == 0 and 1/n < 0 then return "-0" end
    return format("%.17g", n)
end

local function key_less(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    if ta == "boolean" then return not a and b end
    return false
end

local function ser(v, depth)
    local t = type(v)
    if t == "string" then return quote(v) end
    if t == "number" then return number(v) end
    if t == "nil" or t == "boolean" then return tostring(v) end
    if t == "table" then
        if depth > 20 then return "<deep>" end
        local keys = {}
        for k in pairs(v) do keys[#keys + 1] = k end
        sort(keys, key_less)
        local parts = {}
        for i, k in ipairs(keys) do
            parts[i] = "[" .. ser(k, depth + 1) .. "]=" .. ser(v[k], depth + 1)
        end
        return "{" .. concat(parts, ", ") .. "}"
    end
    if v == null then return "null" end
    -- functions, threads, cdata, userdata: their addresses differ
    return t
end

local function normalize(msg)
    if type(msg) ~= "string" then return msg end
    msg = msg:gsub("^[^:]*resty/core/[%w_]+%.lua:%d+: ", "<impl>: ")
    msg = msg:gsub("^ngx_threadpool%.[%w_]+:%d+: ", "<impl>: ")
    return msg
end

local function pack(...)
    return { n = select("#", ...), ... }
end

return function(src)
    local f, err = loadstring(src, "=snippet")
    if not f then
        return "cannot compile: " .. err
    end
    local r = pack(pcall(f))
    if not r[1] then
        r[2] = normalize(r[2])
    end
    local parts = {}
    for i = 1, r.n do
        parts[i] = ser(r[i], 0)
    end
    return r.n .. ": " .. concat(parts, ", ")
end
"##;

fn start() -> Nginx {
    common::Case::new(MAIN)
        .http(HTTP)
        .file("parity_run.lua", RUNNER)
        .start()
}

#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// Same bytes; the snippet returns normally.
    Returns,
    /// Same bytes; the snippet raises (the same error).
    Raises,
    /// Both return one number, these many units apart at most.
    Near(f64),
}

struct Case {
    name: String,
    code: String,
    check: Check,
}

fn case(name: &str, check: Check, code: &str) -> Case {
    Case {
        name: name.into(),
        code: code.into(),
        check,
    }
}

fn ok(name: &str, code: &str) -> Case {
    case(name, Check::Returns, code)
}

fn raises(name: &str, code: &str) -> Case {
    case(name, Check::Raises, code)
}

/// A shared dict snippet: `d` is ngx.shared.dict, emptied first (the event
/// loop runs a snippet first, then the thread, on the same dict).
fn dict(name: &str, check: Check, code: &str) -> Case {
    let fresh = "local d = ngx.shared.dict d:flush_all() d:flush_expired() ";
    case(name, check, &format!("{fresh}{code}"))
}

const ALL_BYTES: &str =
    "local t = {} for i = 0, 255 do t[#t + 1] = string.char(i) end local all = table.concat(t) ";

fn cases() -> Vec<Case> {
    use Check::*;
    let mut v = vec![
        // constants and ngx.null
        ok("every numeric constant", "local t = {} for k, v in pairs(ngx) do if type(v) == 'number' then t[k] = v end end return t"),
        ok("core constants", "return ngx.OK, ngx.ERROR, ngx.AGAIN, ngx.DONE, ngx.DECLINED"),
        ok("log levels", "return ngx.STDERR, ngx.EMERG, ngx.ALERT, ngx.CRIT, ngx.ERR, ngx.WARN, ngx.NOTICE, ngx.INFO, ngx.DEBUG"),
        ok("http methods", "return ngx.HTTP_GET, ngx.HTTP_HEAD, ngx.HTTP_POST, ngx.HTTP_PUT, ngx.HTTP_DELETE, ngx.HTTP_MKCOL, ngx.HTTP_COPY, ngx.HTTP_MOVE, ngx.HTTP_OPTIONS, ngx.HTTP_PROPFIND, ngx.HTTP_PROPPATCH, ngx.HTTP_LOCK, ngx.HTTP_UNLOCK, ngx.HTTP_PATCH, ngx.HTTP_TRACE"),
        ok("http statuses", "return {ngx.HTTP_CONTINUE, ngx.HTTP_SWITCHING_PROTOCOLS, ngx.HTTP_OK, ngx.HTTP_CREATED, ngx.HTTP_ACCEPTED, ngx.HTTP_NO_CONTENT, ngx.HTTP_PARTIAL_CONTENT, ngx.HTTP_SPECIAL_RESPONSE, ngx.HTTP_MOVED_PERMANENTLY, ngx.HTTP_MOVED_TEMPORARILY, ngx.HTTP_SEE_OTHER, ngx.HTTP_NOT_MODIFIED, ngx.HTTP_TEMPORARY_REDIRECT, ngx.HTTP_PERMANENT_REDIRECT, ngx.HTTP_BAD_REQUEST, ngx.HTTP_UNAUTHORIZED, ngx.HTTP_PAYMENT_REQUIRED, ngx.HTTP_FORBIDDEN, ngx.HTTP_NOT_FOUND, ngx.HTTP_NOT_ALLOWED, ngx.HTTP_NOT_ACCEPTABLE, ngx.HTTP_REQUEST_TIMEOUT, ngx.HTTP_CONFLICT, ngx.HTTP_GONE, ngx.HTTP_UPGRADE_REQUIRED, ngx.HTTP_TOO_MANY_REQUESTS, ngx.HTTP_CLOSE, ngx.HTTP_ILLEGAL, ngx.HTTP_INTERNAL_SERVER_ERROR, ngx.HTTP_NOT_IMPLEMENTED, ngx.HTTP_METHOD_NOT_IMPLEMENTED, ngx.HTTP_BAD_GATEWAY, ngx.HTTP_SERVICE_UNAVAILABLE, ngx.HTTP_GATEWAY_TIMEOUT, ngx.HTTP_VERSION_NOT_SUPPORTED, ngx.HTTP_INSUFFICIENT_STORAGE}"),
        ok("ngx.null", "return ngx.null, type(ngx.null), ngx.null == nil, tostring(ngx.null), {ngx.null, k = ngx.null}"),
        // hashes and checksums
        ok("md5 empty", "return ngx.md5('')"),
        ok("md5", "return ngx.md5('The quick brown fox jumps over the lazy dog')"),
        ok("md5 coercions", "return ngx.md5(nil), ngx.md5(false), ngx.md5(12.5), ngx.md5(true), ngx.md5(setmetatable({}, {__tostring = function() return 'x' end}))"),
        ok("md5_bin", "return ngx.md5_bin('hello'), ngx.md5_bin(nil), #ngx.md5_bin(string.rep('x', 100000))"),
        ok("sha1_bin", "return ngx.sha1_bin('abc'), ngx.sha1_bin(''), ngx.sha1_bin(42)"),
        ok("sha1_bin 1 MB", "return ngx.sha1_bin(string.rep('a', 1000000))"),
        ok("hmac_sha1", "return ngx.hmac_sha1('key', 'The quick brown fox jumps over the lazy dog')"),
        ok("hmac_sha1 numbers", "return ngx.hmac_sha1(123, 456.5), ngx.hmac_sha1('', '')"),
        raises("hmac_sha1 one argument", "return ngx.hmac_sha1('k')"),
        raises("hmac_sha1 nil key", "return ngx.hmac_sha1(nil, 'x')"),
        ok("crc32", "return ngx.crc32_short('hello'), ngx.crc32_long('hello'), ngx.crc32_short(''), ngx.crc32_long(nil)"),
        ok("crc32 long input", "local s = string.rep('0123456789', 1000) return ngx.crc32_short(s), ngx.crc32_long(s), ngx.crc32_short(12345)"),
        // base64
        ok("encode_base64 lengths", "local r = {} for i = 0, 7 do r[#r + 1] = ngx.encode_base64(('abcdefg'):sub(1, i)) end return r"),
        ok("encode_base64 no_padding", "local r = {} for i = 0, 7 do r[#r + 1] = ngx.encode_base64(('abcdefg'):sub(1, i), true) end return r"),
        ok("encode_base64 all bytes", &format!("{ALL_BYTES}return ngx.encode_base64(all), ngx.encode_base64(all, true)")),
        ok("encode_base64 coercions", "return ngx.encode_base64(nil), ngx.encode_base64(3.14), ngx.encode_base64(true), ngx.encode_base64('x', false), ngx.encode_base64('x', nil)"),
        raises("encode_base64 bad no_padding", "return ngx.encode_base64('x', 1)"),
        ok("encode_base64 beyond the buffer", "local s = ngx.encode_base64(string.rep('\\255', 10000)) return #s, ngx.md5(s)"),
        ok("decode_base64", "return ngx.decode_base64('aGVsbG8gd29ybGQ='), ngx.decode_base64('aGVsbG8'), ngx.decode_base64('')"),
        ok("decode_base64 invalid", "return ngx.decode_base64('!!!!'), ngx.decode_base64('a'), ngx.decode_base64('aGVsbG8=x')"),
        raises("decode_base64 number", "return ngx.decode_base64(123)"),
        ok("base64 round trip", &format!("{ALL_BYTES}local s = string.rep(all, 50) return ngx.decode_base64(ngx.encode_base64(s)) == s, ngx.decode_base64(ngx.encode_base64(all, true)) == all")),
        // URI escaping
        ok("escape_uri default", "return ngx.escape_uri('a b&c=d/\\195\\169?#%~')"),
        ok("escape_uri unchanged", "local s = 'abcXYZ019-_.~' return ngx.escape_uri(s), ngx.escape_uri(s, 0)"),
        ok("escape_uri coercions", "return ngx.escape_uri(nil), ngx.escape_uri(1.5), ngx.escape_uri(false)"),
        raises("escape_uri type not a number", "return ngx.escape_uri('x', '2')"),
        raises("escape_uri type out of range", "return ngx.escape_uri('x', 7)"),
        raises("escape_uri negative type", "return ngx.escape_uri('x', -1)"),
        ok("escape_uri beyond the buffer", "local s = ngx.escape_uri(string.rep(' ', 5000)) return #s, s:sub(1, 9)"),
        ok("unescape_uri", "return ngx.unescape_uri('a%20b+c%zz%4'), ngx.unescape_uri('%E2%82%AC%2f'), ngx.unescape_uri('')"),
        ok("unescape_uri coercions", "return ngx.unescape_uri(nil), ngx.unescape_uri(12), ngx.unescape_uri(true)"),
        ok("uri round trip", &format!("{ALL_BYTES}return ngx.unescape_uri(ngx.escape_uri(all)) == all, ngx.unescape_uri(ngx.escape_uri(all, 0)) == all")),
        // query args
        ok("encode_args", "return ngx.encode_args({a = 'b c'}), ngx.encode_args({['k&='] = 'v=&/'}), ngx.encode_args({})"),
        ok("encode_args multi-value", "return ngx.encode_args({a = {'1', '2', 3}}), ngx.encode_args({a = {}})"),
        ok("encode_args booleans", "return ngx.encode_args({a = true}), ngx.encode_args({b = false})"),
        ok("encode_args many keys", "local s = ngx.encode_args({x = 1, y = 'two', z = true, w = 2.5}) local p = {} for piece in s:gmatch('[^&]+') do p[#p + 1] = piece end table.sort(p) return p"),
        raises("encode_args bad value", "return ngx.encode_args({a = function() end})"),
        raises("encode_args string", "return ngx.encode_args('a=b')"),
        raises("encode_args two arguments", "return ngx.encode_args({}, {})"),
        ok("decode_args", "return ngx.decode_args('a=1&b=2&c')"),
        ok("decode_args repeated keys", "return ngx.decode_args('a=1&a=2&a=3&b&b')"),
        ok("decode_args escapes", "return ngx.decode_args('a%20b=c+d&%3D=%26&x=%zz')"),
        ok("decode_args empty parts", "return ngx.decode_args('=x&&a=&=&b&')"),
        ok("decode_args max_args", "return ngx.decode_args('a=1&b=2&c=3', 2)"),
        ok("decode_args default limit", "local t = {} for i = 1, 150 do t[i] = 'k' .. i .. '=' .. i end local r, more = ngx.decode_args(table.concat(t, '&')) local n = 0 for _ in pairs(r) do n = n + 1 end return n, more"),
        ok("decode_args unlimited", "local t = {} for i = 1, 150 do t[i] = 'k' .. i .. '=' .. i end local r, more = ngx.decode_args(table.concat(t, '&'), 0) local n = 0 for _ in pairs(r) do n = n + 1 end return n, more"),
        raises("decode_args no argument", "return ngx.decode_args()"),
        raises("decode_args table", "return ngx.decode_args({})"),
        raises("decode_args bad max_args", "return ngx.decode_args('a=1', 'x')"),
        // SQL quoting
        ok("quote_sql_str", "return ngx.quote_sql_str(\"it's\"), ngx.quote_sql_str(''), ngx.quote_sql_str(12)"),
        ok("quote_sql_str specials", "return ngx.quote_sql_str('\\0\\n\\r\\t\\26\\\\\"\\'\\8x')"),
        raises("quote_sql_str no argument", "return ngx.quote_sql_str()"),
        raises("quote_sql_str table", "return ngx.quote_sql_str({})"),
        // time
        ok("http_time", "return ngx.http_time(0), ngx.http_time(1700000000), ngx.http_time(2^31), ngx.http_time(1.9)"),
        raises("http_time string", "return ngx.http_time('0')"),
        ok("cookie_time", "return ngx.cookie_time(0), ngx.cookie_time(1700000000), ngx.cookie_time(253402300799)"),
        raises("cookie_time nil", "return ngx.cookie_time()"),
        ok("parse_http_time formats", "return ngx.parse_http_time('Thu, 18 Nov 2010 11:27:35 GMT'), ngx.parse_http_time('Thursday, 18-Nov-10 11:27:35 GMT'), ngx.parse_http_time('Thu Nov 18 11:27:35 2010')"),
        ok("parse_http_time invalid", "return ngx.parse_http_time('garbage'), ngx.parse_http_time(''), ngx.parse_http_time('Thu, 32 Nov 2010 11:27:35 GMT')"),
        raises("parse_http_time number", "return ngx.parse_http_time(0)"),
        ok("http time round trip", "local t = ngx.time() return ngx.parse_http_time(ngx.http_time(t)) == t, ngx.parse_http_time(ngx.http_time(1234567890))"),
        ok("localtime shape", "local s = ngx.localtime() return #s, s:match('^%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d$') ~= nil"),
        ok("utctime shape", "local s = ngx.utctime() return #s, s:match('^%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d$') ~= nil"),
        ok("today shape", "local s = ngx.today() return #s, s:match('^%d%d%d%d%-%d%d%-%d%d$') ~= nil"),
        case("now", Near(1.0), "return ngx.now()"),
        case("time", Near(1.0), "return ngx.time()"),
        case("now after update_time", Near(1.0), "ngx.update_time() return ngx.now()"),
        ok("update_time", "local a = ngx.now() local n = select('#', ngx.update_time()) return ngx.now() >= a, n, type(ngx.now()), type(ngx.time())"),
        // ngx.config and ngx.worker
        ok("config.prefix", "return ngx.config.prefix()"),
        ok("config values", "local c = ngx.config return c.nginx_version, c.ngx_lua_version, c.subsystem, c.debug"),
        ok("config.nginx_configure", "return ngx.config.nginx_configure()"),
        ok("config fields", "local t = {} for k, v in pairs(ngx.config) do t[k] = type(v) end return t"),
        ok("worker", "local w = ngx.worker return w.pid(), w.id(), w.count(), w.exiting()"),
        ok("worker fields", "local t = {} for k, v in pairs(ngx.worker) do t[k] = type(v) end return t"),
        // C modules on lua_package_cpath, package paths
        ok("cjson", "local cjson = require 'cjson' return cjson.encode({1, 2, 'x', {true}}), cjson.decode('{\"a\":[1,2.5,{\"b\":null}]}')"),
        ok("cjson.safe", "local cjson = require 'cjson.safe' return cjson.decode('{bad'), cjson.encode(function() end)"),
        ok("cjson.null is ngx.null", "return require('cjson').null == ngx.null"),
        ok("package paths", "return package.path, package.cpath"),
        ok("resty.core.base loads", "local base = require 'resty.core.base' return base.FFI_OK, base.FFI_DECLINED, type(base.new_tab)"),
        ok("lua-resty-core's version", "return require('resty.core').version, require('ngx.re').version, require('resty.core.regex').version"),
        // shared dicts
        ok("shared dict names", "local t = {} for k in pairs(ngx.shared) do t[#t + 1] = k end table.sort(t) return t, ngx.shared.nope"),
        ok("shared dict methods", "local t = {} for k, v in pairs(getmetatable(ngx.shared.dict)) do t[k] = type(v) end return t"),
        dict("capacity and free_space", Returns, "return d:capacity(), ngx.shared.small:capacity(), d:free_space()"),
        dict("set and get", Returns, "local a = {d:set('s', 'str')} local b = {d:set('n', 1.5)} local c = {d:set('i', -42)} return a, b, c, d:get('s'), d:get('n'), d:get('i')"),
        dict("numbers", Returns, "d:set('big', 2^53) d:set('tiny', 1e-300) d:set('inf', 1/0) d:set('negzero', -0.0) return d:get('big'), d:get('tiny'), d:get('inf'), d:get('negzero')"),
        dict("booleans", Returns, "d:set('t', true) d:set('f', false) return d:get('t'), d:get('f')"),
        dict("flags", Returns, "d:set('k', 'v', 0, 7) d:set('z', 'v', 0, 0) return {d:get('k')}, {d:get('z')}, {d:get_stale('k')}"),
        dict("get missing", Returns, "return {d:get('missing')}, {d:get_stale('missing')}"),
        dict("set nil deletes", Returns, "d:set('k', 'v') local r = {d:set('k', nil)} return r, d:get('k')"),
        dict("large value", Returns, "local s = string.rep('abcdefghij', 1000) d:set('big', s) local v = d:get('big') return #v, v == s, select(3, d:get_stale('big'))"),
        dict("empty string value", Returns, "d:set('e', '') return d:get('e')"),
        dict("key coercion", Returns, "d:set(1, 'one') d:set(true, 'yes') return d:get('1'), d:get(1), d:get('true')"),
        dict("key errors", Returns, "local long = string.rep('k', 65536) return {d:get(nil)}, {d:get('')}, {d:get(long)}, {d:set(nil, 1)}, {d:set('', 1)}, {d:set(long, 1)}, {d:incr(nil, 1)}, {d:ttl('')}, {d:expire(long, 1)}, {d:add(nil, 1)}"),
        dict("bad value type", Returns, "return {d:set('k', {})}, {d:set('k', function() end)}, {d:add('k', ngx.null)}"),
        dict("negative exptime", Raises, "return d:set('k', 'v', -1)"),
        dict("add", Returns, "local a = {d:add('k', 1)} local b = {d:add('k', 2)} return a, b, d:get('k')"),
        dict("safe_add and safe_set", Returns, "local a = {d:safe_add('k', 1)} local b = {d:safe_add('k', 2)} local c = {d:safe_set('k', 3)} return a, b, c, d:get('k')"),
        dict("replace", Returns, "local a = {d:replace('k', 1)} d:set('k', 0) local b = {d:replace('k', 2)} return a, b, d:get('k')"),
        dict("delete", Returns, "d:set('k', 1) local a = {d:delete('k')} local b = {d:delete('k')} return a, b, d:get('k')"),
        dict("incr missing", Returns, "return d:incr('k', 1)"),
        dict("incr", Returns, "d:set('k', 10) return d:incr('k', 5), d:incr('k', -2.5), d:incr('k', '3'), d:get('k')"),
        dict("incr with init", Returns, "return {d:incr('k', 1, 100)}, {d:incr('k', 1, 100)}, d:get('k')"),
        dict("incr with init_ttl", Returns, "local r = {d:incr('k', 1, 0, 100)} local ttl = d:ttl('k') return r, math.floor(ttl + 0.5), {d:incr('n', 1, 0, 0)}, d:ttl('n')"),
        dict("incr not a number", Returns, "d:set('k', 'x') return d:incr('k', 1)"),
        dict("incr bad init", Raises, "return d:incr('k', 1, 'x')"),
        dict("incr init_ttl without init", Raises, "return d:incr('k', 1, nil, 10)"),
        dict("incr negative init_ttl", Raises, "return d:incr('k', 1, 0, -1)"),
        dict("incr nil value", Raises, "return d:incr('k', nil)"),
        dict("set bad exptime", Raises, "return d:set('k', 'v', 'x')"),
        dict("incr bad init_ttl", Raises, "return d:incr('k', 1, 0, {})"),
        dict("lists", Returns, "local r = {} r[1] = d:lpush('l', 'a') r[2] = d:rpush('l', 2) r[3] = d:lpush('l', 'c') r[4] = d:llen('l') r[5] = d:lpop('l') r[6] = d:rpop('l') r[7] = d:rpop('l') r[8] = d:rpop('l') r[9] = d:llen('l') return r"),
        dict("list errors", Returns, "d:set('s', 1) d:lpush('l', 'x') return {d:lpush('s', 1)}, {d:llen('s')}, {d:lpop('s')}, {d:get('l')}, {d:incr('l', 1)}, {d:lpop('none')}, {d:llen('none')}"),
        dict("list bad value", Returns, "return d:lpush('l', {})"),
        dict("list nil key", Returns, "return d:rpush(nil, 1)"),
        dict("get_keys", Returns, "d:set('a', 1) d:set('b', 2) d:set('c', 3) d:lpush('l', 1) local all = d:get_keys() local two = d:get_keys(2) local zero = d:get_keys(0) table.sort(zero) return all, #two, zero"),
        dict("flush_all and get_stale", Returns, "d:set('k', 'v', 0, 3) d:flush_all() return {d:get('k')}, {d:get_stale('k')}, d:flush_expired()"),
        dict("flush_expired", Returns, "for i = 1, 10 do d:set('k' .. i, i) end d:flush_all() return d:flush_expired(5), d:flush_expired(), d:flush_expired(), #d:get_keys(0)"),
        dict("free_space after use", Returns, "local before = d:free_space() for i = 1, 200 do d:set('k' .. i, string.rep('x', 2000)) end local used = d:free_space() d:flush_all() d:flush_expired() return before, used, d:free_space()"),
        dict("ttl", Returns, "d:set('forever', 1) d:set('soon', 1, 100) return d:ttl('forever'), math.floor(d:ttl('soon') + 0.5), {d:ttl('missing')}"),
        dict("expire", Returns, "d:set('k', 1) local a = {d:expire('k', 50)} local t = math.floor(d:ttl('k') + 0.5) local b = {d:expire('k', 0)} return a, t, b, d:ttl('k'), {d:expire('missing', 1)}"),
        dict("expire without exptime", Raises, "return d:expire('k')"),
        dict("expiry and get_stale", Returns, "d:set('k', 'v', 0.001, 5) local t = ngx.now() + 0.01 repeat ngx.update_time() until ngx.now() >= t return {d:get('k')}, {d:get_stale('k')}, {d:ttl('k')}"),
        dict("bad zone", Raises, "return d.get(nil, 'k')"),
        dict("bad zone table", Raises, "return d.set({}, 'k', 1)"),
        dict("bad zone capacity", Raises, "return d.capacity({1})"),
        dict("dicts are separate", Returns, "local s = ngx.shared.small s:flush_all() d:set('k', 'in dict') return s:get('k'), d:get('k')"),
        dict("small dict fills up", Returns, "local s = ngx.shared.small s:flush_all() s:flush_expired() local v = string.rep('x', 1000) local n = 0 while s:safe_set('k' .. n, v) do n = n + 1 end local r = {s:safe_set('last', v)} local f = {s:set('last', v)} s:flush_all() s:flush_expired() return n > 10, r, f"),
    ];
    // every escape type on every byte
    for ty in 0..=6 {
        v.push(ok(
            &format!("escape_uri type {ty}"),
            &format!("{ALL_BYTES}return ngx.escape_uri(all, {ty}), ngx.escape_uri(string.rep(all, 20), {ty}) == string.rep(ngx.escape_uri(all, {ty}), 20)"),
        ));
    }
    v
}

/// Runs `code` on the event loop and in a thread; the two outputs.
fn both(ngx: &Nginx, code: &str) -> (String, String) {
    let on_loop = ngx.post("/loop", code.as_bytes());
    let in_thread = ngx.post("/thread", code.as_bytes());
    assert_eq!(on_loop.status, 200, "{}", on_loop.text());
    assert_eq!(in_thread.status, 200, "{}", in_thread.text());
    (on_loop.text(), in_thread.text())
}

/// The number a snippet returned, from "2: true, <number>".
fn returned_number(out: &str) -> Option<f64> {
    out.strip_prefix("2: true, ")?.parse().ok()
}

fn verdict(c: &Case, on_loop: &str, in_thread: &str) -> Result<(), String> {
    let values = on_loop.split_once(": ").map_or("", |(_, v)| v);
    let returned = values == "true" || values.starts_with("true, ");
    match c.check {
        Check::Returns if !returned => Err("expected the snippet to return".into()),
        Check::Raises if !values.starts_with("false, ") => {
            Err("expected the snippet to raise".into())
        }
        Check::Returns | Check::Raises if on_loop != in_thread => Err("outputs differ".into()),
        Check::Returns | Check::Raises => Ok(()),
        Check::Near(tolerance) => match (returned_number(on_loop), returned_number(in_thread)) {
            (Some(a), Some(b)) if (a - b).abs() <= tolerance => Ok(()),
            (Some(_), Some(_)) => Err(format!("more than {tolerance} apart")),
            _ => Err("expected one number each".into()),
        },
    }
}

#[test]
fn request_free_api_matches_the_event_loop() {
    let ngx = start();
    let cases = cases();
    assert!(cases.len() >= 90, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let (on_loop, in_thread) = both(&ngx, &c.code);
        if let Err(why) = verdict(c, &on_loop, &in_thread) {
            failures.push(format!(
                "{}: {why}\n  code:   {}\n  loop:   {on_loop}\n  thread: {in_thread}",
                c.name, c.code
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    ngx.assert_clean_log();
}

/// A log case: what the snippet returns and the lines it writes must match.
struct LogCase {
    name: &'static str,
    code: &'static str,
    /// Lines each side writes (levels above info are not written).
    lines: usize,
}

const LOG_CASES: &[LogCase] = &[
    LogCase { name: "strings", code: "ngx.log(ngx.WARN, 'a', 'b', '', 'c d')", lines: 1 },
    LogCase { name: "numbers", code: "ngx.log(ngx.WARN, 0, ' ', -7, ' ', 2^31 - 1, ' ', 2^31, ' ', -2^31, ' ', 0.1, ' ', 1/3, ' ', 1e15, ' ', 1e100, ' ', 123456789012345678)", lines: 1 },
    LogCase { name: "special numbers", code: "ngx.log(ngx.WARN, 0/0, ' ', -(0/0), ' ', 1/0, ' ', -1/0, ' ', -0.0)", lines: 1 },
    LogCase { name: "nil and booleans", code: "ngx.log(ngx.WARN, nil, true, false, nil)", lines: 1 },
    LogCase { name: "null and __tostring", code: "local mt = {__tostring = function(t) return 'T' .. #t end} ngx.log(ngx.WARN, ngx.null, setmetatable({1, 2}, mt), setmetatable({}, {__tostring = function() return 5 end}))", lines: 1 },
    LogCase { name: "protected metatable", code: "ngx.log(ngx.WARN, setmetatable({}, {__metatable = false, __tostring = function() return 'hidden' end}))", lines: 1 },
    LogCase { name: "no message", code: "ngx.log(ngx.WARN)", lines: 1 },
    LogCase { name: "function names", code: "local function named() ngx.log(ngx.WARN, 'in named') end named() local t = {} function t.field() ngx.log(ngx.WARN, 'in field') end t.field() function t:method() ngx.log(ngx.WARN, 'in method') end t:method()", lines: 3 },
    LogCase { name: "called from C", code: "pcall(ngx.log, ngx.WARN, 'via pcall')", lines: 1 },
    LogCase { name: "every level", code: "for _, l in ipairs({ngx.STDERR, ngx.EMERG, ngx.ALERT, ngx.CRIT, ngx.ERR, ngx.WARN, ngx.NOTICE, ngx.INFO, ngx.DEBUG}) do ngx.log(l, 'level ', l) end", lines: 8 },
    LogCase { name: "print", code: "print('printed ', 1, ' ', nil, ' ', true)", lines: 1 },
    LogCase { name: "bad levels", code: "return {pcall(ngx.log, 9, 'x')}, {pcall(ngx.log, -1, 'x')}, {pcall(ngx.log, 'warn', 'x')}, {pcall(ngx.log)}, {pcall(ngx.log, nil, 'x')}", lines: 0 },
    LogCase { name: "bad level position", code: "local log = ngx.log\nlog(42, 'x')", lines: 0 },
    LogCase { name: "bad arguments", code: "return {pcall(ngx.log, ngx.WARN, {})}, {pcall(ngx.log, ngx.WARN, print)}, {pcall(ngx.log, ngx.WARN, coroutine.create(function() end))}, {pcall(ngx.log, ngx.WARN, 'a', newproxy())}, {pcall(print, {})}", lines: 0 },
    LogCase { name: "bad argument position", code: "local mylog = ngx.log\nmylog(ngx.ERR, 'ok', {})", lines: 0 },
    LogCase { name: "filtered level skips checks", code: "return pcall(ngx.log, ngx.DEBUG, {}, print)", lines: 0 },
    LogCase { name: "level coercions", code: "ngx.log('4', 'string level') ngx.log(4.9, 'float level') ngx.log(-0.5, 'rounds to 0') ngx.log(0/0, 'nan level') ngx.log(2^32 + 4, 'wraps to 4')", lines: 5 },
];

/// The " [lua] ..." messages in `log` with their levels: "[warn] msg".
fn lua_lines(log: &str, suffix: &str) -> Vec<String> {
    log.lines()
        .filter_map(|line| {
            let level = line.split_once('[')?.1.split_once(']')?.0;
            let msg = line.split_once("[lua] ")?.1;
            let msg = msg.rsplit_once(suffix).map_or(msg, |(m, _)| m);
            Some(format!("[{level}] {msg}"))
        })
        .collect()
}

#[test]
fn log_lines_match_the_event_loop() {
    let ngx = start();
    let mut failures = Vec::new();
    for c in LOG_CASES {
        let start = ngx.error_log().len();
        let on_loop = ngx.post("/loop", c.code.as_bytes()).text();
        let middle = ngx.error_log().len();
        let in_thread = ngx.post("/thread", c.code.as_bytes()).text();
        let log = ngx.error_log();
        let loop_lines = lua_lines(&log[start..middle], ", client: ");
        let thread_lines = lua_lines(&log[middle..], ", thread pool: parity");
        if on_loop != in_thread || loop_lines != thread_lines || loop_lines.len() != c.lines {
            failures.push(format!(
                "{}:\n  loop:   {on_loop} {loop_lines:?}\n  thread: {in_thread} {thread_lines:?}",
                c.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shared_dict_incr_is_exact_under_concurrency() {
    let ngx = start();
    for _ in 0..3 {
        let r = ngx.get("/conc");
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "true nil true nil 30000");
    }
    ngx.assert_clean_log();
}

/// APIs that need a request or the event loop, and how to touch them.
const UNAVAILABLE: &[(&str, &str)] = &[
    ("ngx.sleep", "ngx.sleep(0.1)"),
    ("ngx.say", "ngx.say('x')"),
    ("ngx.print", "ngx.print('x')"),
    ("ngx.exit", "ngx.exit(200)"),
    ("ngx.redirect", "ngx.redirect('/')"),
    ("ngx.exec", "ngx.exec('/')"),
    ("ngx.flush", "ngx.flush(true)"),
    ("ngx.eof", "ngx.eof()"),
    ("ngx.send_headers", "ngx.send_headers()"),
    ("ngx.on_abort", "ngx.on_abort(function() end)"),
    (
        "ngx.run_worker_thread",
        "ngx.run_worker_thread('p', 'm', 'f')",
    ),
    ("ngx.req.get_headers", "ngx.req.get_headers()"),
    ("ngx.req.get_uri_args", "ngx.req.get_uri_args()"),
    ("ngx.req.get_method", "ngx.req.get_method()"),
    ("ngx.req.read_body", "ngx.req.read_body()"),
    ("ngx.req.get_body_data", "ngx.req.get_body_data()"),
    ("ngx.req.set_header", "ngx.req.set_header('a', 'b')"),
    ("ngx.req.start_time", "ngx.req.start_time()"),
    ("ngx.req.socket", "ngx.req.socket()"),
    ("ngx.resp.get_headers", "ngx.resp.get_headers()"),
    ("ngx.location.capture", "ngx.location.capture('/')"),
    (
        "ngx.location.capture_multi",
        "ngx.location.capture_multi({{'/'}})",
    ),
    ("ngx.timer.at", "ngx.timer.at(0, function() end)"),
    ("ngx.timer.every", "ngx.timer.every(1, function() end)"),
    ("ngx.timer.pending_count", "ngx.timer.pending_count()"),
    ("ngx.timer.running_count", "ngx.timer.running_count()"),
    ("ngx.thread.spawn", "ngx.thread.spawn(function() end)"),
    ("ngx.thread.wait", "ngx.thread.wait()"),
    ("ngx.thread.kill", "ngx.thread.kill()"),
    ("ngx.socket.tcp", "ngx.socket.tcp()"),
    ("ngx.socket.udp", "ngx.socket.udp()"),
    ("ngx.socket.stream", "ngx.socket.stream()"),
    ("ngx.socket.connect", "ngx.socket.connect('127.0.0.1', 1)"),
    ("ngx.worker.pids", "ngx.worker.pids()"),
    ("ngx.var", "return ngx.var.uri"),
    ("ngx.var", "ngx.var.x = 1"),
    ("ngx.header", "return ngx.header['Content-Type']"),
    ("ngx.header", "ngx.header.x = 1"),
    ("ngx.arg", "return ngx.arg[1]"),
    ("ngx.ctx", "return ngx.ctx"),
    ("ngx.ctx", "ngx.ctx = {}"),
    ("ngx.status", "return ngx.status"),
    ("ngx.status", "ngx.status = 500"),
    ("ngx.headers_sent", "return ngx.headers_sent"),
    ("ngx.is_subrequest", "return ngx.is_subrequest"),
];

fn thread_run(ngx: &Nginx, code: &str) -> String {
    let r = ngx.post("/thread", code.as_bytes());
    assert_eq!(r.status, 200);
    r.text()
}

#[test]
fn request_apis_raise_a_clear_error_in_threads() {
    let ngx = start();
    let mut failures = Vec::new();
    for (api, code) in UNAVAILABLE {
        let out = thread_run(&ngx, code);
        let want = format!("2: false, \"snippet:1: {api} is not available in thread pools\"");
        if out != want {
            failures.push(format!("{code}\n  got:  {out}\n  want: {want}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Reading them is fine, so modules that keep them in locals load.
    assert_eq!(
        thread_run(&ngx, "local s, t, v = ngx.sleep, ngx.req.get_headers, ngx.var return type(s), type(t), type(v)"),
        "4: true, \"function\", \"function\", \"table\""
    );
    // Names OpenResty does not have are nil, as on the event loop.
    assert_eq!(
        thread_run(&ngx, "return ngx.no_such_api, ngx.req.no_such_api"),
        "3: true, nil, nil"
    );
    assert_eq!(
        thread_run(&ngx, "return ngx.get_phase()"),
        "2: true, \"thread_pool\""
    );
    // The thread is still in working order.
    assert_eq!(
        thread_run(&ngx, "return ngx.md5('')"),
        "2: true, \"d41d8cd98f00b204e9800998ecf8427e\""
    );
    ngx.assert_clean_log();
}
