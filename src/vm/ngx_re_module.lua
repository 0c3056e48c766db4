-- `require "ngx.re"` in a pool thread: split and opt with the results and
-- errors of lua-resty-core's ngx/re.lua (the same in 0.1.25 and 0.1.31), over the thread's own
-- PCRE patterns (ngx_re.lua), never over lua-nginx-module's.
local internal, version = ...

local new_tab = require "table.new"

local compile = internal.compile
local exec = internal.exec
local exec_error = internal.exec_error
local cache_empty = internal.cache_empty
local set_jit_stack_size = internal.set_jit_stack_size
local SMALL_OVECTOR = internal.SMALL_OVECTOR

local error = error
local tostring = tostring
local type = type
local sub = string.sub
local min = math.min
local max = math.max

local PCRE_ERROR_NOMATCH = -1
local DEFAULT_SPLIT_RES_SIZE = 4

local split_ctx = {}

local _M = { version = version }

-- The next separator at or after ctx.pos (0-based): its 1-based from and
-- to (to is one past it for an empty match), and its first capture.
local function next_separator(compiled, subj, len, ctx)
    local rc = exec(compiled, subj, len, max(ctx.pos, 0))
    if rc == PCRE_ERROR_NOMATCH then
        return nil
    end
    if rc < 0 then
        return nil, nil, nil, exec_error(rc)
    end
    if rc == 0 then
        if not compiled.dfa then
            return nil, nil, nil, SMALL_OVECTOR
        end
        rc = 1
    end

    local cap = compiled.ovec
    local from, to = cap[0], cap[1]
    if from < 0 or to < 0 then
        return nil
    end
    -- an empty separator moves the search one character on
    ctx.pos = from == to and to + 1 or to

    if compiled.ncap > 0 and rc > 1 then
        return from + 1, to + 1, sub(subj, cap[2] + 1, cap[3])
    end
    return from + 1, to + 1
end

function _M.split(subj, regex, opts, ctx, limit, res)
    subj = tostring(subj)

    if not ctx then
        ctx = split_ctx
        ctx.pos = 1
    elseif not ctx.pos then
        ctx.pos = 1
    end

    limit = limit or 0

    if not res then
        res = new_tab(limit > 0 and min(DEFAULT_SPLIT_RES_SIZE, limit)
                      or DEFAULT_SPLIT_RES_SIZE, 0)
    elseif type(res) ~= "table" then
        error("res is not a table", 2)
    end

    local len = #subj
    if ctx.pos > len then
        res[1] = nil
        return res
    end

    local compiled, err = compile(regex, opts)
    if not compiled then
        return nil, err
    end

    local start = ctx.pos
    local n = 0
    local last_empty
    local count = 1
    ctx.pos = start - 1

    -- with a limit, at most limit - 1 separators are used
    while limit <= 0 or count < limit do
        local from, to, capture, xerr = next_separator(compiled, subj, len,
                                                       ctx)
        if xerr then
            return nil, xerr
        end
        if not from then
            break
        end

        if last_empty then
            start = last_empty
        end
        if from == to then
            last_empty = from
        end

        if from > start or not last_empty then
            count = count + 1
            n = n + 1
            res[n] = sub(subj, start, from - 1)
            if capture then
                n = n + 1
                res[n] = capture
            end
            start = to
            if start > len then
                break
            end
        end
    end

    if limit <= 0 and start > len then
        -- without a limit, trailing empty fields are dropped
        for i = n, 1, -1 do
            if res[i] ~= "" then
                n = i
                break
            end
            res[i] = nil
        end
    else
        n = n + 1
        res[n] = sub(subj, start)
    end
    res[n + 1] = nil
    return res
end

function _M.opt(option, value)
    if option == "jit_stack_size" then
        if not cache_empty() then
            error("changing jit stack size is not allowed when some "
                  .. "regexs have already been compiled and cached", 2)
        end
        local ok, err = set_jit_stack_size(value)
        if not ok then
            error(err, 2)
        end
        return
    end
    error("unrecognized option name", 2)
end

return _M
