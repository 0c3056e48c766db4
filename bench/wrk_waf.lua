-- wrk script of the WAF cell (bench/run.py): sends the requests of
-- $BENCH_WAF_REQUESTS (a Lua file returning { { method, path, headers,
-- body }, ... }, written by run.py) in turn, and prints wrk_json.lua's
-- statistics ($BENCH_WRK_JSON) at the end.

dofile(os.getenv("BENCH_WRK_JSON"))

local requests = dofile(os.getenv("BENCH_WAF_REQUESTS"))
local formatted = {}
local i = 0

request = function()
    i = i % #requests + 1
    local f = formatted[i]
    if not f then
        local r = requests[i]
        f = wrk.format(r[1], r[2], r[3], r[4])
        formatted[i] = f
    end
    return f
end
