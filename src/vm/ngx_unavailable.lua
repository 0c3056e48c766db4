-- The parts of the ngx API that need a request, a cosocket or the event loop
-- (OpenResty 0.10.23). In a pool thread each raises an error naming itself
-- rather than crashing or quietly giving nil. Functions raise when called,
-- not when read, so that a module that keeps `local sleep = ngx.sleep` can
-- still be required in a thread for its other functions.
local ngx = ...

local error = error
local pairs = pairs
local ipairs = ipairs
local rawset = rawset
local setmetatable = setmetatable

local function raise(name, level)
    error(name .. " is not available in thread pools", level + 1)
end

local function unavailable(name)
    return function()
        raise(name, 2)
    end
end

-- ngx.NAME or ngx.TABLE.NAME functions
local functions = {
    [""] = { "sleep", "say", "print", "exit", "redirect", "exec", "flush",
             "eof", "send_headers", "on_abort", "run_worker_thread" },
    req = { "append_body", "clear_header", "discard_body", "finish_body",
            "get_body_data", "get_body_file", "get_headers", "get_method",
            "get_post_args", "get_uri_args", "http_version", "init_body",
            "is_internal", "raw_header", "read_body", "set_body_data",
            "set_body_file", "set_header", "set_method", "set_uri",
            "set_uri_args", "socket", "start_time" },
    resp = { "get_headers" },
    location = { "capture", "capture_multi" },
    -- timers run on the event loop; their counts are its state
    timer = { "at", "every", "pending_count", "running_count" },
    thread = { "spawn", "wait", "kill" },
    socket = { "tcp", "udp", "stream", "connect" },
    -- the process table is updated by the event loop as workers come and go
    worker = { "pids" },
}

for tname, names in pairs(functions) do
    local t = ngx
    local prefix = "ngx."
    if tname ~= "" then
        t = ngx[tname] or {}
        ngx[tname] = t
        prefix = prefix .. tname .. "."
    end
    for _, name in ipairs(names) do
        t[name] = unavailable(prefix .. name)
    end
end

-- Tables of request data: reading or writing any field raises.
for _, tname in ipairs({ "var", "header", "arg" }) do
    local name = "ngx." .. tname
    ngx[tname] = setmetatable({}, {
        __index = function() raise(name, 2) end,
        __newindex = function() raise(name, 2) end,
    })
end

-- Values of the request: reading or setting ngx.NAME raises.
local values = {
    ctx = true, status = true, headers_sent = true, is_subrequest = true,
}

setmetatable(ngx, {
    __index = function(_, key)
        if values[key] then
            raise("ngx." .. key, 2)
        end
    end,
    __newindex = function(t, key, value)
        if values[key] then
            raise("ngx." .. key, 2)
        end
        rawset(t, key, value)
    end,
})
