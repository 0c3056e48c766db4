-- The demo's /admin/waf/rules (demo.conf): the example WAF's extra rules
-- (waf_live.lua), changed without a reload in both WAF pools, waf (the Lua
-- WAF, through its thread_pool_update_by_lua_block) and waf_rust (the Rust
-- WAF's update), so that the two keep giving the same verdicts.
--
--   GET                     the extra rules
--   POST    a rule          adds it (in place of the extra of its id):
--                           JSON {"id": 90001, "pattern": "...",
--                           "targets": ["args"], "msg": "..."}, or the same
--                           fields as form arguments, targets repeated or
--                           comma-separated; msg may be left out
--   DELETE                  clears the extras (also POST ?clear=1)
--   DELETE  ?id=N           removes extra N
--
-- The list lives in the shared dict waf_admin, so that every worker's admin
-- sees the same. A change builds the whole new list, checks it here
-- (waf_live.check, the check each pool thread makes), then updates the
-- pools with it (an update carries the whole state: a worker started later
-- applies the latest update alone) and waits until every thread of every
-- worker applied it. The Rust WAF goes first: its regex crate refuses some
-- patterns PCRE takes (lookaround), and then the Lua WAF is left alone.
-- A pool that refused the list or did not apply it in time is given the
-- former list again (its latest update must be one every thread takes),
-- and the stored list stays as it was.
--
-- Answers JSON: {"rules": [...], "versions": {"waf": N, "waf_rust": N}}
-- (the pools' update versions), or {"error": "...", "rules": [...]} with
-- the list as it stays: 400 for a bad request or a rule refused, 405 for
-- another method, 503 while another change holds the lock, 504 when the
-- threads did not apply it in time, 500 for another failure of an update.

local json = require "cjson.safe"
local tp = require "resty.threadpool"
local waf_live = require "waf_live"

local ngx = ngx
local concat = table.concat
local find = string.find
local gmatch = string.gmatch
local ipairs = ipairs
local pcall = pcall
local tonumber = tonumber
local type = type
local log = ngx.log
local ERR = ngx.ERR
local now = ngx.now
local sleep = ngx.sleep
local read_body = ngx.req.read_body
local get_body_data = ngx.req.get_body_data
local get_post_args = ngx.req.get_post_args
local get_uri_args = ngx.req.get_uri_args
local get_method = ngx.req.get_method

local DICT = "waf_admin"
local KEY = "rules"
local LOCK = "lock"
-- The lock outlives the longest change (two updates and their undoing,
-- WAIT each), so that a worker that died holding it blocks no one for
-- long.
local LOCK_TTL = 30
local LOCK_WAIT = 10       -- seconds a change waits for another's
local WAIT = 5             -- seconds for every thread to apply an update
local MAX_ARGS = 100
-- The Rust WAF first (see above).
local POOLS = { "waf_rust", "waf" }

local _M = {}

local function dict()
    local d = ngx.shared[DICT]
    if not d then
        error("waf_admin.lua needs lua_shared_dict " .. DICT, 2)
    end
    return d
end

-- The stored extras (an empty list before any change).
local function stored()
    local text = dict():get(KEY)
    local list = text and json.decode(text)
    return type(list) == "table" and list or {}
end

-- JSON of a list, [] when empty (cjson would write {}).
local function encode_list(list)
    local items = {}
    for i, rule in ipairs(list) do
        items[i] = json.encode(rule)
    end
    return "[" .. concat(items, ",") .. "]"
end

local function respond(status, fields)
    local parts = {}
    for _, name in ipairs({ "error", "rules", "versions" }) do
        local v = fields[name]
        if v ~= nil then
            parts[#parts + 1] = json.encode(name) .. ":"
                .. (name == "rules" and encode_list(v) or json.encode(v))
        end
    end
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.say("{", concat(parts, ","), "}")
    return ngx.exit(ngx.HTTP_OK)
end

-- A rule's fields from a request's JSON or form fields: id a number,
-- targets a list, msg "" when left out; the rest as sent, for
-- waf_live.check to judge.
local function rule_of(fields)
    local targets = fields.targets
    if type(targets) == "string" then
        local list = {}
        for name in gmatch(targets, "[^,%s]+") do
            list[#list + 1] = name
        end
        targets = list
    end
    local msg = fields.msg
    if msg == nil then
        msg = ""
    end
    return { id = tonumber(fields.id), pattern = fields.pattern,
             targets = targets, msg = msg }
end

-- The rule a POST sends: JSON (by its Content-Type, or a body that starts
-- with "{"), else the form's fields, else the URI's.
local function posted_rule()
    read_body()
    local body = get_body_data()
    local ctype = ngx.var.content_type or ""
    if find(ctype, "json", 1, true) or (body and find(body, "^%s*{")) then
        local fields, err = json.decode(body or "")
        if type(fields) ~= "table" then
            return nil, "bad JSON: " .. (err or "not an object")
        end
        return rule_of(fields)
    end
    local args = body and get_post_args(MAX_ARGS)
    if not (args and args.id) then
        args = get_uri_args(MAX_ARGS)
    end
    return rule_of(args)
end

-- The HTTP status of an update's error, and whether the update was made
-- (then refused by the threads, or not applied in time) or not at all.
local function status_of(err)
    if find(err, "^update %d+ failed in") then
        return 400, true
    end
    if find(err, "^timeout") then
        return 504, true
    end
    return 500, false
end

-- Sends `list` to every pool and waits for every thread; undoes it in the
-- pools it reached if one fails. The pools' versions, or nil, the error
-- and its HTTP status.
local function update_pools(list, former)
    local versions = {}
    for i, name in ipairs(POOLS) do
        local version, err = tp[name]:update_opts({ wait = WAIT }, list)
        if not version then
            local status, made = status_of(err)
            for j = 1, made and i or i - 1 do
                local _, uerr = tp[POOLS[j]]:update_opts({ wait = WAIT },
                                                         former)
                if uerr then
                    log(ERR, "waf admin: undoing in ", POOLS[j], ": ", uerr)
                end
            end
            return nil, name .. ": " .. err, status
        end
        versions[name] = version
    end
    return versions
end

-- Under the lock: the new list `edit` makes of the stored one, checked,
-- sent to the pools, then stored. The status and the answer's fields.
local function change_locked(edit)
    local former = stored()
    local list, err = waf_live.check(edit(former))
    if not list then
        return 400, { error = err, rules = former }
    end
    local versions, status
    versions, err, status = update_pools(list, former)
    if not versions then
        return status, { error = err, rules = former }
    end
    local ok, serr = dict():set(KEY, encode_list(list))
    if not ok then
        log(ERR, "waf admin: storing the rules: ", serr)
    end
    return 200, { rules = list, versions = versions }
end

local function lock()
    local d = dict()
    local deadline = now() + LOCK_WAIT
    while true do
        local ok, err = d:add(LOCK, ngx.worker.pid(), LOCK_TTL)
        if ok then
            return true
        end
        if err ~= "exists" then
            return nil, err
        end
        if now() >= deadline then
            return nil, "another change of the rules is running"
        end
        sleep(0.01)
    end
end

-- Makes the change `edit` (a function of the stored list that returns the
-- new one, leaving the stored one as it is) and answers.
local function change(edit)
    local ok, err = lock()
    if not ok then
        return respond(503, { error = err, rules = stored() })
    end
    local done, status, fields = pcall(change_locked, edit)
    dict():delete(LOCK)
    if not done then
        error(status, 0)
    end
    return respond(status, fields)
end

-- The list without the extras of id `id`.
local function without(list, id)
    local out = {}
    for _, rule in ipairs(list) do
        if rule.id ~= id then
            out[#out + 1] = rule
        end
    end
    return out
end

-- The list with `rule` in place of the extra of its id, else at its end.
local function with(list, rule)
    local out, i = {}, nil
    for n, r in ipairs(list) do
        out[n] = r
        if r.id == rule.id and not i then
            i = n
        end
    end
    out[i or #out + 1] = rule
    return out
end

local function clear()
    return {}
end

-- Serves /admin/waf/rules (content_by_lua*).
function _M.serve()
    local method = get_method()
    if method == "GET" then
        local versions = {}
        for _, name in ipairs(POOLS) do
            local stats = tp[name]:stats()
            versions[name] = stats and stats.update_version
        end
        return respond(200, { rules = stored(), versions = versions })
    end
    local args = get_uri_args(MAX_ARGS)
    if method == "DELETE" or (method == "POST" and args.clear) then
        local id = tonumber(args.id)
        if args.id and not id then
            return respond(400, { error = "bad id", rules = stored() })
        end
        return change(id and function(list)
            return without(list, id)
        end or clear)
    end
    if method == "POST" then
        local rule, err = posted_rule()
        if rule then
            -- a bad rule is refused at once, before waiting for the lock
            local checked
            checked, err = waf_live.check({ rule })
            rule = checked and rule
        end
        if not rule then
            return respond(400, { error = err, rules = stored() })
        end
        return change(function(list)
            return with(list, rule)
        end)
    end
    ngx.header["Allow"] = "GET, POST, DELETE"
    return respond(405, { error = "GET, POST or DELETE" })
end

return _M
