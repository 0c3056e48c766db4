-- The event-loop side of the example WAF (waf.lua): what it is shown of a
-- request, and the answer to a blocked one.
--
--   local waf_http = require "waf_http"
--   local req = waf_http.request()       -- in access or content
--   local blocked = scan(req)            -- waf.lua, inline or in a pool
--   waf_http.enforce(blocked)            -- 403 with the rule ids if blocked

local ngx = ngx
local concat = table.concat
local find = string.find
local match = string.match
local io_open = io.open
local read_body = ngx.req.read_body
local get_body_data = ngx.req.get_body_data
local get_body_file = ngx.req.get_body_file
local get_uri_args = ngx.req.get_uri_args
local get_headers = ngx.req.get_headers
local unescape_uri = ngx.unescape_uri

local MAX_ARGS = 100
local MAX_HEADERS = 100

local _M = {}

local function body()
    read_body()
    local data = get_body_data()
    if not data then
        -- larger than client_body_buffer_size: in a file, at most
        -- client_max_body_size
        local path = get_body_file()
        local f = path and io_open(path, "rb")
        if not f then
            return nil
        end
        data = f:read("*a")
        f:close()
    end
    local ctype = ngx.var.content_type
    if ctype and find(ctype, "application/x-www-form-urlencoded", 1, true) then
        return unescape_uri(data)
    end
    return data
end

-- The request as waf.lua scans it: the path and the form body decoded once
-- (not normalized: "/a/../b" stays as sent), arguments and headers as
-- nginx parsed them.
function _M.request()
    return {
        uri = unescape_uri(match(ngx.var.request_uri, "^[^?]*")),
        args = get_uri_args(MAX_ARGS),
        headers = get_headers(MAX_HEADERS),
        body = body(),
    }
end

-- Ends the request with 403 and the ids of the matched rules, if any.
function _M.enforce(blocked)
    if not blocked then
        return
    end
    ngx.status = ngx.HTTP_FORBIDDEN
    ngx.header["Content-Type"] = "text/plain"
    ngx.say("blocked by rules ", concat(blocked, " "))
    return ngx.exit(ngx.HTTP_OK)
end

return _M
