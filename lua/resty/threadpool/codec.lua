-- MessagePack codec for values crossing between the nginx event loop's
-- LuaJIT VM and the thread pool's LuaJIT VMs.  The Rust side (src/codec/)
-- implements the same wire format and must agree byte for byte:
--
--   payload := uint(n) map(k) { uint(position) value }*k
--
-- n is select('#', ...); only non-nil top-level values are in the map, so
-- nils (trailing ones included) survive the trip.  This module encodes;
-- resty.threadpool.decode decodes (decode_results here is its results).

local ffi = require "ffi"

local bit = require "bit"
local band = bit.band
local rshift = bit.rshift

local ffi_new = ffi.new

local type = type
local next = next
local select = select
local rawget = rawget
local rawequal = rawequal
local tostring = tostring
local pcall = pcall
local require = require
local floor = math.floor
local byte = string.byte
local char = string.char
local format = string.format
local gsub = string.gsub

local ok, new_tab = pcall(require, "table.new")
if not ok then
    new_tab = function() return {} end
end

local nkeys
ok, nkeys = pcall(require, "table.nkeys")
if not ok then
    nkeys = function(t)
        local c = 0
        local k = next(t)
        while not rawequal(k, nil) do
            c = c + 1
            k = next(t, k)
        end
        return c
    end
end

-- The decoder is its own module; limits and ngx.null come from it.
local decode = require "resty.threadpool.decode"
local null = decode.null

local MAX_DEPTH = decode.MAX_DEPTH
local MAX_PAYLOAD = 16 * 1024 * 1024
local MAX_VALUES = decode.MAX_VALUES

local TWO32 = 4294967296
local TWO63 = 9223372036854775808


-- Scratch union for float -> bytes; reused, so writing allocates nothing.
local f64 = ffi_new("union { double d; uint8_t b[8]; }")
local LE = ffi.abi("le")

-- One-byte strings, so writing a byte never creates a string.
local BYTE = new_tab(256, 1)
for i = 0, 255 do
    BYTE[i] = char(i)
end

-- Tables on the path from the top-level value to the one being encoded.
-- A module-level stack (cleared on the way out) keeps cycle detection free
-- of per-call allocation.
local stack = new_tab(MAX_DEPTH + 1, 0)

-- Zero-copy, while encode_borrowing runs: strings of at least borrow_min
-- bytes are appended to `borrowed` and the payload holds their index (a
-- fixext 4 of type 1, see the Rust codec). Their bytes count towards
-- MAX_PAYLOAD as if copied.
local borrowed
local borrow_min = math.huge
local borrowed_bytes = 0
local borrow_base = 0   -- #borrowed before this payload: its indexes start at 0

local _M = {
    version = "0.1",
    MAX_DEPTH = MAX_DEPTH,
    MAX_PAYLOAD = MAX_PAYLOAD,
    MAX_VALUES = MAX_VALUES,
    null = null,
}

-- Error kinds returned (never thrown) by the encoder; the message is built
-- only once, at the top, so the success path does no string work.
local E_TYPE = 1
local E_KEY = 2
local E_CYCLE = 3
local E_DEEP = 4
local E_SIZE = 5

local function put_u32(buf, x)
    buf:put(BYTE[rshift(x, 24)], BYTE[band(rshift(x, 16), 255)],
            BYTE[band(rshift(x, 8), 255)], BYTE[band(x, 255)])
end

local function put_int(buf, x)
    if x >= 0 then
        if x < 128 then
            buf:put(BYTE[x])
        elseif x < 256 then
            buf:put("\204", BYTE[x])
        elseif x < 65536 then
            buf:put("\205", BYTE[rshift(x, 8)], BYTE[band(x, 255)])
        elseif x < TWO32 then
            buf:put("\206")
            put_u32(buf, x)
        else
            local hi = floor(x / TWO32)
            buf:put("\207")
            put_u32(buf, hi)
            put_u32(buf, x - hi * TWO32)
        end
    elseif x >= -32 then
        buf:put(BYTE[x + 256])
    elseif x >= -128 then
        buf:put("\208", BYTE[x + 256])
    elseif x >= -32768 then
        local u = x + 65536
        buf:put("\209", BYTE[rshift(u, 8)], BYTE[band(u, 255)])
    elseif x >= -2147483648 then
        -- bit ops see x as an int32, i.e. already in two's complement
        buf:put("\210")
        put_u32(buf, x)
    else
        local hi = floor(x / TWO32)
        buf:put("\211")
        put_u32(buf, hi)
        put_u32(buf, x - hi * TWO32)
    end
