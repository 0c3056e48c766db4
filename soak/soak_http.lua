-- The soak's request kinds, on the event loop. Each checks what its pool
-- gave back and answers 200 with the outcome it got ("ok", "timeout",
-- "overloaded", "error", "oom", "limit", "full", "posted"), or 500 with "BAD " and what
-- was wrong. soak/load.py holds which outcomes each kind may give.
local tp = require "resty.threadpool"
local tasks = require "soak_tasks"

local make = tasks.make
local md5 = ngx.md5
local random = math.random
local spawn, wait = ngx.thread.spawn, ngx.thread.wait
local tostring, type = tostring, type

-- Over this, a value does not cross (docs/lua-api.md: 16 MiB per call).
local LIMIT = 16 * 1024 * 1024

local _M = {}

local function describe(v)
    if type(v) == "table" then
        local parts = {}
        for k, x in pairs(v) do
            parts[#parts + 1] = tostring(k) .. "=" .. tostring(x)
        end
        return "{" .. table.concat(parts, ",") .. "}"
    end
    return tostring(v)
end

-- A string of a random size around the zero-copy size (16k), seeded.
local function some_string()
    local seed = random(1, 1e9)
    return make(random(16, 40000), seed), seed
end

-- One echo task on `pool`; nil, or what was wrong.
local function echo(pool, want_init)
    local s = some_string()
    local t = { n = #s, s = s, list = { 1, "two", { three = 3 } } }
    local res, t2, sum, init = pool:push_task("echo", s, t)
    if res ~= s then
        return "echo: " .. describe(res) .. " " .. describe(t2)
    end
    if type(t2) ~= "table" or t2.s ~= s or t2.n ~= #s or type(t2.list) ~= "table"
        or type(t2.list[3]) ~= "table" or t2.list[3].three ~= 3 then
        return "echo: the table came back as " .. describe(t2)
    end
    if sum ~= md5(s) then
        return "echo: the thread read another string"
    end
    if want_init and (type(init) ~= "number" or init < 1) then
        return "echo: the init chunk did not run (" .. describe(init) .. ")"
    end
end

local kinds = {}

function kinds.push()
    local err = echo(tp.work, true)
    if err then return nil, err end
    return "ok"
end

-- Four light threads push at once.
function kinds.fanout()
    local threads = {}
    for i = 1, 4 do
        threads[i] = spawn(echo, tp.work, true)
    end
    for i = 1, 4 do
        local ok, err = wait(threads[i])
        if not ok then return nil, "fanout: " .. tostring(err) end
        if err then return nil, err end
    end
    return "ok"
end

-- Twelve tasks in one call, every fourth failing.
function kinds.batch()
    local list, strings = {}, {}
    for i = 1, 12 do
        if i % 4 == 0 then
            list[i] = { "fail", i }
        else
            strings[i] = some_string()
            list[i] = { "echo", strings[i] }
        end
    end
    local res, err = tp.work:push_tasks(list)
    if not res then return nil, "batch: " .. describe(err) end
    for i = 1, 12 do
        local r = res[i]
        if i % 4 == 0 then
            if r[1] ~= false or type(r[2]) ~= "string" or not r[2]:find("boom " .. i .. "$") then
                return nil, "batch: task " .. i .. " should fail: " .. describe(r[2])
            end
        elseif r[1] ~= true or r[2] ~= strings[i] or r[4] ~= md5(strings[i]) then
            return nil, "batch: task " .. i .. ": " .. describe(r[1]) .. " " .. describe(r[2])
        end
    end
    return "ok"
end

-- A counted task and a failing one now, another counted one in the log
-- phase (log_phase).
function kinds.post()
    local ok, err = tp.work:post_task("count")
    if not ok then return nil, "post: " .. describe(err) end
    ngx.shared.soak:incr("posted", 1, 0)
    ok, err = tp.work:post_task("fail", "posted")
    if not ok then return nil, "post: " .. describe(err) end
    return "posted"
end

-- A string of 16-256 KiB: borrowed by the thread, which may still read
-- it after its caller stopped waiting or went away.
local function caller_string()
    return make(random(16384, 262144), random(1, 1e9))
end

-- A timeout is also a deadline: while the slow pool's threads are busy,
-- a task this much longer than it is refused at once ("overloaded").
function kinds.timeout()
    local res, err = tp.slow:push_task_timeout(0.02, "sleep", 150, caller_string())
    if res ~= nil or (err ~= "timeout" and err ~= "overloaded") then
        return nil, "timeout: " .. describe(res) .. " " .. describe(err)
    end
    return err
end

function kinds.batch_timeout()
    local res, err = tp.slow:push_tasks_timeout(0.02, { { "sleep", 400, caller_string() },
                                                        { "echo", caller_string() } })
    if res ~= nil or (err ~= "timeout" and err ~= "overloaded") then
        return nil, "batch_timeout: " .. describe(res) .. " " .. describe(err)
    end
    return err
end

function kinds.error_string()
    local n = random(1, 1e6)
    local res, err = tp.work:push_task("fail", n)
    if res ~= nil or type(err) ~= "string" or not err:find("boom " .. n .. "$") then
        return nil, "error_string: " .. describe(res) .. " " .. describe(err)
    end
    return "error"
end

function kinds.error_table()
    local n = random(1, 1e6)
    local res, err = tp.work:push_task("fail_table", n)
    if res ~= nil or type(err) ~= "table" or err.code ~= n or err.msg ~= "table boom" then
        return nil, "error_table: " .. describe(res) .. " " .. describe(err)
    end
    return "error"
end

-- A thread runs out of memory; the pool goes on.
function kinds.oom()
    local res, err = tp.work:push_task("oom", random(16, 64))
    if res ~= nil or err ~= "not enough memory" then
        return nil, "oom: " .. describe(res) .. " " .. describe(err)
    end
    err = echo(tp.work, true)
    if err then return nil, "after oom: " .. err end
    return "oom"
end

-- ?in=BYTES&out=BYTES: a string each way; over LIMIT either way, the
-- call must fail naming the limit.
local function big(pool)
    local n_in, n_out = tonumber(ngx.var.arg_in), tonumber(ngx.var.arg_out)
    local seed = random(1, 1e9)
    local s = make(n_in, seed)
    local sum, n, r = pool:push_task("big", s, n_out, seed + 1)
    if n_in > LIMIT or n_out > LIMIT then
        if sum ~= nil or type(n) ~= "string" or not n:find("exceed") then
            return nil, "big over the limit: " .. describe(sum) .. " " .. describe(n)
        end
        return "limit"
    end
    if sum ~= md5(s) or n ~= n_in then
        return nil, "big: the thread read " .. describe(n) .. " bytes, " .. describe(sum)
    end
    if r ~= make(n_out, seed + 1) then
        return nil, "big: the result differs (" .. (type(r) == "string" and #r or describe(r)) .. ")"
    end
    return "ok"
end

function kinds.big() return big(tp.big) end
function kinds.big_copy() return big(tp.copy) end

-- The tiny pool (one thread, one queue slot) runs a task of this
-- request that waits to be released, and its slot is taken: three posts
-- can get at most one in, and a push is refused at once.
local full_id = 0

local function fill_and_push(id)
    local d = ngx.shared.soak
    -- one task of ours in: the slot may hold another request's for a moment
    local ok, err
    for _ = 1, 1000 do
        ok, err = tp.tiny:post_task("hold", id)
        if ok or err ~= "queue full" then break end
        ngx.sleep(0.002)
    end
    if not ok then return nil, "full: first post: " .. describe(err) end
    -- it runs (and holds the thread until released)
    for _ = 1, 2500 do
        if d:get("holding:" .. id) then break end
        ngx.sleep(0.002)
    end
    if not d:get("holding:" .. id) then return nil, "full: the held task did not start" end
    local refused = 0
    for _ = 1, 3 do
        ok, err = tp.tiny:post_task("hold", id)
        if not ok then
            if err ~= "queue full" then return nil, "full: post: " .. describe(err) end
            refused = refused + 1
        end
    end
    if refused < 2 then
        return nil, "full: " .. (3 - refused) .. " of three posts to a queue of one were taken"
    end
    local res
    res, err = tp.tiny:push_task("echo", "x")
    if res ~= nil or err ~= "queue full" then
        return nil, "full: push: " .. describe(res) .. " " .. describe(err)
    end
    return "full"
end

function kinds.full()
    full_id = full_id + 1
    local id = ngx.worker.pid() .. ":" .. full_id
    local ok, outcome, err = pcall(fill_and_push, id)
    ngx.shared.soak:set("release:" .. id, true, 10)
    if not ok then error(outcome) end
    return outcome, err
end

-- ngx.run_worker_thread on nginx's own pool, beside the module's.
function kinds.rwt()
    local s = some_string()
    local ok, res, n = ngx.run_worker_thread("rwt", "soak_tasks", "rwt_echo", s)
    if not ok or res ~= s or n ~= #s then
        return nil, "rwt: " .. describe(ok) .. " " .. describe(res)
    end
    return "ok"
end

-- How many posted "count" tasks were queued and ran (driver only).
function kinds.counters()
    local d = ngx.shared.soak
    return (d:get("posted") or 0) .. " " .. (d:get("posted_done") or 0)
end

-- Faults, sent only with soak.py --inject (load.INJECT).
function kinds.inject_crash()
    tp.slow:push_task("crash")
    return nil, "the worker did not crash"
end

function kinds.inject_drop()
    return ngx.exit(444)
end

function kinds.inject_leak_fd()
    local ok, err = tp.slow:push_task("leak_fd")
    if ok ~= true then return nil, "leak_fd: " .. describe(err) end
    return "ok"
end

function kinds.inject_leak_mem()
    local ok, err = tp.slow:push_task("leak_mem")
    if ok ~= true then return nil, "leak_mem: " .. describe(err) end
    return "ok"
end

-- Before a sample (driver only): every worker collects its Lua garbage
-- (large strings the event loop let go of), through _M.collector.
function kinds.gc()
    return tostring(ngx.shared.soak:incr("gc_epoch", 1, 0))
end

-- How many workers collected since the last /k/gc.
function kinds.gc_done()
    local d = ngx.shared.soak
    local epoch, n = d:get("gc_epoch") or 0, 0
    for id = 0, ngx.worker.count() - 1 do
        if d:get("gc_done:" .. id) == epoch then n = n + 1 end
    end
    return tostring(n)
end

-- init_worker_by_lua: a full collection whenever the epoch moves.
function _M.collector()
    local d = ngx.shared.soak
    local seen = d:get("gc_epoch") or 0
    local ok, err = ngx.timer.every(0.1, function(premature)
        if premature then return end
        local epoch = d:get("gc_epoch") or 0
        if epoch ~= seen then
            seen = epoch
            collectgarbage()
            collectgarbage()
            d:set("gc_done:" .. ngx.worker.id(), epoch)
        end
    end)
    if not ok then
        ngx.log(ngx.ERR, "soak: cannot start the collector timer: ", err)
    end
end

function _M.run(kind)
    local f = kinds[kind]
    if not f then
        ngx.status = 404
        ngx.say("BAD no kind ", kind)
        return
    end
    local ok, outcome, err = pcall(f)
    if ok and outcome then
        ngx.say(outcome)
        return
    end
    ngx.status = 500
    ngx.say("BAD ", ok and err or ("raised: " .. tostring(outcome)))
end

function _M.log_phase(kind)
    if kind == "post" then
        local ok, err = tp.work:post_task("count")
        if ok then
            ngx.shared.soak:incr("posted", 1, 0)
        else
            ngx.log(ngx.ERR, "soak: post_task in the log phase: ", describe(err))
        end
    end
end

-- The client reads "pushed" and goes away while the task sleeps.
function _M.abort()
    local s = caller_string()
    ngx.say("pushed")
    ngx.flush(true)
    local res, sum = tp.slow:push_task("sleep", 100, s)
    if res ~= 100 or sum ~= md5(s) then
        -- the client is gone (lua_check_client_abort off): an error line
        -- fails the soak
        ngx.log(ngx.ERR, "soak: abort: the task gave ", describe(res), " ", describe(sum))
    end
    ngx.say("done")
end

return _M
