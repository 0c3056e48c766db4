-- Content handlers of the benchmark's HTTP locations (bench/nginx.conf.tmpl).
-- The heavy handlers run a bench_tasks task in one of three variants:
-- inline on the event loop, ngx.run_worker_thread, or push_task.
-- Failures answer 503 and are counted in the bench_errors shared dict,
-- which /errors reads and clears.

local cjson = require "cjson.safe"
local tasks = require "bench_tasks"
local waf_http = require "waf_http"

local encode = cjson.encode
local get_headers = ngx.req.get_headers
local get_method = ngx.req.get_method
local get_uri_args = ngx.req.get_uri_args
local run_worker_thread = ngx.run_worker_thread
local ipairs = ipairs
local require = require
local tonumber = tonumber
local tostring = tostring

local errors = ngx.shared.bench_errors
local SORT_N = 20000

local tp_pool
-- The WAF cell's pools: the Lua WAF (waf.lua) and the Rust WAF
-- (examples/waf-rust), by variant.
local WAF_POOLS = { tp = "waf_lua", rust = "waf_rust" }
local waf_pools = {}

local function fail(variant, err)
    errors:incr(variant .. ": " .. tostring(err), 1, 0)
    ngx.status = 503
    ngx.say(err)
end

-- Runs task `name` with `arg` in `variant`; returns its first two results,
-- or nil and an error.
local function run(variant, name, arg)
    if variant == "inline" then
        return tasks[name](arg)
    end
    if variant == "rwt" then
        local ok, a, b = run_worker_thread("rwt", "bench_tasks", name, arg)
        if not ok then
            return nil, a
        end
        return a, b
    end
    if not tp_pool then
        tp_pool = require("resty.threadpool").tp
        tp_pool:set_timeout(10)
    end
    return tp_pool:push_task(name, arg)
end

local function heavy(variant, name, arg)
    local a, b = run(variant, name, arg)
    if a == nil then
        return fail(variant, b)
    end
    ngx.say(name, " ", variant, ": ", tostring(a), " ", tostring(b))
end

local _M = {}

-- GET /sort/VARIANT?n=N: sort N random numbers (20,000 by default).
function _M.sort(variant)
    return heavy(variant, "sort", tonumber(ngx.var.arg_n) or SORT_N)
end

-- GET /waf/VARIANT?args: scan this request with the WAF rules.
function _M.waf(variant)
    return heavy(variant, "waf", {
        method = get_method(),
        uri = ngx.var.uri,
        args = get_uri_args(),
        headers = get_headers(),
    })
end

-- /wafcpu/VARIANT/...: the request, as the WAF sees it (waf_http.request()),
-- scanned inline (Lua + PCRE), by the Lua WAF's pool (tp) or the Rust
-- WAF's (rust), or not at all (none: what every variant pays around the
-- scan). Answers 200 with the number of rules that matched, so that a
-- blocked request is no failure to wrk.
function _M.wafcpu(variant)
    local req = waf_http.request()
    local blocked, err
    if variant == "inline" then
        blocked = require("waf")(req)
    elseif variant ~= "none" then
        local pool = waf_pools[variant]
        if not pool then
            pool = require("resty.threadpool")[WAF_POOLS[variant]]
            pool:set_timeout(10)
            waf_pools[variant] = pool
        end
        blocked, err = pool:push_task(req)
        if err then
            return fail(variant, err)
        end
    end
    ngx.say(blocked and #blocked or 0)
end

-- GET /light: a little Lua on the event loop, in every variant.
function _M.light()
    ngx.say(encode({ uri = ngx.var.uri, args = get_uri_args() }))
end

-- GET /errors: the failures counted since the last call, as JSON.
function _M.errors()
    local out = {}
    for _, k in ipairs(errors:get_keys(0)) do
        out[k] = errors:get(k)
    end
    errors:flush_all()
    ngx.say(encode(out))
end

-- GET /info: versions and the worker's pid.
function _M.info()
    ngx.say(encode({
        nginx_version = ngx.config.nginx_version,
        ngx_lua_version = ngx.config.ngx_lua_version,
        luajit = jit.version,
        worker_pid = ngx.worker.pid(),
    }))
end

return _M