end

local function put_number(buf, x)
    -- Integral, in int64 range and not -0.0: smallest int; else float64.
    if x == floor(x) and x >= -TWO63 and x < TWO63
       and (x ~= 0 or 1 / x > 0)
    then
        return put_int(buf, x)
    end
    f64.d = x
    local b = f64.b
    if LE then
        buf:put("\203", BYTE[b[7]], BYTE[b[6]], BYTE[b[5]], BYTE[b[4]],
                BYTE[b[3]], BYTE[b[2]], BYTE[b[1]], BYTE[b[0]])
    else
        buf:put("\203", BYTE[b[0]], BYTE[b[1]], BYTE[b[2]], BYTE[b[3]],
                BYTE[b[4]], BYTE[b[5]], BYTE[b[6]], BYTE[b[7]])
    end
end

-- Strings always go out as bin: it is binary safe and needs no UTF-8 check.
-- Returns true when the payload would grow past MAX_PAYLOAD (checked before
-- copying, so a huge string is never copied just to be refused).
local function put_string(buf, s, start)
    local len = #s
    local size = #buf - start + borrowed_bytes
    if len >= borrow_min then
        -- counted as if copied: bin header and bytes, less the ext's 6
        local copied = len + (len < 256 and 2 or len < 65536 and 3 or 5)
        if size + copied > MAX_PAYLOAD then
            return true
        end
        local i = #borrowed
        borrowed[i + 1] = s
        borrowed_bytes = borrowed_bytes + copied - 6
        buf:put("\214\1")
        put_u32(buf, i - borrow_base)
    elseif len < 256 then
        if size + 2 + len > MAX_PAYLOAD then
            return true
        end
        buf:put("\196", BYTE[len], s)
    elseif len < 65536 then
        if size + 3 + len > MAX_PAYLOAD then
            return true
        end
        buf:put("\197", BYTE[rshift(len, 8)], BYTE[band(len, 255)], s)
    else
        if size + 5 + len > MAX_PAYLOAD then
            return true
        end
        buf:put("\198")
        put_u32(buf, len)
        buf:put(s)
    end
    return false
end

local put_value

-- Error path only.  Mirrors the Rust side's path rendering exactly.
local ESC = {
    ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r",
    ["\t"] = "\\t",
}

local function escape_char(c)
    return ESC[c] or format("\\%03d", byte(c))
end

local function key_segment(k)
    local tk = type(k)
    if tk == "string" then
        return '["' .. gsub(k, '[%c"\\\128-\255]', escape_char) .. '"]'
    end
    if tk == "number" then
        return "[" .. tostring(k) .. "]"
    end
    if tk == "boolean" then
        return k and "[true]" or "[false]"
    end
    return "[" .. tk .. "]"
end

-- Returns nothing on success, or kind, detail, path on error.
-- User values are compared with nil through rawequal: a NULL cdata pointer
-- is == nil in LuaJIT, and must be refused as cdata, not taken for a nil.
local function put_table(buf, t, level, start)
    for i = 1, level - 1 do
        if rawequal(stack[i], t) then
            return E_CYCLE, nil, ""
        end
    end
    if level > MAX_DEPTH then
        return E_DEEP, nil, ""
    end

    local cnt = nkeys(t)
    if cnt == 0 then
        buf:put("\128")
        return
    end

    stack[level] = t

    -- Array iff the keys are exactly 1..cnt: then #t is that (only) border.
    local n = #t
    local array = n == cnt
    if array then
        for i = 1, n do
            if rawequal(rawget(t, i), nil) then
                array = false
                break
            end
        end
    end

    if array then
        if n < 16 then
            buf:put(BYTE[0x90 + n])
        elseif n < 65536 then
            buf:put("\220", BYTE[rshift(n, 8)], BYTE[band(n, 255)])
        else
            buf:put("\221")
            put_u32(buf, n)
        end
        for i = 1, n do
            local kind, detail, path = put_value(buf, rawget(t, i), level,
                                                 start)
            if kind then
                stack[level] = nil
                return kind, detail, "[" .. i .. "]" .. path
            end
        end
        stack[level] = nil
        return
    end

    if cnt < 16 then
        buf:put(BYTE[0x80 + cnt])
    elseif cnt < 65536 then
        buf:put("\222", BYTE[rshift(cnt, 8)], BYTE[band(cnt, 255)])
    else
        buf:put("\223")
        put_u32(buf, cnt)
    end

    local k, v = next(t)
    while not rawequal(k, nil) do
        local tk = type(k)
        local kind, detail, path
        if tk == "string" then
            if put_string(buf, k, start) then
                stack[level] = nil
                return E_SIZE, nil, ""
            end
        elseif tk == "number" then
            put_number(buf, k)
        elseif tk == "boolean" then
            buf:put(k and "\195" or "\194")
        elseif tk == "table" then
            kind, detail, path = put_table(buf, k, level + 1, start)
            if kind then
                stack[level] = nil
                return kind, detail, "(key)" .. path
            end
        else
            -- ngx.null too: it would come back as a key nobody can look up
            stack[level] = nil
            return E_KEY, tk, ""
        end

        kind, detail, path = put_value(buf, v, level, start)
        if kind then
            stack[level] = nil
            return kind, detail, key_segment(k) .. path
        end
        k, v = next(t, k)
    end
    stack[level] = nil
