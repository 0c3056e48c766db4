-- ngx.log and print of a pool thread. The constants, ngx.null and the rest
-- come from lua-nginx-module itself (ngx_table.rs); these two are ours so that
-- a thread's log lines name its pool. They format their arguments as the lua
-- module's log_wrapper (ngx_http_lua_log.c, 0.10.23) does, so the same call
-- writes the same message in a thread and on the event loop.
local ngx, prim = ...

local ffi = require "ffi"

local C = ffi.C
local ffi_new = ffi.new
local ffi_str = ffi.string
local type = type
local tostring = tostring
local tonumber = tonumber
local select = select
local rawget = rawget
local error = error
local concat = table.concat
local floor = math.floor
local ceil = math.ceil
local format = string.format
local match = string.match
local getinfo = debug.getinfo
local getfenv = debug.getfenv
local getmetatable = debug.getmetatable

-- ngx_tp_ names only (see ngx_table.rs).
ffi.cdef [[
int ngx_tp_snprintf(char *str, size_t size, const char *format, ...)
    asm("snprintf");
]]

local log_write = prim.log_write
local log_level = prim.log_level

local NOTICE = 6
local num_buf = ffi_new("char[32]")

-- A number as the lua module writes it: an int32 with %d, anything else
-- with libc's %.14g, which keeps the sign of a NaN where tostring drops it.
local function number_text(n)
    if n == floor(n) and n >= -2147483648 and n <= 2147483647 then
        return format("%d", n)
    end
    return ffi_str(num_buf, C.ngx_tp_snprintf(num_buf, 32, "%.14g", n))
end

-- The name the caller used for the function `level` frames up from here
-- (as luaL_argerror names it); only looked up for errors.
local function called_as(level)
    return getinfo(level + 1, "n").name or "?"
end

-- Raised from piece(), under message() and ngx.log or print: level 5 is
-- their caller.
local function bad_arg(i, msg)
    error("bad argument #" .. i .. " to '" .. called_as(4) .. "' (" .. msg
          .. ")", 5)
end

-- luaL_checkint on x86-64: the number truncated to 64 bits (NaN and out of
-- range give the "indefinite" integer, whose low half is 0), then its low
-- 32 bits.
local function checkint(n)
    if not (n > -2^63 and n < 2^63) then
        return 0
    end
    n = (n >= 0 and floor(n) or ceil(n)) % 2^32
    return n >= 2^31 and n - 2^32 or n
end

-- One argument of the message; errors name it as luaL_argerror would.
local function piece(v, i)
    local t = type(v)
    if t == "string" then
        return v
    elseif t == "number" then
        return number_text(v)
    elseif t == "nil" then
        return "nil"
    elseif t == "boolean" then
        return v and "true" or "false"
    elseif t == "table" then
        local mt = getmetatable(v)
        local f = mt and rawget(mt, "__tostring")
        if not f then
            bad_arg(i, "expected table to have __tostring metamethod")
        end
        return tostring(f(v))
    elseif t == "userdata" and getfenv(v) == nil then
        -- a light userdata (only full userdata have an environment): the
        -- lua module writes "null" for all of them
        return "null"
    end
    bad_arg(i, "string, number, boolean, or nil expected, got " .. t)
end

-- The message of a call whose caller is `info`: "file:line: name(): " and
-- the arguments; raises for a bad argument.
local function message(info, ...)
    local n = select("#", ...)
    local parts = { match(info.short_src, "[^/\\]*$"), ":",
                    info.currentline > 0 and info.currentline
                    or info.linedefined, ": " }
    if info.namewhat ~= "" and info.what == "Lua" then
        parts[5] = info.name
        parts[6] = "(): "
    end
    local base = #parts
    for i = 1, n do
        parts[base + i] = piece((select(i, ...)), i)
    end
    return concat(parts)
end

function ngx.log(...)
    local level = tonumber((...))
    if level == nil then
        local t = select("#", ...) == 0 and "no value" or type((...))
        error("bad argument #1 to '" .. called_as(1)
              .. "' (number expected, got " .. t .. ")", 2)
    end
    level = checkint(level)
    if level < 0 or level > 8 then
        error("bad argument #1 to '" .. called_as(1) .. "' (bad log level: "
              .. level .. ")", 2)
    end
    if level > log_level then
        return
    end
    log_write(level, message(getinfo(2, "Sln"), select(2, ...)))
end

local function print(...)
    if NOTICE > log_level then
        return
    end
    log_write(NOTICE, message(getinfo(2, "Sln"), ...))
end

return print
