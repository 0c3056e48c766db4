-- The mechanisms section of make bench (bench/run.py): figures of two
-- mechanisms whose point is speed, which the tests check only as
-- behaviour, on a pool `mech` of one thread whose handler is `task`.
--
--   GET /mech/poll?n=2000      a caller pushing n trivial tasks one after
--                              another: the event loop's sleeps (its
--                              voluntary context switches) after 100 to warm
--                              up; run.py counts the pool thread's writes
--   GET /mech/cancel?trials=20 how long after its caller's timeout returned
--                              a spinning handler saw cancelled()
--   GET /mech/cost?n=10000000  cancelled()'s cost per call in a
--                              JIT-compiled loop, in the thread's CPU time
--   GET /mech/refuse?n=20000   the event loop's CPU time in each of n
--                              push_task_timeout calls that deadline-aware
--                              admission refuses ("overloaded")
--
-- Each answers JSON.

local ffi = require "ffi"
local cjson = require "cjson.safe"

local C = ffi.C
local encode = cjson.encode
local tonumber = tonumber

-- Under names of their own: a Lua state keeps the first declaration of a
-- C name.
ffi.cdef [[
typedef struct { long sec; long nsec; } bench_mech_timespec_t;
int bench_mech_clock_gettime(int clock_id, bench_mech_timespec_t *ts) asm("clock_gettime");
int bench_mech_usleep(unsigned int usec) asm("usleep");
]]

local CLOCK_MONOTONIC = 1
local CLOCK_THREAD_CPUTIME_ID = 3
-- A spinning task gives up after this many seconds without seeing the flag.
local SPIN_LIMIT = 5
local TIMEOUT = 0.02

local ts = ffi.new("bench_mech_timespec_t")

local function clock(id)
    C.bench_mech_clock_gettime(id, ts)
    return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end

local _M = {}

-- The pool's side: the task's name, then its arguments.
local tasks = {}

function tasks.inc(x)
    return x + 1
end

function tasks.sleep(us)
    C.bench_mech_usleep(us)
end

-- Spins until cancelled (or SPIN_LIMIT); records when it saw the flag
-- (CLOCK_MONOTONIC, -1: never) under `key`.
function tasks.spin(key)
    local cancelled = require("resty.threadpool").cancelled
    local deadline = clock(CLOCK_MONOTONIC) + SPIN_LIMIT
    local seen = -1
    while true do
        local t = clock(CLOCK_MONOTONIC)
        if cancelled() then
            seen = t
            break
        end
        if t >= deadline then
            break
        end
    end
    ngx.shared.bench_mech:set(key, seen)
end

-- n calls of cancelled() in a loop: this thread's CPU time per call (ns).
function tasks.cost(n)
    local cancelled = require("resty.threadpool").cancelled
    local seen = 0
    local t0 = clock(CLOCK_THREAD_CPUTIME_ID)
    for _ = 1, n do
        if cancelled() then
            seen = seen + 1
        end
    end
    return (clock(CLOCK_THREAD_CPUTIME_ID) - t0) / n * 1e9, seen
end

function _M.task(name, ...)
    return tasks[name](...)
end

-- The event loop's side.
local function pool()
    return require("resty.threadpool").mech
end

-- This process's voluntary context switches: its main thread, the event
-- loop, sleeping in epoll_wait.
local function sleeps()
    local f = assert(io.open("/proc/self/status"))
    local s = f:read("*a")
    f:close()
    return tonumber(s:match("\nvoluntary_ctxt_switches:%s*(%d+)"))
end

function _M.poll()
    local n = tonumber(ngx.var.arg_n) or 2000
    local mech = pool()
    -- the poll adapts to how soon completions come: warm it
    for i = 1, 100 do
        assert(mech:push_task("inc", i) == i + 1)
    end
    local before = sleeps()
    for i = 1, n do
        local res, err = mech:push_task("inc", i)
        if res ~= i + 1 then
            ngx.status = 500
            ngx.say(encode({ error = "task " .. i .. ": " .. tostring(res) .. " " .. tostring(err) }))
            return
        end
    end
    ngx.say(encode({ tasks = n, sleeps = sleeps() - before }))
end

function _M.cancel()
    local trials = tonumber(ngx.var.arg_trials) or 20
    local dict = ngx.shared.bench_mech
    local late, missed = {}, 0
    -- a plain timeout, not a deadline: admission, by the run estimate of
    -- the refusals' tasks, could refuse a push while the last spin ends
    local mech = pool()
    mech:set_timeout(TIMEOUT)
    for i = 1, trials do
        local key = "spin" .. i
        dict:delete(key)
        local _, err = mech:push_task("spin", key)
        local gaveup = clock(CLOCK_MONOTONIC)
        assert(err == "timeout", err)
        local seen
        for _ = 1, (SPIN_LIMIT + 1) * 1000 do
            seen = dict:get(key)
            if seen then
                break
            end
            ngx.sleep(0.001)
        end
        if seen and seen >= 0 then
            late[#late + 1] = (seen - gaveup) * 1e6
        else
            -- never taken (skipped), or never seen
            missed = missed + 1
        end
    end
    mech:set_timeout(60)
    ngx.say(encode({ trials = trials, late_us = late, missed = missed }))
end

-- The refusals: the pool's one thread learns a run time of REFUSE_US,
-- then REFUSE_QUEUED tasks wait (an expected wait of ~0.6 s), so that a
-- push with a deadline of REFUSE_DEADLINE is refused at once. The calls
-- do not yield: n of them must end before the queue drains below it.
local REFUSE_US = 50000
local REFUSE_QUEUED = 12
local REFUSE_DEADLINE = 0.45

function _M.refuse()
    local n = tonumber(ngx.var.arg_n) or 20000
    local mech = pool()
    for _ = 1, 3 do
        mech:push_task("sleep", REFUSE_US)
    end
    local waiting = {}
    for i = 1, REFUSE_QUEUED do
        waiting[i] = ngx.thread.spawn(mech.push_task, mech, "sleep", REFUSE_US)
    end
    local us, other = {}, {}
    for i = 1, n do
        local t0 = clock(CLOCK_THREAD_CPUTIME_ID)
        local ok, err = mech:push_task_timeout(REFUSE_DEADLINE, "inc", i)
        us[#us + 1] = (clock(CLOCK_THREAD_CPUTIME_ID) - t0) * 1e6
        if ok or err ~= "overloaded" then
            local k = tostring(err)
            other[k] = (other[k] or 0) + 1
        end
    end
    for i = 1, REFUSE_QUEUED do
        ngx.thread.wait(waiting[i])
    end
    table.sort(us)
    ngx.say(encode({ calls = n, other = other, p50_us = us[math.ceil(n * 0.5)],
                     p99_us = us[math.ceil(n * 0.99)], max_us = us[n] }))
end

function _M.cost()
    local per_ns, seen = pool():push_task("cost", tonumber(ngx.var.arg_n) or 10000000)
    ngx.say(encode({ ns = per_ns, seen = seen }))
end

return _M
