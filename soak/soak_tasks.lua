-- The soak's task handler, one for every pool: the first argument names
-- the operation. Also ngx.run_worker_thread's module (rwt_echo).
local ffi = require "ffi"

-- Renamed, so that no other cdef of poll in the same state is disturbed.
ffi.cdef [[
int soak_poll(void *fds, unsigned long nfds, int timeout) asm("poll");
void soak_abort(void) asm("abort");
void *soak_malloc(size_t size) asm("malloc");
int soak_open(const char *path, int flags) asm("open");
]]

local C = ffi.C
local rep = string.rep
local format = string.format
local md5 = ngx.md5

local MIB = 1024 * 1024

local _M = {}

-- A string of n bytes that depends on seed (n >= 16).
function _M.make(n, seed)
    return rep(string.char(97 + seed % 26), n - 16) .. format("%16d", seed)
end
local make = _M.make

local ops = {}

-- The argument back, the table back, what the thread read, and how many
-- times the pool's init chunk ran in this thread's Lua state (nil in pools
-- without one).
function ops.echo(s, t)
    return s, t, md5(s), _G.soak_init_runs
end

function ops.fail(n)
    error("boom " .. n)
end

function ops.fail_table(n)
    error({ code = n, msg = "table boom" })
end

-- Holds the thread for ms milliseconds without using the CPU; returns
-- what it read of s, and s (read in place both ways from 16 KiB, while
-- its caller may be gone).
function ops.sleep(ms, s)
    C.soak_poll(nil, 0, ms)
    return ms, s and md5(s), s
end

-- Allocates mib MiB of strings the state keeps, then asks LuaJIT for a
-- string past its size limit (2 GiB), which it refuses with its memory
-- error before allocating: "not enough memory", as when an allocation
-- fails. The module must answer `nil, "not enough memory"` and rebuild the
-- thread's Lua state, freeing what the handler held.
function ops.oom(mib)
    local held = {}
    for i = 1, mib do
        held[i] = make(MIB, i)
    end
    local s = rep(held[1], 4096)
    return #s
end

-- A large string each way: what the thread read, and a string of out bytes.
function ops.big(s, out, seed)
    return md5(s), #s, make(out, seed)
end

-- Holds the thread until the event loop sets release:ID in the shared
-- dict (at most 2 s); says so in holding:ID when it starts.
function ops.hold(id)
    local d = ngx.shared.soak
    d:set("holding:" .. id, true, 10)
    for _ = 1, 2000 do
        if d:get("release:" .. id) then
            return true
        end
        C.soak_poll(nil, 0, 1)
    end
    return false
end

-- Counts posted tasks that ran, in the shared dict (kept across reloads).
function ops.count()
    ngx.shared.soak:incr("posted_done", 1, 0)
    return true
end

-- Faults for soak.py --inject: a crash, and leaks the module could have.
function ops.crash()
    C.soak_abort()
end

function ops.leak_fd()
    return C.soak_open("/dev/null", 0) >= 0
end

function ops.leak_mem()
    local n = 4 * MIB
    local p = C.soak_malloc(n)
    ffi.fill(p, n, 1)
    return p ~= nil
end

function _M.handle(op, ...)
    local f = ops[op]
    if not f then
        error("unknown op " .. tostring(op))
    end
    return f(...)
end

-- ngx.run_worker_thread(pool, "soak_tasks", "rwt_echo", s)
function _M.rwt_echo(s)
    return s, #s
end

return _M
