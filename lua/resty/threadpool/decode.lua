-- The decoder of resty.threadpool.codec: a payload of results (see there
-- for the format) into Lua values on the event loop.

local ffi = require "ffi"
local buffer = require "string.buffer"

local ffi_string = ffi.string
local ffi_cast = ffi.cast
local ffi_new = ffi.new
local ffi_typeof = ffi.typeof
local format = string.format
local unpack = unpack or table.unpack

local ok, new_tab = pcall(require, "table.new")
if not ok then
    new_tab = function() return {} end
end

-- ngx.null is a NULL light userdata.  Outside OpenResty the string.buffer
-- serializer's documented "null" tag (0x03) yields the very same value.
local ngx = ngx
local null = ngx and ngx.null or buffer.decode("\3")

local MAX_DEPTH = 100
local MAX_VALUES = 4096

local TWO32 = 4294967296

local u8p_t = ffi_typeof("const uint8_t *")

-- Scratch unions for bytes -> float; reused, so reading allocates nothing.
local f64 = ffi_new("union { double d; uint8_t b[8]; }")
local f32 = ffi_new("union { float f; uint8_t b[4]; }")
local LE = ffi.abi("le")

-- While results runs: the payload's borrowed strings (spans).
local spans, nspans = nil, 0

local _M = {
    MAX_DEPTH = MAX_DEPTH,
    MAX_VALUES = MAX_VALUES,
    null = null,
}

-- Decoding.  Every reader returns value, next_pos on success and
-- nil, reason on failure; decoded values are never nil (msgpack nil is
-- ngx.null), so nil unambiguously means failure.

local function be16(p, i)
    return p[i] * 256 + p[i + 1]
end

local function be32(p, i)
    return ((p[i] * 256 + p[i + 1]) * 256 + p[i + 2]) * 256 + p[i + 3]
end

local function get_f64(p, i)
    local b = f64.b
    if LE then
        b[7], b[6], b[5], b[4] = p[i], p[i + 1], p[i + 2], p[i + 3]
        b[3], b[2], b[1], b[0] = p[i + 4], p[i + 5], p[i + 6], p[i + 7]
    else
        b[0], b[1], b[2], b[3] = p[i], p[i + 1], p[i + 2], p[i + 3]
        b[4], b[5], b[6], b[7] = p[i + 4], p[i + 5], p[i + 6], p[i + 7]
    end
    return f64.d
end

local function get_f32(p, i)
    local b = f32.b
    if LE then
        b[3], b[2], b[1], b[0] = p[i], p[i + 1], p[i + 2], p[i + 3]
    else
        b[0], b[1], b[2], b[3] = p[i], p[i + 1], p[i + 2], p[i + 3]
    end
    return f32.f
end

-- Any msgpack integer (positions and the count use these), else nil.
local function read_int(p, pos, len)
    if pos >= len then
        return nil, "truncated"
    end
    local b = p[pos]
    pos = pos + 1
    if b < 0x80 then
        return b, pos
    end
    if b >= 0xe0 then
        return b - 256, pos
    end
    if b < 0xcc or b > 0xd3 then
        return nil, "expected an integer"
    end
    local size
    if b < 0xd0 then
        size = 2 ^ (b - 0xcc)
    else
        size = 2 ^ (b - 0xd0)
    end
    if pos + size > len then
        return nil, "truncated"
    end
    local x
    if size == 1 then
        x = p[pos]
    elseif size == 2 then
        x = be16(p, pos)
    elseif size == 4 then
        x = be32(p, pos)
    else
        local hi = be32(p, pos)
        if b == 0xd3 and hi >= 2147483648 then
            hi = hi - TWO32
        end
        x = hi * TWO32 + be32(p, pos + 4)
    end
    if b >= 0xd0 and size < 8 then
        local half = 2 ^ (8 * size - 1)
        if x >= half then
            x = x - 2 * half
        end
    end
    return x, pos + size
end

local get_value

local function get_str(p, pos, len, l)
    local e = pos + l
    if e > len then
        return nil, "truncated"
    end
    return ffi_string(p + pos, l), e
end

local function get_array(p, pos, len, cnt, level)
    if level > MAX_DEPTH then
        return nil, "tables nested deeper than " .. MAX_DEPTH
    end
    -- Every element takes a byte: bounds the allocation for garbage input.
    if cnt > len - pos then
        return nil, "truncated"
    end
    local t = new_tab(cnt, 0)
    local v
    for i = 1, cnt do
        v, pos = get_value(p, pos, len, level)
        if v == nil then
            return nil, pos
        end
        t[i] = v
    end
    return t, pos
end

local function get_map(p, pos, len, cnt, level)
    if level > MAX_DEPTH then
        return nil, "tables nested deeper than " .. MAX_DEPTH
    end
    if 2 * cnt > len - pos then
        return nil, "truncated"
    end
    local t = new_tab(0, cnt)
    local k, v
    for _ = 1, cnt do
        k, pos = get_value(p, pos, len, level)
        if k == nil then
            return nil, pos
        end
        if k == null then
            return nil, "nil table key"
        end
        if k ~= k then
            return nil, "NaN table key"
        end
        v, pos = get_value(p, pos, len, level)
        if v == nil then
            return nil, pos
        end
        t[k] = v
    end
    return t, pos
end

