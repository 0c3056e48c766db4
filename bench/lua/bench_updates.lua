-- The updates section of make bench (bench/run.py): live updates of the
-- pool `upd` (docs/updates.md) while wrk keeps each of its threads busy.
--
-- The pool's side:
--   task(ms, kind)        runs `ms` milliseconds, sleeping (usleep) or
--                         spinning on the clock; returns the update its
--                         thread's state was at when it started and when
--                         it ended (the same, or the update split the task)
--   apply(n, strings)     the update chunk: a new state, update n and the
--                         table of strings given, replacing the last
-- The event loop's (each answers JSON but work):
--   GET /upd/work?ms=5&kind=sleep   one task: 200, or 503 and the failure
--                                   counted in bench_errors (/errors)
--   GET /upd/update?n=N&wait=S[&strings=K][&code=1][&dry=1]
--                                   update N with K strings (a rule set),
--                                   with new handler code, waiting up to S
--                                   seconds for every thread of every
--                                   worker; dry: all but the update. The
--                                   caller's time in update_opts
--   GET /upd/cost?n=N&from=V[&strings=K]
--                                   N updates (V+1 to V+N) without waiting,
--                                   one every 2 ms: the event loop's CPU
--                                   time in each call

local ffi = require "ffi"
local cjson = require "cjson.safe"

local C = ffi.C
local encode = cjson.encode
local format = string.format
local tonumber = tonumber
local sort = table.sort

-- Under names of their own: a Lua state keeps the first declaration of a
-- C name.
ffi.cdef [[
typedef struct { long sec; long nsec; } bench_upd_timespec_t;
int bench_upd_clock_gettime(int clock_id, bench_upd_timespec_t *ts) asm("clock_gettime");
int bench_upd_usleep(unsigned int usec) asm("usleep");
]]

local CLOCK_MONOTONIC = 1
local CLOCK_THREAD_CPUTIME_ID = 3
-- The gap between two calls of /upd/cost, in seconds.
local COST_GAP = 0.002
-- The handler chunk an update with code=1 sets: the same task, its text
-- changed by the update's number so that each is new code.
local CODE = "return require('bench_updates').task -- update "

local ts = ffi.new("bench_upd_timespec_t")

local function clock(id)
    C.bench_upd_clock_gettime(id, ts)
    return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end

local _M = {}

-- ---- the pool's side ------------------------------------------------------

-- This thread's state, which each update replaces.
local state = { n = 0 }

function _M.apply(n, strings)
    state = { n = n, strings = strings }
end

function _M.task(ms, kind)
    local at_start = state.n
    if kind == "spin" then
        local deadline = clock(CLOCK_MONOTONIC) + ms / 1000
        while clock(CLOCK_MONOTONIC) < deadline do end
    else
        C.bench_upd_usleep(ms * 1000)
    end
    return at_start, state.n
end

-- ---- the event loop's -------------------------------------------------------

local pool
local function upd()
    if not pool then
        pool = require("resty.threadpool").upd
        pool:set_timeout(10)
    end
    return pool
end

-- A rule set of k strings of ~60 bytes, made once per size.
local rule_sets = {}
local function rules(k)
    if k <= 0 then
        return nil
    end
    local t = rule_sets[k]
    if not t then
        t = {}
        for i = 1, k do
            t[i] = format("rule %05d: (?i)\\b(union|select)\\s+[a-z_]+\\s+from\\s+t_%d",
                          i, i)
        end
        rule_sets[k] = t
    end
    return t
end

local function fail(err)
    ngx.shared.bench_errors:incr("upd: " .. tostring(err), 1, 0)
    ngx.status = 503
    ngx.say(err)
end

function _M.work()
    local a, b = upd():push_task(tonumber(ngx.var.arg_ms) or 5, ngx.var.arg_kind)
    if a == nil then
        return fail(b)
    end
    if a ~= b then
        return fail("a task saw two updates: " .. a .. " then " .. b)
    end
    ngx.say(a)
end

function _M.update()
    local args = ngx.req.get_uri_args()
    local n = tonumber(args.n) or 0
    local strings = rules(tonumber(args.strings) or 0)
    local opts = { wait = tonumber(args.wait),
                   code = args.code and (CODE .. n) or nil }
    local t0 = clock(CLOCK_MONOTONIC)
    local version, err = n, nil
    if not args.dry then
        version, err = upd():update_opts(opts, n, strings)
    end
    local t1 = clock(CLOCK_MONOTONIC)
    ngx.say(encode({ version = version, err = err, wall_us = (t1 - t0) * 1e6,
                     worker = ngx.worker.id(), pid = ngx.worker.pid() }))
end

function _M.cost()
    local n = tonumber(ngx.var.arg_n) or 100
    local from = tonumber(ngx.var.arg_from) or 0
    local strings = rules(tonumber(ngx.var.arg_strings) or 0)
    local p = upd()
    local us, failed, last = {}, 0, nil
    for i = 1, n do
        local c0 = clock(CLOCK_THREAD_CPUTIME_ID)
        local version, err = p:update(from + i, strings)
        us[i] = (clock(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e6
        if not version then
            failed = failed + 1
            last = err
        end
        ngx.sleep(COST_GAP)
    end
    sort(us)
    local sum = 0
    for i = 1, n do
        sum = sum + us[i]
    end
    ngx.say(encode({ calls = n, failed = failed, err = last, mean_us = sum / n,
                     p50_us = us[math.ceil(n * 0.5)], p99_us = us[math.ceil(n * 0.99)],
                     max_us = us[n], worker = ngx.worker.id() }))
end

return _M
