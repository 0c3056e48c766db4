-- The streaming section of make bench (bench/run.py): a large output made
-- in a pool thread, handed back chunk by chunk (push_stream) or whole
-- (push_task). The Lua pool's handler is `task`; the Rust pool's
-- (bench/rust-upper) takes the same tasks:
--
--   "chunks", n, size   sends n chunks of `size` bytes, returns n
--   "one", size         returns one chunk: a push_task of a chunk's size
--   "forever", path     sends until a send fails, then writes the time
--                       (CLOCK_MONOTONIC, µs) to the file at path
--   "input", path       receives until a receive fails, then the same
--
-- The event loop's side, on the pool named by ?pool=:
--
--   GET /stream/http?pool=P&mode=stream|whole&n=1024&size=65536
--       the output as the response body, each chunk flushed as it comes
--       (streamed), or every chunk read first and the body sent at once
--       (whole: what a caller without streams does, as one push_task may
--       not return more than 16 MiB); run.py times the first byte
--   GET /stream/drain?pool=P&mode=stream|task&n=1024&size=65536
--       no HTTP: n chunks of one stream read, or n push_tasks of "one"
--       one after another; answers JSON with the wall time and the event
--       loop's CPU time
--   GET /stream/cancel?pool=P&how=close|timeout&trials=20
--       how long after the caller let go the handler's waiting send
--       (s:close()) or receive (a read's timeout) returned, in µs

local ffi = require "ffi"
local cjson = require "cjson.safe"

local C = ffi.C
local concat = table.concat
local encode = cjson.encode
local rep = string.rep
local tonumber = tonumber
local tostring = tostring

-- Under names of their own: a Lua state keeps the first declaration of a
-- C name.
ffi.cdef [[
typedef struct { long sec; long nsec; } bench_stream_timespec_t;
int bench_stream_clock_gettime(int clock_id, bench_stream_timespec_t *ts) asm("clock_gettime");
]]

local CLOCK_MONOTONIC = 1
local CLOCK_THREAD_CPUTIME_ID = 3
local MAX_N = 1000000
local MAX_SIZE = 16 * 1024 * 1024
-- Longer than the slowest full-size cell on a loaded 2-core machine.
local TIMEOUT = 120

local ts = ffi.new("bench_stream_timespec_t")

local function clock_us(id)
    C.bench_stream_clock_gettime(id, ts)
    return tonumber(ts.sec) * 1e6 + tonumber(ts.nsec) / 1e3
end

local _M = {}

-- The pool's side. The same piece for every chunk: the cost measured is
-- the hand-off's, not the making of the bytes.
local tasks = {}

function tasks.chunks(n, size)
    local send = require("resty.threadpool").send
    local piece = rep("x", size)
    for _ = 1, n do
        local ok, err = send(piece)
        if not ok then
            return nil, err
        end
    end
    return n
end

function tasks.one(size)
    return rep("x", size)
end

local function note_time(path)
    local f = assert(io.open(path, "w"))
    f:write(("%.3f"):format(clock_us(CLOCK_MONOTONIC)))
    f:close()
end

function tasks.forever(path)
    local send = require("resty.threadpool").send
    while send("x") do
    end
    note_time(path)
end

function tasks.input(path)
    local receive = require("resty.threadpool").receive
    while receive() ~= nil do
    end
    note_time(path)
end

function _M.task(name, ...)
    return tasks[name](...)
end

-- The event loop's side.
local function params()
    local args = ngx.req.get_uri_args()
    local pool = require("resty.threadpool")[args.pool or ""]
    local n, size = tonumber(args.n), tonumber(args.size)
    if not (pool and n and size and n >= 1 and n <= MAX_N and size >= 1
            and size <= MAX_SIZE) then
        ngx.status = 400
        ngx.say("usage: ?pool=NAME&mode=MODE&n=1..", MAX_N, "&size=1..", MAX_SIZE)
        return ngx.exit(400)
    end
    pool:set_timeout(TIMEOUT)
    return pool, args.mode, n, size
end

local function fail(what, err)
    ngx.log(ngx.ERR, "bench_stream: ", what, ": ", tostring(err))
    return ngx.exit(ngx.HTTP_INTERNAL_SERVER_ERROR)
end

function _M.http()
    local pool, mode, n, size = params()
    local s, err = pool:push_stream("chunks", n, size)
    if not s then
        return fail("push_stream", err)
    end
    local whole = mode == "whole" and {}
    while true do
        local chunk, rerr = s:read()
        if s.done then
            if not chunk then
                -- a streamed response's status is sent: cut it short
                ngx.log(ngx.ERR, "bench_stream: read: ", tostring(rerr))
                return ngx.exit(ngx.ERROR)
            end
            break
        end
        if whole then
            whole[#whole + 1] = chunk
        else
            ngx.print(chunk)
            ngx.flush(true)
        end
    end
    if whole then
        ngx.print(concat(whole))
    end
end

local function drain_stream(pool, n, size)
    local s, err = pool:push_stream("chunks", n, size)
    if not s then
        return nil, err
    end
    local chunks, bytes = 0, 0
    while true do
        local chunk, rerr = s:read()
        if s.done then
            if chunk ~= n then
                return nil, rerr or "handler returned " .. tostring(chunk)
            end
            return chunks, bytes
        end
        chunks = chunks + 1
        bytes = bytes + #chunk
    end
end

local function drain_tasks(pool, n, size)
    local bytes = 0
    for i = 1, n do
        local piece, err = pool:push_task("one", size)
        if not piece then
            return nil, "task " .. i .. ": " .. tostring(err)
        end
        bytes = bytes + #piece
    end
    return n, bytes
end

function _M.drain()
    local pool, mode, n, size = params()
    local drain = mode == "task" and drain_tasks or drain_stream
    local t0, cpu0 = clock_us(CLOCK_MONOTONIC), clock_us(CLOCK_THREAD_CPUTIME_ID)
    local chunks, bytes = drain(pool, n, size)
    if not chunks then
        return fail("drain " .. tostring(mode), bytes)
    end
    ngx.say(encode({
        chunks = chunks, bytes = bytes,
        elapsed_us = clock_us(CLOCK_MONOTONIC) - t0,
        loop_cpu_us = clock_us(CLOCK_THREAD_CPUTIME_ID) - cpu0,
    }))
end

-- How long after its caller let go a handler waiting in send (how=close:
-- the reader read one chunk of a stream bound to 1, then closed it) or in
-- receive (how=timeout: the reader's read timed out) saw it.
local CANCEL_TIMEOUT = 0.02

local function note_of(path)
    for _ = 1, 5000 do
        local f = io.open(path)
        if f then
            local t = tonumber(f:read("*a"))
            f:close()
            os.remove(path)
            if t then
                return t
            end
        end
        ngx.sleep(0.001)
    end
end

function _M.cancel()
    local args = ngx.req.get_uri_args()
    local pool = require("resty.threadpool")[args.pool or ""]
    local trials = tonumber(args.trials) or 20
    if not pool or (args.how ~= "close" and args.how ~= "timeout") then
        ngx.status = 400
        ngx.say("usage: ?pool=NAME&how=close|timeout&trials=N")
        return ngx.exit(400)
    end
    local late, missed = {}, 0
    for i = 1, trials do
        local path = ngx.config.prefix() .. "logs/cancel-" .. i
        local s, gaveup
        if args.how == "close" then
            s = assert(pool:push_stream_opts({ chunks = 1 }, "forever", path))
            assert(s:read())
            -- the handler fills the bound and waits in its next send
            ngx.sleep(0.005)
            s:close()
            gaveup = clock_us(CLOCK_MONOTONIC)
        else
            s = assert(pool:push_stream("input", path))
            local _, err = s:read(CANCEL_TIMEOUT)
            gaveup = clock_us(CLOCK_MONOTONIC)
            assert(err == "timeout", err)
        end
        local seen = note_of(path)
        if seen then
            late[#late + 1] = seen - gaveup
        else
            missed = missed + 1
        end
    end
    ngx.say(encode({ late_us = late, missed = missed }))
end

return _M
