-- resty.threadpool: run Lua in the per-worker thread pools of the
-- ngx_threadpool module.
--
--   local tp = require "resty.threadpool"
--   local res, err = tp.upper_pool:push_task("foo")
--
-- The calling coroutine waits; the event loop keeps serving other requests.

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
local huge = math.huge
local min = math.min
local now = ngx.now
local sleep = ngx.sleep
local update_time = ngx.update_time

-- The module's C functions on this VM's stack (src/api/).
local API_VERSION = 16
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
local c_push_stream = core.push_stream
local c_read = core.read
local c_close = core.close
local c_write = core.write
local c_close_write = core.close_write
local c_update = core.update
local c_update_state = core.update_state

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

-- An absolute deadline (push_task_until): seconds since the epoch, as
-- ngx.now() and ngx.req.start_time() give them. The module counts the
-- time left to it by the precise clock; one already past is refused
-- there ("overloaded"). Further than the longest timeout is a mistake
-- (milliseconds for seconds, say), not a wish to wait 24 days.
local MAX_AHEAD = MAX_TIMEOUT_MS / 1000

local function deadline_at(at)
    if type(at) ~= "number" or at ~= at or at < 0 or at == huge then
        error("bad deadline: expected seconds since the epoch "
              .. "(ngx.req.start_time() + seconds, ngx.now() + seconds)", 3)
    end
    if at - now() > MAX_AHEAD then
        error("bad deadline: more than " .. MAX_AHEAD
              .. " seconds ahead (seconds since the epoch expected)", 3)
    end
    return at
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

-- `deadline`: whether the timeout is also the push's deadline, or the
-- deadline itself in seconds since the epoch (the timeout is then the
-- time left to it, at most `ms`); the module refuses at once
-- ("overloaded") a push the pool cannot finish before it, and past it
-- starts none of the tasks.
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

local Pool = {}
Pool.__index = Pool

-- A stream (push_stream): read by the coroutine that pushed it.
local Stream = {}
Stream.__index = Stream

-- read's first value (src/api/streams.rs): a chunk follows, or the end.
local READ_CHUNK = 1
local READ_DONE = 2
local MAX_CHUNKS = 65536

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

-- As push_task, with a deadline in seconds since the epoch, gRPC's kind:
-- pool:push_task_until(ngx.req.start_time() + 0.45, ...) counts the time
-- the request spent before the push; nil, "overloaded" at once when the
-- pool cannot finish it in time or the deadline has passed.
function Pool.push_task_until(self, at, ...)
    check_self(self, "push_task_until")
    return push(self, MAX_TIMEOUT_MS, deadline_at(at), ...)
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

-- As push_tasks, with a deadline in seconds since the epoch for the whole
-- batch (see push_task_until).
function Pool.push_tasks_until(self, at, list)
    check_self(self, "push_tasks_until")
    return push_batch(self, MAX_TIMEOUT_MS, deadline_at(at), list)
end