-- level: number of tables enclosing the value.
get_value = function(p, pos, len, level)
    if pos >= len then
        return nil, "truncated"
    end
    local b = p[pos]
    if b < 0x80 then
        return b, pos + 1
    end
    if b >= 0xe0 then
        return b - 256, pos + 1
    end
    if b >= 0xa0 and b < 0xc0 then
        return get_str(p, pos + 1, len, b - 0xa0)
    end
    if b < 0x90 then
        return get_map(p, pos + 1, len, b - 0x80, level + 1)
    end
    if b < 0xa0 then
        return get_array(p, pos + 1, len, b - 0x90, level + 1)
    end
    if b == 0xc4 or b == 0xd9 then
        if pos + 2 > len then
            return nil, "truncated"
        end
        return get_str(p, pos + 2, len, p[pos + 1])
    end
    if b == 0xc0 then
        return null, pos + 1
    end
    if b == 0xc2 then
        return false, pos + 1
    end
    if b == 0xc3 then
        return true, pos + 1
    end
    if b >= 0xcc and b <= 0xd3 then
        return read_int(p, pos, len)
    end
    if b == 0xcb then
        if pos + 9 > len then
            return nil, "truncated"
        end
        return get_f64(p, pos + 1), pos + 9
    end
    if b == 0xca then
        if pos + 5 > len then
            return nil, "truncated"
        end
        return get_f32(p, pos + 1), pos + 5
    end
    if b == 0xc5 or b == 0xda then
        if pos + 3 > len then
            return nil, "truncated"
        end
        return get_str(p, pos + 3, len, be16(p, pos + 1))
    end
    if b == 0xc6 or b == 0xdb then
        if pos + 5 > len then
            return nil, "truncated"
        end
        return get_str(p, pos + 5, len, be32(p, pos + 1))
    end
    if b == 0xdc or b == 0xde then
        if pos + 3 > len then
            return nil, "truncated"
        end
        if b == 0xdc then
            return get_array(p, pos + 3, len, be16(p, pos + 1), level + 1)
        end
        return get_map(p, pos + 3, len, be16(p, pos + 1), level + 1)
    end
    if b == 0xdd or b == 0xdf then
        if pos + 5 > len then
            return nil, "truncated"
        end
        if b == 0xdd then
            return get_array(p, pos + 5, len, be32(p, pos + 1), level + 1)
        end
        return get_map(p, pos + 5, len, be32(p, pos + 1), level + 1)
    end
    if b == 0xd6 and p[pos + 1] == 1 then
        -- a borrowed string: its span's index
        if pos + 6 > len then
            return nil, "truncated"
        end
        local i = be32(p, pos + 2)
        if i >= nspans then
            return nil, "bad borrowed string"
        end
        return ffi_string(spans[i].data, spans[i].len), pos + 6
    end
    -- 0xc1 (never used), other ext types
    return nil, format("unsupported msgpack type 0x%02x", b)
end

-- Reads the header: returns n, k, pos or nil, reason.
local function get_header(p, len)
    local n, pos = read_int(p, 0, len)
    if n == nil then
        return nil, pos
    end
    if n < 0 or n > MAX_VALUES then
        return nil, "bad value count"
    end
    if pos >= len then
        return nil, "truncated"
    end
    local b = p[pos]
    local k
    if b >= 0x80 and b < 0x90 then
        k, pos = b - 0x80, pos + 1
    elseif b == 0xde then
        if pos + 3 > len then
            return nil, "truncated"
        end
        k, pos = be16(p, pos + 1), pos + 3
    elseif b == 0xdf then
        if pos + 5 > len then
            return nil, "truncated"
        end
        k, pos = be32(p, pos + 1), pos + 5
    else
        return nil, "expected a map"
    end
    if k > n then
        return nil, "more values than the count"
    end
    return n, k, pos
end

-- One (position, value) pair; returns position, value, pos or nil, reason.
local function get_pair(p, pos, len, n)
    local i
    i, pos = read_int(p, pos, len)
    if i == nil then
        return nil, pos
    end
    if i < 1 or i > n then
        return nil, "bad position"
    end
    local v
    v, pos = get_value(p, pos, len, 0)
    if v == nil then
        return nil, pos
    end
    return i, v, pos
end

-- Returns true, v1, ..., vn or nil, err. The payload borrows the strings
-- of the n_spans spans at span_ptr (cdata with data and len fields), which
-- are read only during this call.
function _M.results(ptr, len, span_ptr, n_spans)
    spans, nspans = span_ptr, n_spans or 0
    local p = ffi_cast(u8p_t, ptr)
    local n, k, pos = get_header(p, len)
    if n == nil then
        return nil, "bad payload: " .. k
    end

    if n == 1 then
        -- Hot path: no table.
        local v
        if k == 1 then
            local i
            i, v, pos = get_pair(p, pos, len, 1)
            if i == nil then
                return nil, "bad payload: " .. v
            end
        end
        if pos ~= len then
            return nil, "bad payload: trailing bytes"
        end
        return true, v
    end

    local t = new_tab(n, 0)
    local i, v
    for _ = 1, k do
        i, v, pos = get_pair(p, pos, len, n)
        if i == nil then
            return nil, "bad payload: " .. v
        end
        t[i] = v
    end
    if pos ~= len then
        return nil, "bad payload: trailing bytes"
    end
    return true, unpack(t, 1, n)
end

return _M
