-- Runs Lua code of a pool thread under a protected call, with the collector
-- running only there.
--
-- LuaJIT propagates an error raised by a __gc finalizer to whatever ran
-- the collector step, and a step can run inside any allocation, including
-- the ones the module's Rust code makes through the C API outside a
-- protected call. There such an error would unwind through Rust frames and
-- abort the worker. So the collector is stopped outside protected calls:
-- every finalizer runs, and every error it raises is caught, here.
local pcall = pcall
local collectgarbage = collectgarbage

local OOM = "not enough memory"

-- KiB in use when the collector last stopped: what was allocated since
-- (the task's decoded arguments, the previous results) is paid for in
-- collector work when it restarts, as if it had run all along.
local stopped_at = 0

local function finish(ok, ...)
    if not ok and (...) == OOM then
        -- Give back what the failed call left before anything else
        -- allocates (the module's own buffers come from the same memory).
        pcall(collectgarbage)
    end
    collectgarbage("stop")
    stopped_at = collectgarbage("count")
    return ok, ...
end

-- KiB allocated while stopped and not yet paid for.
local owed = 0

-- One collector step per KiB allocated while it was stopped: the pace
-- LuaJIT keeps when it runs freely (a step each GCSTEPSIZE, 1 KiB, of
-- allocation). A finished cycle clears the debt.
local function run(f, ...)
    owed = owed + collectgarbage("count") - stopped_at
    while owed >= 1 do
        owed = owed - 1
        if collectgarbage("step", 0) then
            owed = 0
        end
    end
    return f(...)
end

-- f wrapped: ok, results... or false, the error value.
return function(f)
    return function(...)
        collectgarbage("restart")
        return finish(pcall(run, f, ...))
    end
end
