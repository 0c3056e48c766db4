-- resty.threadpool: run Lua in the per-worker thread pools of the
-- ngx_threadpool module.
--
--   local tp = require "resty.threadpool"
--   local res, err = tp.upper_pool:push_task("foo")
--
-- The calling coroutine waits; the event loop keeps serving other requests.

local new_tab = require "table.new"

local get_phase = ngx.get_phase
local error = error
local getmetatable = getmetatable
local newproxy = newproxy
local worker_exiting = ngx.worker.exiting
local pcall = pcall
local rawset = rawset
local require = require
local setmetatable = setmetatable
local tostring = tostring
local type = type
local floor = math.floor

-- The module's C functions on this VM's stack (src/api/functions.rs).
local API_VERSION = 12
local core
do
    local ok, mod = pcall(require, "ngx_threadpool")
    if not ok then
        error("resty.threadpool: the ngx_threadpool module is not loaded "
              .. "(load_module it after ngx_http_lua_module)", 2)
    end
    if mod.version ~= API_VERSION then
        error("resty.threadpool: module API version " .. tostring(mod.version)
              .. ", this library needs " .. API_VERSION, 2)
    end
    core = mod
end
local c_push = core.push
local c_push_batch = core.push_batch
local c_post = core.post
local c_result = core.result
local c_results = core.results
local c_release = core.release
local c_reap = core.reap
local c_pool_id = core.pool_id
local c_stats = core.stats

local FFI_OK = 0
local FFI_DECLINED = -5
local FFI_BAD_CONTEXT = -101

local DEFAULT_TIMEOUT = 60      -- seconds
local MAX_TIMEOUT_MS = 2147483647

local function timeout_ms(seconds)
    -- seconds ~= seconds: NaN, which every comparison lets through
    if type(seconds) ~= "number" or seconds ~= seconds or seconds <= 0 then
        error("bad timeout: expected a number of seconds > 0", 3)
    end
    local ms = floor(seconds * 1000)
    if ms < 1 then
        return 1
    end
    if ms > MAX_TIMEOUT_MS then
        return MAX_TIMEOUT_MS
    end
    return ms
end

-- The caller's strings that arguments borrow (zero-copy) are anchored by
-- the module until the task ends; the strings of tasks whose caller
-- stopped waiting or went away are let go of at the next push, and, for
-- a worker that pushes nothing more, by this sentinel that no one holds:
-- its finalizer reaps once per collection cycle, then makes the next one.
local function reap_at_next_cycle()
    local sentinel = newproxy(true)
    getmetatable(sentinel).__gc = function()
        c_reap()
        if not worker_exiting() then
            reap_at_next_cycle()
        end
    end
end
reap_at_next_cycle()

local function bad_context(api)
    error(api .. ": API disabled in the context of " .. get_phase()
          .. " (use it in " .. core.yieldable .. ", or an ngx.thread of those)",
          3)
end

-- What a push that queued nothing returns (or raises, out of context).
local function refused(rc, err, api)
    if rc == FFI_DECLINED then
        return nil, "queue full"
    end
    if rc == FFI_BAD_CONTEXT then
        bad_context(api)
    end
    return nil, err
end

-- A push that queued its tasks returns once they are done (true: the
-- results, built by `result`) or its timeout passed (false, "timeout":
-- the late results are dropped when they arrive); it waits and yields in
-- the module, in one call. Else the code and message of a refusal.
local function waited(ok, err, result)
    if ok then
        return result()
    end
    c_release()
    return nil, err
end

-- `deadline`: whether the timeout is also the push's deadline, which the
-- module refuses at once ("overloaded") when the pool cannot finish the
-- tasks before it, and past which it starts none of them.
local function push(pool, ms, deadline, ...)
    local ok, err = c_push(pool.id, ms, deadline, ...)
    if type(ok) == "boolean" then
        return waited(ok, err, c_result)
    end
    return refused(ok, err, "push_task")
end

local function push_batch(pool, ms, deadline, list)
    if type(list) ~= "table" then
        error("bad list: expected a table of argument tables", 3)
    end
    local n = #list
    if n == 0 then
        return {}
    end
    local ok, err = c_push_batch(pool.id, ms, deadline, list, n)
    if type(ok) == "boolean" then
        return waited(ok, err, c_results)
    end
    return refused(ok, err, "push_tasks")
end

-- The counters of worker/stats.rs, in its order, then two histograms of
-- (buckets, sum in µs) with these upper bounds in seconds; the last one is
-- written as Prometheus writes it, so that cjson's defaults (which refuse
-- math.huge) encode the table.
local COUNTERS = { "threads", "busy", "queued", "pushed", "completed",
                   "errors", "rejected", "timed_out", "abandoned",
                   "cancelled", "overloaded", "expired" }
