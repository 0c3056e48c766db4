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

local function finish(ok, ...)
    if not ok and (...) == OOM then
        -- Give back what the failed call left before anything else
        -- allocates (the module's own buffers come from the same memory).
        pcall(collectgarbage)
    end
    collectgarbage("stop")
    return ok, ...
end

-- f wrapped: ok, results... or false, the error value.
return function(f)
    return function(...)
        collectgarbage("restart")
        return finish(pcall(f, ...))
    end
end
