-- The benchmark's tasks, one code for the three variants: called inline on
-- the event loop, by ngx.run_worker_thread("rwt", "bench_tasks", name, ...)
-- in its VMs, and through `call` by the push_task pool's handler.

local pairs = pairs
local require = require
local type = type
local upper = string.upper

local _M = {}

-- The trivial task: a string uppercased; a table copied with every string
-- in it uppercased (keys kept), so a table payload travels both ways too.
local function upper_value(v)
    local tv = type(v)
    if tv == "string" then
        return upper(v)
    end
    if tv == "table" then
        local t = {}
        for k, x in pairs(v) do
            t[k] = upper_value(x)
        end
        return t
    end
    return v
end

_M.upper = upper_value

-- CPU-heavy seed workload: nginx-conf/sort.lua returns the sort function.
function _M.sort(n)
    return require("sort")(n)
end

-- Optional seed workload: nginx-conf/waf.lua (when present) returns a
-- function scanning a request table {method, uri, args, headers} with the
-- rules of waf_rules.lua. `true` first: a verdict of nil is no failure.
function _M.waf(req)
    return true, require("waf")(req)
end

-- The push_task pool's handler: the task's name, then its arguments (the
-- same hand-off shape as run_worker_thread's module and function names).
function _M.call(name, ...)
    return _M[name](...)
end

return _M
