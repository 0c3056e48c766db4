-- resty.threadpool: run Lua in the per-worker thread pools of the
-- ngx_threadpool module.
--
--   local tp = require "resty.threadpool"
--   local res, err = tp.upper_pool:push_task("foo")
--
-- The calling coroutine waits; the event loop keeps serving other requests.

local ffi = require "ffi"
local base = require "resty.core.base"
local buffer = require "string.buffer"
local new_tab = require "table.new"
local codec = require "resty.threadpool.codec"
local clear_tab = require "table.clear"

local C = ffi.C
local ffi_new = ffi.new
local ffi_str = ffi.string
local ffi_cast = ffi.cast
local encode_borrowing = codec.encode_borrowing
local decode_results = codec.decode_results
local get_request = base.get_request
local get_phase = ngx.get_phase
local co_yield = coroutine._yield
local error = error
local getmetatable = getmetatable
local newproxy = newproxy
local worker_exiting = ngx.worker.exiting
local pcall = pcall
local rawset = rawset
local select = select
local setmetatable = setmetatable
local unpack = unpack
local tonumber = tonumber
local type = type
local floor = math.floor

ffi.cdef [[
typedef struct {
    const unsigned char *data;
    size_t len;
} ngx_threadpool_span_t;

int ngx_threadpool_api_version(void);
int ngx_threadpool_pool_id(const unsigned char *name, size_t len);
int64_t ngx_threadpool_zero_copy(int pool);
int ngx_threadpool_push(ngx_http_request_t *r, int pool,
    const unsigned char *data, size_t len,
    const ngx_threadpool_span_t *spans, size_t nspans, int timeout_ms,
    uint64_t *task, unsigned char *err, size_t *errlen);
int ngx_threadpool_push_batch(ngx_http_request_t *r, int pool,
    const unsigned char *data, size_t len, const size_t *lens, size_t n,
    const ngx_threadpool_span_t *spans, const size_t *nspans,
    int timeout_ms, uint64_t *ids, unsigned char *err, size_t *errlen);
int ngx_threadpool_result(uint64_t task, const unsigned char **data,
    size_t *len, const ngx_threadpool_span_t **spans, size_t *nspans);
size_t ngx_threadpool_reaped(uint64_t *ids, size_t n);
void ngx_threadpool_release(uint64_t task);
void ngx_threadpool_result_done(void);
int ngx_threadpool_stats(int pool, uint64_t *out, size_t n);
int ngx_threadpool_post(int pool, const unsigned char *data, size_t len,
    unsigned char *err, size_t *errlen);
]]

local API_VERSION = 7
-- Payloads larger than this are freed as soon as they are used (smaller
-- buffers are reused: fresh pages cost more than the copies). From this
-- size the C library maps a block on its own anyway (ngx/os.rs).
local LARGE_PAYLOAD = 4 * 1024 * 1024
local FFI_OK = 0
local FFI_ERROR = -1
local FFI_AGAIN = -2
local FFI_DECLINED = -5
local FFI_BAD_CONTEXT = -101

local DEFAULT_TIMEOUT = 60      -- seconds
local MAX_TIMEOUT_MS = 2147483647
local ERR_BUF_SIZE = 256

do
    local ok, version = pcall(function() return C.ngx_threadpool_api_version() end)
    if not ok then
        error("resty.threadpool: the ngx_threadpool module is not loaded "
              .. "(load_module it after ngx_http_lua_module)", 2)
    end
    if version ~= API_VERSION then
        error("resty.threadpool: module API version " .. version
              .. ", this library needs " .. API_VERSION, 2)
    end
end

-- Shared by all calls: each is only used between two yields.
local args_buf = buffer.new()
local task_out = ffi_new("uint64_t[1]")
local data_out = ffi_new("const unsigned char *[1]")
local len_out = ffi_new("size_t[1]")
local spans_out = ffi_new("const ngx_threadpool_span_t *[1]")
local nspans_out = ffi_new("size_t[1]")
local err_buf = ffi_new("unsigned char[?]", ERR_BUF_SIZE)
local err_len = ffi_new("size_t[1]")

local function timeout_ms(seconds)
    if type(seconds) ~= "number" or not (seconds > 0) then
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

local function results(rc, ok, ...)
    if not ok or rc == FFI_DECLINED then
        -- a malformed payload (nil, err) or the handler's error (true, err)
        return nil, (...)
    end
    return ...
