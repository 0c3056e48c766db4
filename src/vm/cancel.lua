-- resty.threadpool as a pool thread's handler sees it: whether the caller
-- of the running task gave up, and a stream's send and receive
-- (src/vm/cancel.rs). The event loop's library has the same cancelled(),
-- which there always returns false, so that a handler shared with an
-- inline fallback runs unchanged.
local c_send, c_receive, version = ...
local ffi = require "ffi"

local C = ffi.C
local error = error
local setmetatable = setmetatable
local tostring = tostring

-- ngx_tp_ names only (see ngx_table.rs).
ffi.cdef [[
bool ngx_tp_task_cancelled(void) asm("ngx_threadpool_task_cancelled");
]]

-- the event loop's library's _VERSION: the project's (Cargo.toml)
local _M = { _VERSION = version }

-- true once the caller of the task this thread runs gave up (timeout,
-- request gone, its batch timed out): the handler may stop; its result
-- is dropped anyway.
function _M.cancelled()
    return C.ngx_tp_task_cancelled()
end

-- Sends one chunk (any value an argument may be) to the reader of the
-- stream this handler runs for (push_stream): true, or nil and
-- "cancelled" once the reader let go, or nil and why the value cannot
-- cross. Waits while the reader has its bound of chunks unread.
_M.send = c_send

-- The next chunk the caller wrote (stream:write()), waiting for it; nil
-- at the end of its input (stream:close_write()), or nil and "cancelled"
-- once the caller let go.
_M.receive = c_receive

return setmetatable(_M, {
    __index = function(_, name)
        error("resty.threadpool: tp." .. tostring(name)
              .. " is not available in thread pools (only cancelled(), send() and receive())", 2)
    end,
})
