-- Finalizers in a pool thread never raise: every __gc the thread's code
-- can set (ffi.gc, ffi.metatype, newproxy's metatable, debug.setmetatable)
-- runs under pcall, and its error is logged.
--
-- LuaJIT raises a finalizer's error from whatever allocation ran the
-- collector step: a task that had nothing to do with it fails, every task
-- until the last failing finalizer has run, and some of those paths crash
-- the process outright (seen on the event loop too: an error in a
-- newproxy finalizer during a JIT-compiled loop ends in SIGSEGV; with the
-- JIT off, lua-nginx-module's own allocations hit it unprotected). So the
-- thread catches them where they start.
local log, WARN = ...

local ffi = require "ffi"
local debug = require "debug"
local ffi_gc = ffi.gc
local ffi_metatype = ffi.metatype
local debug_setmetatable = debug.setmetatable
local getmetatable = getmetatable
local newproxy = newproxy
local pcall = pcall
local rawget = rawget
local rawset = rawset
local setmetatable = setmetatable
local tostring = tostring
local type = type

-- Failures so far: a line for the first one and at each power of two.
local failed = 0
local next_line = 1

local function guarded(fn)
    if fn == nil then
        return nil
    end
    return function(o)
        local ok, err = pcall(fn, o)
        if not ok then
            failed = failed + 1
            if failed >= next_line then
                next_line = next_line * 2
                pcall(log, WARN, "a finalizer failed (", failed, " so far): ",
                      tostring(err))
            end
        end
    end
end

local function guard_table(mt)
    if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
        rawset(mt, "__gc", guarded(rawget(mt, "__gc")))
    end
    return mt
end

-- A __gc stored later into a proxy's metatable is guarded as it is set.
local guard_on_set = {
    __newindex = function(mt, k, v)
        if k == "__gc" then
            v = guarded(v)
        end
        rawset(mt, k, v)
    end,
}

ffi.gc = function(cdata, fn)
    return ffi_gc(cdata, guarded(fn))
end

ffi.metatype = function(ct, mt)
    return ffi_metatype(ct, guard_table(mt))
end

debug.setmetatable = function(o, mt)
    return debug_setmetatable(o, guard_table(mt))
end

_G.newproxy = function(arg)
    local p = newproxy(arg)
    local mt = arg == true and getmetatable(p)
    if mt then
        setmetatable(mt, guard_on_set)
    end
    return p
end