end

local function done_with_result(...)
    C.ngx_threadpool_result_done()
    return ...
end

-- Zero-copy arguments. The strings an encoding borrows (scratch) go to
-- the module as spans; the pool thread reads them in place, so they are
-- anchored here by task until the caller takes the result, or until the
-- module reaps the task (it ended after its caller stopped waiting or
-- went away: then the next push, or the next collection cycle of this VM,
-- lets go of them).
local span_arr_t = ffi.typeof("ngx_threadpool_span_t[?]")
local u8p_t = ffi.typeof("const unsigned char *")
local scratch = {}
local spans_buf = span_arr_t(8)
local spans_cap = 8
local anchors = {}
local anchored = 0
local REAP_BATCH = 64
local reaped = ffi_new("uint64_t[?]", REAP_BATCH)

local function unanchor(id)
    if anchors[id] ~= nil then
        anchors[id] = nil
        anchored = anchored - 1
    end
end

local function reap()
    repeat
        local n = tonumber(C.ngx_threadpool_reaped(reaped, REAP_BATCH))
        for i = 0, n - 1 do
            unanchor(tonumber(reaped[i]))
        end
    until n < REAP_BATCH
end

-- A sentinel that no one holds: its finalizer reaps once per collection
-- cycle, so that a worker that pushes nothing more still lets go of the
-- strings of callers that went away; then it makes the next one.
local function reap_at_next_cycle()
    local sentinel = newproxy(true)
    getmetatable(sentinel).__gc = function()
        if anchored > 0 then
            reap()
        end
        if not worker_exiting() then
            reap_at_next_cycle()
        end
    end
end
reap_at_next_cycle()

-- The borrowed strings as spans: spans_buf, with room for all of them.
local function borrowed_spans()
    local n = #scratch
    if n > spans_cap then
        spans_cap = n
        spans_buf = span_arr_t(n)
    end
    for i = 1, n do
        local s = scratch[i]
        spans_buf[i - 1].data = ffi_cast(u8p_t, s)
        spans_buf[i - 1].len = #s
    end
    return n
end

-- Keeps scratch[from..to] alive for the queued task id.
local function anchor(id, from, to)
    if from > to then
        return
    end
    anchors[tonumber(id)] = from == to and scratch[from]
                            or { unpack(scratch, from, to) }
    anchored = anchored + 1
end

local function bad_context(api)
    error(api .. ": API disabled in the context of " .. get_phase()
          .. " (use it in rewrite, access, content or timer, "
          .. "or an ngx.thread of those)", 3)
end

-- What a push that queued nothing returns (or raises, out of context).
local function refused(rc, api)
    if rc == FFI_DECLINED then
        return nil, "queue full"
    end
    if rc == FFI_BAD_CONTEXT then
        bad_context(api)
    end
    return nil, ffi_str(err_buf, err_len[0])
end

-- The arguments encoded in args_buf: its pointer and length, or nil and
-- the value error. With `borrow`, strings from that size go to scratch.
local function encode_args(borrow, ...)
    args_buf:reset()
    local ok, err = encode_borrowing(args_buf, "argument", scratch, borrow,
                                     select("#", ...), ...)
    if not ok then
        clear_tab(scratch)
        return nil, err
    end
    return args_buf:ref()
end

-- After the module copied the arguments: do not keep megabytes for good.
local function done_with_args(len)
    if len > LARGE_PAYLOAD then
        args_buf:free()
    end
end

local function push(pool, ms, ...)
    local r = get_request()
    if not r then
        bad_context("push_task")
    end

    if anchored > 0 then
        reap()
    end
    local p, len = encode_args(pool.borrow, ...)
    if not p then
        return nil, len
    end
    local nspans = borrowed_spans()

    err_len[0] = ERR_BUF_SIZE
    task_out[0] = 0
    local rc = C.ngx_threadpool_push(r, pool.id, p, len, spans_buf, nspans, ms,
                                     task_out, err_buf, err_len)
    done_with_args(len)
    local task = tonumber(task_out[0])
    if nspans > 0 then
        if task ~= 0 then
            anchor(task, 1, nspans)
        end
        clear_tab(scratch)
    end
    if rc == FFI_AGAIN or rc == FFI_OK then
        if rc == FFI_AGAIN then
            local woke, werr = co_yield()
            if not woke then
                -- timeout: the late result is dropped when it arrives
                C.ngx_threadpool_release(task)
                return nil, werr
            end
        end
        if nspans > 0 then
            unanchor(task)
        end
        -- the result stays valid until the next call into the module
        rc = C.ngx_threadpool_result(task, data_out, len_out, spans_out,
                                     nspans_out)
        if rc == FFI_ERROR then
            return nil, "no result"
        end
        local len = tonumber(len_out[0])
        local n = tonumber(nspans_out[0])
        if len <= LARGE_PAYLOAD and n == 0 then
            return results(rc, decode_results(data_out[0], len))
        end
        -- large, or borrowing strings the pool thread may let go of now
        return done_with_result(results(rc, decode_results(data_out[0], len,
                                                           spans_out[0], n)))
    end
    return refused(rc, "push_task")