local BOUNDS = { 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, "+Inf" }
-- then the shadow counters (thread_pool_shadow), as shadow_<name>
local SHADOW = { "compared", "mismatched", "skipped" }
local SHADOW_AT = #COUNTERS + 2 * (#BOUNDS + 1)
-- then the estimates of deadline-aware admission, in µs, as seconds
local ESTIMATES = { "expected_wait", "run_estimate" }
local ESTIMATES_AT = SHADOW_AT + #SHADOW
local STATS_LEN = ESTIMATES_AT + #ESTIMATES

local function histogram(counters, offset)
    local buckets = new_tab(#BOUNDS, 0)
    local count = 0
    for i = 1, #BOUNDS do
        local n = counters[offset + i]
        buckets[i] = { le = BOUNDS[i], count = n }
        count = count + n
    end
    return { buckets = buckets, count = count,
             sum = counters[offset + #BOUNDS + 1] / 1e6 }
end

local Pool = {}
Pool.__index = Pool

-- A method called on something else than a pool (pool.push_task(...)):
-- only a pool has Pool as its metatable.
local function check_self(self, method)
    if getmetatable(self) ~= Pool then
        error("bad self: call it as pool:" .. method .. "(...)", 3)
    end
end

-- Runs the pool's handler with the given arguments in a pool thread and
-- returns its return values, or nil and an error.
function Pool.push_task(self, ...)
    check_self(self, "push_task")
    return push(self, self.timeout_ms, self.deadline, ...)
end

-- As push_task, with a timeout in seconds for this call, which is also
-- its deadline: nil, "overloaded" at once when the pool cannot finish it
-- in time.
function Pool.push_task_timeout(self, seconds, ...)
    check_self(self, "push_task_timeout")
    return push(self, timeout_ms(seconds), true, ...)
end

-- Runs one task per entry of list, an array of argument arrays, with one
-- yield for all of them: an array of { true, values... } or { false, err }
-- in the order of list, or nil and an error when nothing was queued
-- ("queue full" if they do not all fit).
function Pool.push_tasks(self, list)
    check_self(self, "push_tasks")
    return push_batch(self, self.timeout_ms, self.deadline, list)
end

-- As push_tasks, with a timeout in seconds for the whole batch, which is
-- also its deadline (see push_task_timeout).
function Pool.push_tasks_timeout(self, seconds, list)
    check_self(self, "push_tasks_timeout")
    return push_batch(self, timeout_ms(seconds), true, list)
end

-- Sets the default timeout in seconds of push_task on this pool, in this
-- worker (60 seconds to start with, or the pool's thread_pool_deadline,
-- which it then replaces as the default deadline).
function Pool.set_timeout(self, seconds)
    check_self(self, "set_timeout")
    self.timeout_ms = timeout_ms(seconds)
end

-- Queues a task whose result nobody takes: true, or nil and "queue full"
-- (or another error) at once. Never yields, needs no request: usable in
-- every phase, log and filters included. The handler's errors are logged
-- by the module and counted.
function Pool.post_task(self, ...)
    check_self(self, "post_task")
    local rc, err = c_post(self.id, ...)
    if rc == FFI_OK then
        return true
    end
    return refused(rc, err, "post_task")
end

-- This worker's counters of the pool: a table (see the README), or nil
-- and an error outside a worker process.
function Pool.stats(self)
    check_self(self, "stats")
    local counters = c_stats(self.id)
    if not counters or #counters ~= STATS_LEN then
        if get_phase() == "init_worker" then
            return nil, core.not_started
        end
        return nil, "no stats outside a worker process"
    end
    local t = new_tab(0, #COUNTERS + #SHADOW + #ESTIMATES + 3)
    for i = 1, #COUNTERS do
        t[COUNTERS[i]] = counters[i]
    end
    for i = 1, #SHADOW do
        t["shadow_" .. SHADOW[i]] = counters[SHADOW_AT + i]
    end
    for i = 1, #ESTIMATES do
        t[ESTIMATES[i]] = counters[ESTIMATES_AT + i] / 1e6
    end
    t.in_flight = t.queued + t.busy
    t.wait = histogram(counters, #COUNTERS)
    t.run = histogram(counters, #COUNTERS + #BOUNDS + 1)
    return t
end

local _M = { _VERSION = "0.1.0" }

-- Whether the caller of the running task gave up: in a pool thread, the
-- module's own resty.threadpool answers (src/vm/cancel.lua); here, on the
-- event loop, no task runs, so a handler shared with an inline fallback
-- runs unchanged.
function _M.cancelled()
    return false
end

return setmetatable(_M, {
    __index = function(t, name)
        if type(name) ~= "string" then
            return nil
        end
        local id, deadline_ms = c_pool_id(name)
        if id < 0 then
            error("resty.threadpool: no thread pool \"" .. name
                  .. "\" with a thread_pool_process_by_lua handler", 2)
        end
        -- thread_pool_deadline: push_task's timeout, and a deadline
        local pool = setmetatable({ name = name, id = id,
                                    timeout_ms = deadline_ms
                                                 or DEFAULT_TIMEOUT * 1000,
                                    deadline = deadline_ms ~= nil },
                                  Pool)
        rawset(t, name, pool)
        return pool
    end,
})