end

-- level: number of tables enclosing v.
put_value = function(buf, v, level, start)
    local tv = type(v)
    if tv == "string" then
        if put_string(buf, v, start) then
            return E_SIZE, nil, ""
        end
    elseif tv == "number" then
        put_number(buf, v)
    elseif tv == "table" then
        return put_table(buf, v, level + 1, start)
    elseif tv == "boolean" then
        buf:put(v and "\195" or "\194")
    elseif tv == "userdata" and v == null then
        -- type check first: a NULL cdata pointer also compares equal
        buf:put("\192")
    else
        return E_TYPE, tv, ""
    end
end

local function err_msg(what, pos, kind, detail, path)
    if kind == E_SIZE then
        return what .. "s exceed " .. MAX_PAYLOAD .. " bytes"
    end
    local at = path ~= "" and " at " .. path or ""
    if kind == E_TYPE then
        return "cannot pass " .. detail .. " in " .. what .. " #" .. pos .. at
    end
    if kind == E_KEY then
        return "cannot pass table key " .. detail .. " in " .. what .. " #"
               .. pos .. at
    end
    if kind == E_CYCLE then
        return "cyclic table in " .. what .. " #" .. pos .. at
    end
    return "table nested deeper than " .. MAX_DEPTH .. " in " .. what .. " #"
           .. pos .. at
end

local function too_big(buf, start, what)
    if #buf - start + borrowed_bytes > MAX_PAYLOAD then
        return nil, what .. "s exceed " .. MAX_PAYLOAD .. " bytes"
    end
    return true
end

-- Appends the payload for the n values ... to buf (n is select('#', ...)).
-- Returns true, or nil and an error message; on error buf holds a partial
-- payload and the caller resets it.
function _M.encode(buf, what, n, ...)
    local start = #buf

    if n == 1 then
        -- Hot path: one value needs no counting pass and no select().
        local v = ...
        if rawequal(v, nil) then
            buf:put("\1\128")
            return true
        end
        buf:put("\1\129\1")
        local kind, detail, path = put_value(buf, v, 0, start)
        if kind then
            return nil, err_msg(what, 1, kind, detail, path)
        end
        return too_big(buf, start, what)
    end

    if n > MAX_VALUES then
        return nil, "too many " .. what .. "s (max " .. MAX_VALUES .. ")"
    end

    local k = 0
    for i = 1, n do
        if not rawequal(select(i, ...), nil) then
            k = k + 1
        end
    end

    put_int(buf, n)
    if k < 16 then
        buf:put(BYTE[0x80 + k])
    else
        buf:put("\222", BYTE[rshift(k, 8)], BYTE[band(k, 255)])
    end

    for i = 1, n do
        local v = select(i, ...)
        if not rawequal(v, nil) then
            put_int(buf, i)
            local kind, detail, path = put_value(buf, v, 0, start)
            if kind then
                return nil, err_msg(what, i, kind, detail, path)
            end
        end
    end
    return too_big(buf, start, what)
end


-- As encode, and strings of at least min bytes (at any depth) are not
-- copied but appended to the array list, the payload referring to them
-- by their place among those it appended (from 0): whoever sends the
-- payload keeps them alive until it is decoded.  Without min, nothing is
-- borrowed.  On error list holds strings of the partial payload.
function _M.encode_borrowing(buf, what, list, min, n, ...)
    borrowed, borrow_min, borrowed_bytes, borrow_base =
        list, min or math.huge, 0, #list
    local ok, err = _M.encode(buf, what, n, ...)
    borrowed, borrow_min, borrowed_bytes = nil, math.huge, 0
    return ok, err
end

-- Returns true, v1, ..., vn or nil, err (resty.threadpool.decode).
_M.decode_results = decode.results

return _M