end

-- results[i] of push_tasks: { true, values... } or { false, err }, with
-- n set, so that nil values unpack in place.
local function batch_entry(rc, ok, ...)
    if not ok or rc == FFI_DECLINED then
        return { false, (...), n = 2 }
    end
    local t = { true, ... }
    t.n = select("#", ...) + 1
    return t
end

local lens_buf = ffi_new("size_t[?]", 64)
local counts_buf = ffi_new("size_t[?]", 64)
local lens_cap = 64

local function push_batch(pool, ms, list)
    local r = get_request()
    if not r then
        bad_context("push_tasks")
    end
    if type(list) ~= "table" then
        error("bad list: expected a table of argument tables", 3)
    end
    local n = #list
    if n == 0 then
        return {}
    end
    if n > lens_cap then
        lens_cap = n
        lens_buf = ffi_new("size_t[?]", n)
        counts_buf = ffi_new("size_t[?]", n)
    end
    if anchored > 0 then
        reap()
    end

    args_buf:reset()
    local borrow = pool.borrow
    local before = 0
    for i = 1, n do
        local args = list[i]
        local ok, err
        if type(args) ~= "table" then
            err = "expected a table of arguments"
        else
            local count = args.n or #args
            local borrowed = #scratch
            ok, err = encode_borrowing(args_buf, "argument", scratch, borrow,
                                       count, unpack(args, 1, count))
            counts_buf[i - 1] = #scratch - borrowed
        end
        if not ok then
            clear_tab(scratch)
            return nil, "task " .. i .. ": " .. err
        end
        local size = #args_buf
        lens_buf[i - 1] = size - before
        before = size
    end
    local p, len = args_buf:ref()
    local nspans = borrowed_spans()

    -- Per call: the handles must outlive the yield, during which other
    -- requests push.
    local ids = ffi_new("uint64_t[?]", n)
    err_len[0] = ERR_BUF_SIZE
    local rc = C.ngx_threadpool_push_batch(r, pool.id, p, len, lens_buf, n,
                                           spans_buf, nspans > 0 and counts_buf
                                           or nil, ms, ids, err_buf, err_len)
    done_with_args(len)
    if nspans > 0 then
        if ids[0] ~= 0 then
            local from = 1
            for i = 0, n - 1 do
                local to = from + tonumber(counts_buf[i])
                anchor(ids[i], from, to - 1)
                from = to
            end
        end
        clear_tab(scratch)
    end
    if rc == FFI_AGAIN or rc == FFI_OK then
        if rc == FFI_AGAIN then
            local woke, werr = co_yield()
            if not woke then
                for i = 0, n - 1 do
                    C.ngx_threadpool_release(ids[i])
                end
                return nil, werr
            end
        end
        local out = new_tab(n, 0)
        for i = 0, n - 1 do
            if nspans > 0 then
                unanchor(tonumber(ids[i]))
            end
            rc = C.ngx_threadpool_result(ids[i], data_out, len_out, spans_out,
                                         nspans_out)
            if rc == FFI_ERROR then
                out[i + 1] = { false, "no result", n = 2 }
            else
                local size = tonumber(len_out[0])
                local borrowed = tonumber(nspans_out[0])
                out[i + 1] = batch_entry(rc, decode_results(data_out[0], size,
                                                            spans_out[0],
                                                            borrowed))
                if size > LARGE_PAYLOAD or borrowed > 0 then
                    C.ngx_threadpool_result_done()
                end
            end
        end
        return out
    end
    return refused(rc, "push_tasks")
end

