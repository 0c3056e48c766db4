-- The hand-off benchmark, measured inside nginx: one request runs C light
-- threads that each hand the trivial task (bench_tasks.upper) to a variant
-- in a loop, until a shared count or a deadline is reached.
-- Answers JSON: counts, errors, the wall time, the CPU time the event-loop
-- thread spent, and a histogram of sampled round trips (64 buckets per
-- octave of nanoseconds, ~1%).
--
--   GET /handoff?variant=inline|rwt|tp|tpc|tpb|tpp|tpr&c=8&payload=16&ms=1000
--
-- The loop is a plain loop of calls, so that CPU time and tasks/s are the
-- variant's rather than the timing's: each light thread reads the clock
-- (round trip and deadline) around one call in SAMPLE_EVERY, drawn at
-- random (a fixed stride could keep hitting the same phase of a pattern),
-- when a call hands over one small string, and around every call otherwise
-- (where two clock reads and a histogram update are lost in the task's
-- cost).
--
-- tpb hands BATCH tasks at a time to push_tasks: one round trip (one
-- yield) for the batch, counted as BATCH tasks that each took it. tpc is
-- push_task on a pool that copies every string (thread_pool_zero_copy
-- off). tpp posts (post_task): its "round trip" is the post call, and the
-- cell ends once the pool has run every posted task, so that its tasks/s
-- counts tasks run; a full queue makes the poster sleep 1 ms. tpr is
-- push_task on a Rust pool whose handler does the same task
-- (bench/rust-upper): the same call, only the pool differs.

local ffi = require "ffi"
local cjson = require "cjson.safe"
local new_tab = require "table.new"
local tasks = require "bench_tasks"

local C = ffi.C
local floor = math.floor
local log = math.log
local random = math.random
local rep = string.rep
local spawn = ngx.thread.spawn
local wait = ngx.thread.wait
local run_worker_thread = ngx.run_worker_thread
local upper = tasks.upper
local encode = cjson.encode
local pairs = pairs
local pcall = pcall
local require = require
local tonumber = tonumber
local tostring = tostring
local type = type

-- Under names of their own: a Lua state keeps the first declaration of a
-- C name, and the shim may declare these functions with its own types.
ffi.cdef [[
typedef struct { long sec; long nsec; } bench_timespec_t;
int bench_clock_gettime(int clock_id, bench_timespec_t *ts) asm("clock_gettime");
typedef struct {
    long utime_sec, utime_usec, stime_sec, stime_usec;
    long other[14];
} bench_rusage_t;
int bench_getrusage(int who, bench_rusage_t *usage) asm("getrusage");
]]

local CLOCK_MONOTONIC = 1
local RUSAGE_THREAD = 1
local BUCKETS_PER_OCTAVE = 64
local K = BUCKETS_PER_OCTAVE / log(2)
-- A variant that keeps failing (e.g. "no available Lua vm") stops early
-- rather than spin on the event loop until the deadline.
local MAX_ERRORS = 1000
local MAX_C = 256
local MAX_MS = 120000
local MAX_COUNT = 10000000
local SAMPLE_EVERY = 16
local SMALL = 1024

local ts = ffi.new("bench_timespec_t")
local ru = ffi.new("bench_rusage_t")

local function now_ns()
    C.bench_clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.sec) * 1e9 + tonumber(ts.nsec)
end

-- CPU time (user + system) of the calling thread, the event loop, in µs.
local function loop_cpu_us()
    C.bench_getrusage(RUSAGE_THREAD, ru)
    return (tonumber(ru.utime_sec) + tonumber(ru.stime_sec)) * 1e6
           + tonumber(ru.utime_usec) + tonumber(ru.stime_usec)
end

local SIZES = { ["16"] = 16, ["512"] = 512, ["1024"] = 1024,
                ["65536"] = 65536, ["1048576"] = 1048576 }
local payloads = {}

-- 100 records of 10 string fields: 1,000 entries, two levels deep.
local function make_table()
    local t = new_tab(100, 0)
    for i = 1, 100 do
        local rec = new_tab(0, 10)
        for j = 1, 10 do
            rec["field" .. j] = "value " .. i .. "." .. j
        end
        t[i] = rec
    end
    return t
end

local function payload(name)
    local p = payloads[name]
    if p == nil then
        if name == "table" then
            p = make_table()
        elseif SIZES[name] then
            p = rep("a", SIZES[name])
        else
            return nil
        end
        payloads[name] = p
    end
    return p
end

-- resty.threadpool's pools by name, looked up on first use, and the pool
-- each variant calls.
local pools = {}
local POOL = { tp = "tp", tpc = "tpc", tpp = "tp", tpb = "tp", tpr = "tpr" }
local BATCH = 64
local batch_list = {}

-- The inline variant's last result: its next argument (the same size and
-- cost), so that the compiler cannot hoist the call out of the loop as it
-- would a call on the same string each time.
local inline_last

