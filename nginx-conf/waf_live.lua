-- The example WAF's extra rules: those a pool update adds without a reload,
-- which waf.lua scans after the rules of waf_rules.lua, and the check of a
-- list of rules in that file's shape, which waf.lua runs on the file's own.
--
--   thread_pool_update_by_lua_block waf {
--       assert(require("waf_live").set(...))
--   }
--   -- then, from the event loop (waf_admin.lua does it for both WAFs):
--   tp.waf:update_opts({ wait = 5 }, {
--       { id = 90001, pattern = [[(?i)evil]], targets = { "args" },
--         msg = "..." },
--   })
--
-- An update carries the whole list: it replaces the previous update's
-- extras, and an empty list drops them. Every rule is checked and its
-- pattern compiled (ngx.re.find(..., "jo"), as waf.lua does at load)
-- before the list changes, so that a bad rule fails the update, naming its
-- id, and the thread keeps the rules it had. Ids are not checked for
-- duplicates: the Rust WAF's update (examples/waf-rust) does not either,
-- and the two give the same verdicts. On the event loop nothing calls
-- set: require("waf") there scans the file's rules alone.

local ngx_re = ngx.re
local floor = math.floor
local next = next
local pairs = pairs
local tostring = tostring
local type = type

local _M = {}

-- What a rule may look at (waf.lua's subjects).
local TARGETS = { uri = true, args = true, headers = true, body = true,
                  user_agent = true }

-- The largest id: the Rust WAF's are u32.
local MAX_ID = 4294967295

-- The rules of the latest update, in its order; empty until one comes.
local extras = {}

-- The number of entries of table t.
local function count(t)
    local n = 0
    for _ in pairs(t) do
        n = n + 1
    end
    return n
end

-- Rule #n of a list, checked and compiled: a copy of its four fields, or
-- nil and why not (naming its id once it has one).
local function check_rule(n, rule)
    if type(rule) ~= "table" then
        return nil, "rule #" .. n .. ": not a table"
    end
    local id = rule.id
    if type(id) ~= "number" or id < 0 or id ~= floor(id) then
        return nil, "rule #" .. n .. ": no integer id"
    end
    if id > MAX_ID then
        return nil, "rule #" .. n .. ": id too large"
    end
    local function bad(what)
        return nil, "waf rule " .. tostring(id) .. ": " .. what
    end
    local targets = rule.targets
    if type(targets) ~= "table" or next(targets) == nil then
        return bad("no targets")
    end
    if count(targets) ~= #targets then
        return bad("targets is not a list of names")
    end
    local copy = {}
    for i = 1, #targets do
        local target = targets[i]
        if type(target) ~= "string" then
            return bad("targets is not a list of names")
        end
        if not TARGETS[target] then
            return bad("unknown target " .. target)
        end
        copy[i] = target
    end
    local pattern, msg = rule.pattern, rule.msg
    if type(pattern) ~= "string" then
        return bad("no string pattern")
    end
    if type(msg) ~= "string" then
        return bad("no string msg")
    end
    -- "o": the compiled regex stays in the regex cache for the requests
    local _, _, err = ngx_re.find("", pattern, "jo")
    if err then
        return bad(err)
    end
    return { id = id, pattern = pattern, targets = copy, msg = msg }
end

-- The rules of `rules` (a list in waf_rules.lua's shape), checked and
-- their patterns compiled: a list of copies, or nil and the first error.
function _M.check(rules)
    if type(rules) ~= "table" or count(rules) ~= #rules then
        return nil, "expected a list of rules"
    end
    local list = {}
    for i = 1, #rules do
        local rule, err = check_rule(i, rules[i])
        if not rule then
            return nil, err
        end
        list[i] = rule
    end
    return list
end

-- Makes `rules` the extras, in place of the previous ones, once every one
-- of them checked: true, or nil and the error, the extras unchanged.
function _M.set(rules)
    local list, err = _M.check(rules)
    if not list then
        return nil, err
    end
    extras = list
    return true
end

-- The extras (not to be changed by the caller).
function _M.rules()
    return extras
end

return _M
