-- `require` of OpenResty's own modules in a pool thread.
--
-- A thread's package.path is the event loop's, so without this `require
-- "ngx.re"` or `require "resty.core"` would load lua-resty-core, which
-- rebinds ngx.* to lua-nginx-module's C functions; several of those are not
-- thread-safe (one process-wide PCRE memory pool, the request, the event
-- loop). A searcher placed first answers for every `ngx.*` and
-- `resty.core*` name: the thread's own API for the request-free modules, an
-- error for the others. Every other module loads as on the event loop.
local re_module_chunk, re_internal, VERSION = ...

local ffi = require "ffi"

local C = ffi.C
local error = error
local find = string.find
local tonumber = tonumber
local floor = math.floor
local insert = table.insert

-- ngx_tp_ names only (see ngx_table.rs).
ffi.cdef [[
typedef struct {
    long tv_sec;
    long tv_nsec;
} ngx_tp_timespec;
int ngx_tp_clock_gettime(int clk_id, ngx_tp_timespec *tp)
    asm("clock_gettime");
]]

local CLOCK_MONOTONIC = 1
local ts = ffi.new("ngx_tp_timespec")

local function monotonic_msec()
    C.ngx_tp_clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) * 1000 + floor(tonumber(ts.tv_nsec) / 1000000)
end

local function monotonic_time()
    C.ngx_tp_clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) / 1e9
end

-- name -> function returning the module's value (VERSION is the event
-- loop's lua-resty-core's, which its modules return as `version`). lua-resty-core's
-- resty.core.* modules install their functions into ngx.* and return a
-- small table; in a thread ngx.* already holds the thread's own versions.
local provided = {
    ["resty.core"] = function() return { version = VERSION } end,
    ["resty.core.base64"] = function() return { version = VERSION } end,
    ["resty.core.hash"] = function() return { version = VERSION } end,
    ["resty.core.uri"] = function() return { version = VERSION } end,
    ["resty.core.worker"] = function() return { _VERSION = VERSION } end,
    ["resty.core.shdict"] = function() return { version = VERSION } end,
    ["resty.core.time"] = function()
        return { version = VERSION, monotonic_msec = monotonic_msec,
                 monotonic_time = monotonic_time }
    end,
    ["resty.core.regex"] = function()
        return { version = VERSION, no_pcre = false,
                 is_regex_cache_empty = re_internal.cache_empty }
    end,
    ["ngx.re"] = function()
        return re_module_chunk(re_internal, VERSION)
    end,
}

-- Modules of these namespaces that are pure Lua over nginx's own
-- thread-safe functions (no lua-nginx-module state): loaded as usual.
local passthrough = {
    ["resty.core.base"] = true,
    ["ngx.base64"] = true,
}

local function ours(name)
    return find(name, "ngx.", 1, true) == 1 or name == "resty.core"
        or find(name, "resty.core.", 1, true) == 1
end

local function searcher(name)
    if passthrough[name] or not ours(name) then
        return nil
    end
    local module = provided[name]
    if module then
        return module
    end
    -- level 3: the caller of require
    error("module '" .. name .. "' is not available in thread pools", 3)
end

insert(package.loaders, 1, searcher)

-- Ending the process from a pool thread would take the whole worker down.
os.exit = function()
    error("os.exit is not available in thread pools", 2)
end
