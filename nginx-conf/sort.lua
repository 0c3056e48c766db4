-- A CPU-heavy task: sort n pseudo-random numbers (the ngx_lua benchmark's
-- workload). The chunk does not use `...`, so it runs once per thread and
-- returns the task handler.
local random = math.random
local sort = table.sort
local new_tab = require "table.new"

return function(n, seed)
    math.randomseed(seed or 42)
    local t = new_tab(n, 0)
    for i = 1, n do
        t[i] = random()
    end
    sort(t)
    return n, t[1], t[n]
end