local callers = {
    inline = function(p)
        inline_last = upper(inline_last or p)
        return inline_last
    end,
    rwt = function(p)
        local ok, res = run_worker_thread("rwt", "bench_tasks", "upper", p)
        if not ok then
            return nil, res
        end
        return res
    end,
    tp = function(p)
        return pools.tp:push_task("upper", p)
    end,
    tpc = function(p)
        return pools.tpc:push_task("upper", p)
    end,
    tpr = function(p)
        return pools.tpr:push_task("upper", p)
    end,
    tpp = function(p)
        return pools.tp:post_task("upper", p)
    end,
    -- the batch's results, checked by the loop
    tpb = function(p)
        for i = 1, BATCH do
            local args = batch_list[i]
            if not args then
                args = { "upper" }
                batch_list[i] = args
            end
            args[2] = p
        end
        return pools.tp:push_tasks(batch_list)
    end,
}

-- How many tasks of a call's result came back whole: 1 or 0 for a single
-- task, up to BATCH for a batch.
local function one(v, ptype, plen)
    return type(v) == ptype and (ptype ~= "string" or #v == plen)
end

local function whole(variant, res, ptype, plen)
    if variant == "tpp" then
        return res == true and 1 or 0
    end
    if variant ~= "tpb" then
        return one(res, ptype, plen) and 1 or 0
    end
    if type(res) ~= "table" then
        return 0
    end
    local n = 0
    for i = 1, #res do
        if res[i][1] and one(res[i][2], ptype, plen) then
            n = n + 1
        end
    end
    return n
end

local function bad_request(msg)
    ngx.status = 400
    ngx.say(msg)
end

local function int_arg(name, default, lo, hi)
    local v = tonumber(ngx.var["arg_" .. name] or default)
    if not v or v ~= floor(v) or v < lo or v > hi then
        return nil
    end
    return v
end

local _M = {}

function _M.run()
    local variant = ngx.var.arg_variant
    local call = callers[variant]
    local c = int_arg("c", 1, 1, MAX_C)
    local ms = int_arg("ms", 1000, 1, MAX_MS)
    local max = int_arg("max", MAX_COUNT, 1, MAX_COUNT)
    local p = payload(ngx.var.arg_payload or "16")
    if not (call and c and ms and max and p) then
        return bad_request("bad arguments")
    end
    local name = POOL[variant]
    if name and not pools[name] then
        local ok, pool = pcall(function() return require("resty.threadpool")[name] end)
        if not ok then
            return bad_request(tostring(pool))
        end
        -- a lost task fails the cell after 10 s instead of hanging it
        pool:set_timeout(10)
        pools[name] = pool
    end

    local ptype, plen = type(p), type(p) == "string" and #p or 0
    inline_last = nil
    local every = (variant ~= "tpb" and plen > 0 and plen <= SMALL) and SAMPLE_EVERY or 1
    local hist = {}
    local done, failed = 0, 0
    local errors = {}
    local stop = false
    local cpu0 = loop_cpu_us()
    local started = now_ns()
    local deadline = started + ms * 1e6

    local function loop()
        while not stop do
            local t0
            if every == 1 or random(every) == 1 then
                t0 = now_ns()
            end
            local res, err = call(p)
            local n = whole(variant, res, ptype, plen)
            if t0 then
                local t1 = now_ns()
                if n > 0 then
                    local d = t1 - t0
                    local b = floor(log(d < 1 and 1 or d) * K)
                    hist[b] = (hist[b] or 0) + n
                end
                stop = stop or t1 >= deadline
            end
            done = done + n
            if variant == "tpp" and err == "queue full" then
                ngx.sleep(0.001)
            elseif n == 0 or (variant == "tpb" and n < BATCH) then
                local key = tostring(err or "unexpected result")
                errors[key] = (errors[key] or 0) + 1
                failed = failed + 1
                if failed >= MAX_ERRORS then
                    stop = true
                end
            end
            if done + failed >= max then
                stop = true
            end
        end
    end

    local threads = new_tab(c, 0)
    for i = 1, c do
        local th, err = spawn(loop)
        if not th then
            errors["spawn: " .. tostring(err)] = 1
            break
        end
        threads[i] = th
    end
    for i = 1, #threads do
        local ok, err = wait(threads[i])
        if not ok then
            local key = "light thread: " .. tostring(err)
            errors[key] = (errors[key] or 0) + 1
        end
    end
    if variant == "tpp" then
        -- until the pool has run what was posted
        local limit = now_ns() + 10e9
        while pools.tp:stats().in_flight > 0 and now_ns() < limit do
            ngx.sleep(0.001)
        end
    end
    local elapsed = now_ns() - started
    local cpu = loop_cpu_us() - cpu0

    local buckets = new_tab(64, 0)
    for b, n in pairs(hist) do
        buckets[#buckets + 1] = { b, n }
    end
    ngx.say(encode({
        variant = variant, c = c, payload = ngx.var.arg_payload or "16",
        ok = done, failed = failed, errors = errors, elapsed_ns = elapsed,
        loop_cpu_us = cpu, sample_every = every,
        buckets_per_octave = BUCKETS_PER_OCTAVE, hist = buckets,
    }))
end

return _M
