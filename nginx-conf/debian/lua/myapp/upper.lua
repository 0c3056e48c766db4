-- /etc/nginx/lua/myapp/upper.lua: one handler for a pool thread and for
-- the event loop. It uses only the request-free API both places offer.
local get_phase = ngx.get_phase

local _M = {}

-- Returns s in capitals and where it ran: "thread_pool" in a pool
-- thread, the request's phase ("content") on the event loop.
function _M.upper(s)
    return s:upper(), get_phase()
end

return _M
