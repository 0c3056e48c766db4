-- The `ngx` table of a pool thread. Rust passes in its primitives; what can
-- be written in Lua is written here.
local prim = ...

local type = type
local tostring = tostring
local select = select
local concat = table.concat
local getinfo = debug.getinfo
local getmetatable = getmetatable
local error = error

local log_write = prim.log_write
local null = prim.null

local ngx = {
    null = null,

    OK = 0, ERROR = -1, AGAIN = -2, DONE = -4, DECLINED = -5,

    STDERR = 0, EMERG = 1, ALERT = 2, CRIT = 3, ERR = 4, WARN = 5,
    NOTICE = 6, INFO = 7, DEBUG = 8,

    HTTP_GET = 2, HTTP_HEAD = 4, HTTP_POST = 8, HTTP_PUT = 16,
    HTTP_DELETE = 32, HTTP_MKCOL = 64, HTTP_COPY = 128, HTTP_MOVE = 256,
    HTTP_OPTIONS = 512, HTTP_PROPFIND = 1024, HTTP_PROPPATCH = 2048,
    HTTP_LOCK = 4096, HTTP_UNLOCK = 8192, HTTP_PATCH = 16384,
    HTTP_TRACE = 32768,

    HTTP_CONTINUE = 100, HTTP_SWITCHING_PROTOCOLS = 101, HTTP_OK = 200,
    HTTP_CREATED = 201, HTTP_ACCEPTED = 202, HTTP_NO_CONTENT = 204,
    HTTP_PARTIAL_CONTENT = 206, HTTP_SPECIAL_RESPONSE = 300,
    HTTP_MOVED_PERMANENTLY = 301, HTTP_MOVED_TEMPORARILY = 302,
    HTTP_SEE_OTHER = 303, HTTP_NOT_MODIFIED = 304,
    HTTP_TEMPORARY_REDIRECT = 307, HTTP_PERMANENT_REDIRECT = 308,
    HTTP_BAD_REQUEST = 400, HTTP_UNAUTHORIZED = 401,
    HTTP_PAYMENT_REQUIRED = 402, HTTP_FORBIDDEN = 403, HTTP_NOT_FOUND = 404,
    HTTP_NOT_ALLOWED = 405, HTTP_NOT_ACCEPTABLE = 406,
    HTTP_REQUEST_TIMEOUT = 408, HTTP_CONFLICT = 409, HTTP_GONE = 410,
    HTTP_UPGRADE_REQUIRED = 426, HTTP_TOO_MANY_REQUESTS = 429,
    HTTP_CLOSE = 444, HTTP_ILLEGAL = 451,
    HTTP_INTERNAL_SERVER_ERROR = 500, HTTP_METHOD_NOT_IMPLEMENTED = 501,
    HTTP_BAD_GATEWAY = 502, HTTP_SERVICE_UNAVAILABLE = 503,
    HTTP_GATEWAY_TIMEOUT = 504, HTTP_VERSION_NOT_SUPPORTED = 505,
    HTTP_INSUFFICIENT_STORAGE = 507,
}

-- One argument of ngx.log/print as lua-nginx-module formats it.
local function log_piece(v, i, fname)
    local t = type(v)
    if t == "string" then
        return v
    elseif t == "number" then
        return tostring(v)
    elseif t == "nil" then
        return "nil"
    elseif t == "boolean" then
        return v and "true" or "false"
    elseif v == null then
        return "null"
    elseif t == "table" then
        local mt = getmetatable(v)
        if mt and mt.__tostring then
            return tostring(v)
        end
        error("bad argument #" .. i .. " to '" .. fname
              .. "' (expected table to have __tostring metamethod)", 3)
    end
    error("bad argument #" .. i .. " to '" .. fname
          .. "' (expected string, number, boolean, or nil)", 3)
end

local function emit(level, first, fname, ...)
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do
        parts[i] = log_piece((select(i, ...)), i + first, fname)
    end
    local info = getinfo(3, "Sl")
    local where = info and (info.short_src .. ":" .. (info.currentline or 0) .. ": ") or ""
    log_write(level, where, concat(parts))
end

function ngx.log(level, ...)
    if type(level) ~= "number" or level < 0 or level > 8 then
        error("bad argument #1 to 'log' (bad log level)", 2)
    end
    emit(level, 1, "log", ...)
end

local function print(...)
    emit(6, 0, "print", ...)
end

return ngx, print