-- What a stream's read or write returns for what its C function gave
-- (the module's code, then values): a chunk; at the end (s.done), the
-- handler's return values or nil and its error; true once written; after
-- a wait, the call again (true) or the timeout, which cancels the handler
-- (false); else nil and the message. `chunk` is write's, nil for a read.
local function stream_result(s, api, ms, chunk, rc, ...)
    if rc == READ_CHUNK then
        return ...
    end
    if rc == READ_DONE then
        s.done = true
        return ...
    end
    if rc == FFI_OK then
        return true
    end
    if rc == true then
        if api == "read" then
            return stream_result(s, api, ms, nil, c_read(s.id, ms))
        end
        return stream_result(s, api, ms, chunk, c_write(s.id, ms, true, chunk))
    end
    if rc == false then
        s.done = true
        c_close(s.id, true)
        return nil, ...
    end
    if rc == FFI_BAD_CONTEXT then
        bad_context(api)
    end
    return nil, ...
end

local function push_stream(pool, chunks, ...)
    local id, err = c_push_stream(pool.id, chunks, ...)
    if type(id) == "number" and id > 0 then
        return setmetatable({ id = id, done = false,
                              timeout_ms = pool.timeout_ms }, Stream)
    end
    return refused(id, err, "push_stream")
end

-- Runs the pool's handler with the given arguments in a pool thread as a
-- stream: its chunks (resty.threadpool's send() in the handler) come with
-- s:read(), at most the pool's thread_pool_stream_chunks unread, then its
-- return values. Returns the stream at once, or nil and an error.
function Pool.push_stream(self, ...)
    check_self(self, "push_stream")
    return push_stream(self, 0, ...)
end

-- As push_stream, with options: chunks (the most unread chunks, 1 to
-- 65536) and timeout (the default of each read, in seconds).
function Pool.push_stream_opts(self, opts, ...)
    check_self(self, "push_stream_opts")
    if type(opts) ~= "table" then
        error("bad opts: expected a table", 2)
    end
    -- 0 is the C function's "the pool's bound", which an absent
    -- opts.chunks gives; written out, it is refused as the directive
    -- refuses it.
    local chunks = opts.chunks
    if chunks == nil then
        chunks = 0
    elseif type(chunks) ~= "number" or chunks ~= floor(chunks)
           or chunks < 1 or chunks > MAX_CHUNKS then
        error("bad opts.chunks: expected a whole number from 1 to "
              .. MAX_CHUNKS, 2)
    end
    local s, err = push_stream(self, chunks, ...)
    if s and opts.timeout ~= nil then
        s.timeout_ms = timeout_ms(opts.timeout)
    end
    return s, err
end

local function check_stream(s, method)
    if getmetatable(s) ~= Stream then
        error("bad self: call it as stream:" .. method .. "(...)", 3)
    end
end

-- The next chunk the handler sent, in order, waiting for it at most
-- timeout seconds (the stream's default if nil); once every chunk was
-- read, the handler's return values (or nil and its error), and s.done
-- is true. A timeout gives nil, "timeout" and cancels the handler.
function Stream.read(self, seconds)
    check_stream(self, "read")
    if self.done then
        return nil, "stream closed"
    end
    local ms = self.timeout_ms
    if seconds ~= nil then
        ms = timeout_ms(seconds)
    end
    return stream_result(self, "read", ms, nil, c_read(self.id, ms))
end

-- Writes one chunk (any value but nil that an argument may be) to the
-- handler, which takes it with receive(): true, or nil and an error. At
-- most the stream's bound of chunks wait unread: then the write waits for
-- room (at most the stream's timeout, after which the handler is
-- cancelled), or, with nowait, fails at once with "stream input full".
function Stream.write(self, chunk, nowait)
    check_stream(self, "write")
    -- as Lua numbers a method's arguments: the chunk is #1 (the C
    -- function, which also takes the id and the wait, says #4)
    if chunk == nil then
        error("bad argument #1 to 'write' (a chunk expected, got nil)", 2)
    end
    if self.done then
        return nil, "stream closed"
    end
    local ms = self.timeout_ms
    return stream_result(self, "write", ms, chunk,
                         c_write(self.id, ms, not nowait, chunk))
end

-- The last chunk was written: the handler's receive() gives nil after the
-- chunks.
function Stream.close_write(self)
    check_stream(self, "close_write")
    if not self.done then
        c_close_write(self.id)
    end
end

-- Lets go of the stream before its end: a running handler is cancelled
-- (its send() fails at once) and unread chunks are dropped.
function Stream.close(self)
    check_stream(self, "close")
    if not self.done then
        self.done = true
        c_close(self.id, false)
    end
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

-- How long an update's caller sleeps between looks at the threads that
-- applied it: first briefly (most updates are applied within a task's
-- run), then at most UPDATE_POLL_MAX.
local UPDATE_POLL_MIN = 0.001   -- seconds
local UPDATE_POLL_MAX = 0.01

-- Waits, sleeping (a coroutine wait), until every thread of every
-- worker has applied update `version` or failed it, or `seconds` passed.
local function wait_update(pool, version, seconds)
    update_time()
    local deadline = now() + seconds
    local delay = UPDATE_POLL_MIN
    while true do
        local applied, failed, threads, err = c_update_state(pool.id, version)
        if applied + failed >= threads then
            if failed == 0 then
                return version
            end
            return nil, "update " .. version .. " failed in " .. failed
                        .. " of " .. threads .. " threads (" .. applied
                        .. " applied it; the others keep their version): "
                        .. tostring(err)
        end
        update_time()
        if now() >= deadline then
            return nil, "timeout: " .. applied .. " of " .. threads
                        .. " threads applied update " .. version
                        .. (failed > 0 and (", " .. failed .. " failed: "
                                            .. tostring(err)) or "")
        end
        sleep(delay)
        delay = min(delay * 2, UPDATE_POLL_MAX)
    end
end

-- The pool's next update in every worker, with `...` as its arguments
-- (the pool's update chunk or Rust handler applies them): its version,
-- or nil and why not. Every thread applies it between two tasks; this
-- does not wait for them (see update_opts).
function Pool.update(self, ...)
    check_self(self, "update")
    return c_update(self.id, nil, false, ...)
end

-- update with options: `code`, a new handler chunk (Lua pools), built in
-- each thread, and `wait`, the seconds to wait for every thread of every
-- worker to apply the update: then the version once they all have, or
-- nil and the error and counts of a failure, or of the timeout.
function Pool.update_opts(self, opts, ...)
    check_self(self, "update_opts")
    if type(opts) ~= "table" then
        error("bad opts: expected a table", 2)
    end
    local code, wait = opts.code, opts.wait
    if code ~= nil and type(code) ~= "string" then
        error("bad opts.code: expected a string", 2)
    end
    if wait ~= nil and (type(wait) ~= "number" or wait ~= wait
                        or wait <= 0) then
        error("bad opts.wait: expected a number of seconds > 0", 2)
    end
    local version, err = c_update(self.id, code, wait ~= nil, ...)
    if version == FFI_BAD_CONTEXT then
        bad_context("update_opts with wait")
    end
    if not version or not wait then
        return version, err
    end
    return wait_update(self, version, wait)
end

-- This worker's counters of the pool: a table keyed by name, built by the
-- module from its one table of them (src/stats/counters.rs; see
-- docs/lua-api.md), or nil and an error outside a worker process.
function Pool.stats(self)
    check_self(self, "stats")
    local t = c_stats(self.id)
    if not t then
        if get_phase() == "init_worker" then
            return nil, core.not_started
        end
        return nil, "no stats outside a worker process"
    end
    t.in_flight = t.queued + t.busy
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