-- The counters of worker/stats.rs, in its order, then two histograms of
-- (buckets, sum in µs) with these upper bounds in seconds; the last one is
-- written as Prometheus writes it, so that cjson's defaults (which refuse
-- math.huge) encode the table.
local COUNTERS = { "threads", "busy", "queued", "pushed", "completed",
                   "errors", "rejected", "timed_out", "abandoned" }
local BOUNDS = { 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, "+Inf" }
local STATS_LEN = #COUNTERS + 2 * (#BOUNDS + 1)
local stats_out = ffi_new("uint64_t[?]", STATS_LEN)

local function histogram(offset)
    local buckets = new_tab(#BOUNDS, 0)
    local count = 0
    for i = 1, #BOUNDS do
        local n = tonumber(stats_out[offset + i - 1])
        buckets[i] = { le = BOUNDS[i], count = n }
        count = count + n
    end
    return { buckets = buckets, count = count,
             sum = tonumber(stats_out[offset + #BOUNDS]) / 1e6 }
end

local Pool = {}
Pool.__index = Pool

local function check_self(self, method)
    if type(self) ~= "table" or getmetatable(self) ~= Pool then
        error("bad self: call it as pool:" .. method .. "(...)", 3)
    end
end

-- Runs the pool's handler with the given arguments in a pool thread and
-- returns its return values, or nil and an error.
function Pool.push_task(self, ...)
    check_self(self, "push_task")
    return push(self, self.timeout_ms, ...)
end

-- As push_task, with a timeout in seconds for this call.
function Pool.push_task_timeout(self, seconds, ...)
    check_self(self, "push_task_timeout")
    return push(self, timeout_ms(seconds), ...)
end

-- Runs one task per entry of list, an array of argument arrays, with one
-- yield for all of them: an array of { true, values... } or { false, err }
-- in the order of list, or nil and an error when nothing was queued
-- ("queue full" if they do not all fit).
function Pool.push_tasks(self, list)
    check_self(self, "push_tasks")
    return push_batch(self, self.timeout_ms, list)
end

-- As push_tasks, with a timeout in seconds for the whole batch.
function Pool.push_tasks_timeout(self, seconds, list)
    check_self(self, "push_tasks_timeout")
    return push_batch(self, timeout_ms(seconds), list)
end

-- Sets the default timeout in seconds of push_task on this pool, in this
-- worker (60 seconds to start with).
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
    -- nobody would hear when a thread is done with borrowed strings
    local p, len = encode_args(nil, ...)
    if not p then
        return nil, len
    end
    err_len[0] = ERR_BUF_SIZE
    local rc = C.ngx_threadpool_post(self.id, p, len, err_buf, err_len)
    done_with_args(len)
    if rc == FFI_OK then
        return true
    end
    if rc == FFI_DECLINED then
        return nil, "queue full"
    end
    return nil, ffi_str(err_buf, err_len[0])
end

-- This worker's counters of the pool: a table (see the README), or nil
-- and an error outside a worker process.
function Pool.stats(self)
    check_self(self, "stats")
    local n = C.ngx_threadpool_stats(self.id, stats_out, STATS_LEN)
    if n ~= STATS_LEN then
        return nil, "no stats outside a worker process"
    end
    local t = new_tab(0, #COUNTERS + 3)
    for i = 1, #COUNTERS do
        t[COUNTERS[i]] = tonumber(stats_out[i - 1])
    end
    t.in_flight = t.queued + t.busy
    t.wait = histogram(#COUNTERS)
    t.run = histogram(#COUNTERS + #BOUNDS + 1)
    return t
end

local _M = { _VERSION = "0.1.0" }

return setmetatable(_M, {
    __index = function(t, name)
        if type(name) ~= "string" then
            return nil
        end
        local id = C.ngx_threadpool_pool_id(name, #name)
        if id < 0 then
            error("resty.threadpool: no thread pool \"" .. name
                  .. "\" with a thread_pool_process_by_lua handler", 2)
        end
        -- borrow: the smallest string passed in place (nil: copy all)
        local zero_copy = tonumber(C.ngx_threadpool_zero_copy(id))
        local pool = setmetatable({ name = name, id = id,
                                    timeout_ms = DEFAULT_TIMEOUT * 1000,
                                    borrow = zero_copy > 0 and zero_copy
                                             or nil },
                                  Pool)
        rawset(t, name, pool)
        return pool
    end,
})
