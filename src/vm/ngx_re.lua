-- ngx.re of a pool thread: match, find, gmatch, sub and gsub with the results
-- of lua-resty-core's ngx.re over lua-nginx-module, computed with the same
-- PCRE through a backend for its API (ngx_re_pcre1.lua, ngx_re_pcre2.lua) on
-- a private copy of the library (see ngx_re.rs). Compiled patterns, their
-- cache and the PCRE JIT stack belong to the state of one thread: nothing
-- here is shared with another thread.
local backend, max_cache, max_err_len, ngx = ...

local ffi = require "ffi"
local bit = require "bit"
local buffer = require "string.buffer"
local new_tab = require "table.new"

local ffi_cast = ffi.cast
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local ffi_string = ffi.string
local band = bit.band
local bor = bit.bor
local byte = string.byte
local find = string.find
local fmt = string.format
local sub = string.sub
local ceil = math.ceil
local error = error
local setmetatable = setmetatable
local tonumber = tonumber
local tostring = tostring
local type = type
local next = next

if type(backend) ~= "table" then
    -- the PCRE library did not load: say so where ngx.re is used, as
    -- OpenResty does when built without PCRE.
    return setmetatable({}, { __index = function(_, key)
        error("no support for 'ngx.re." .. tostring(key) .. "': " .. backend,
              2)
    end })
end

local backend_compile = backend.compile
local backend_info = backend.info
local backend_prepare = backend.prepare
local jit_stack_create = backend.jit_stack_create
local jit_stack_free = backend.jit_stack_free
local PCRE = backend.OPTS

-- Our flags (lua-resty-core's values).
local FLAG_COMPILE_ONCE = 0x01
local FLAG_DFA = 0x02
local FLAG_JIT = 0x04
local FLAG_DUPNAMES = 0x08
local FLAG_NO_UTF8_CHECK = 0x10

local PCRE_ERROR_NOMATCH = -1 -- PCRE2_ERROR_NOMATCH too

-- As lua-nginx-module: 32 KiB of JIT stack (what PCRE uses on the machine
-- stack when no stack is assigned, as in OpenResty by default).
local JIT_STACK_SIZE = 32 * 1024

-- option letter -> { our flags, PCRE options }
local OPTIONS = {
    [byte "o"] = { FLAG_COMPILE_ONCE, 0 },
    [byte "j"] = { FLAG_JIT, 0 },
    [byte "i"] = { 0, PCRE.i },
    [byte "s"] = { 0, PCRE.s },
    [byte "m"] = { 0, PCRE.m },
    [byte "u"] = { 0, PCRE.u },
    [byte "U"] = { FLAG_NO_UTF8_CHECK, PCRE.u },
    [byte "x"] = { 0, PCRE.x },
    [byte "d"] = { FLAG_DFA, 0 },
    [byte "a"] = { 0, PCRE.a },
    [byte "D"] = { FLAG_DUPNAMES, PCRE.D },
    [byte "J"] = { 0, PCRE.J },
}

local c_str = ffi.typeof("const char *")
local int_out = ffi_new("int[1]")
local table_out = ffi_new("const unsigned char *[1]")

local function info(code, what)
    backend_info(code, what, int_out)
    return int_out[0]
end

-- A JIT stack growing from min to max bytes, freed by the collector; nil
-- when PCRE cannot allocate it.
local function new_jit_stack(min, max)
    local stack = jit_stack_create(min, max)
    if stack == nil then
        return nil
    end
    return ffi_gc(stack, jit_stack_free)
end

-- On failure PCRE uses the machine stack (nil here).
local jit_stack = new_jit_stack(JIT_STACK_SIZE, JIT_STACK_SIZE)

local parsed_opts = {} -- opts string -> { flags, PCRE options }

-- Errors name the caller of the ngx.re function (this is called from it).
local function parse_opts(opts)
    if not opts then
        return 0, 0
    end
    local t = parsed_opts[opts]
    if t then
        return t[1], t[2]
    end
    local flags, pcre_opts = 0, 0
    for i = 1, #opts do
        local o = OPTIONS[byte(opts, i)]
        if not o then
            error(fmt('unknown flag "%s" (flags "%s")', sub(opts, i, i), opts),
                  3)
        end
        flags = bor(flags, o[1])
        pcre_opts = bor(pcre_opts, o[2])
    end
    parsed_opts[opts] = { flags, pcre_opts }
    return flags, pcre_opts
end

-- The `o` cache: two generations of at most half the entries each; a hit
-- in the old one moves to the new one, and the old one is dropped when the
-- new one fills up. The collector frees the dropped patterns.
local cache_half = max_cache > 0 and ceil(max_cache / 2) or 0
local cache_new, cache_old, cache_n = {}, {}, 0

local function cache_put(key, compiled)
    if cache_n >= cache_half then
        cache_old, cache_new, cache_n = cache_new, {}, 0
    end
    cache_new[key] = compiled
    cache_n = cache_n + 1
end

local function cache_get(key)
    local compiled = cache_new[key]
    if compiled == nil then
        compiled = cache_old[key]
        if compiled ~= nil then
            cache_put(key, compiled)
        end
    end
    return compiled
end

local function log_err(msg)
    ngx.log(ngx.ERR, msg)
end

-- A replacement template as lua-nginx-module compiles it: a list of
-- literal strings and capture numbers (doubled: offsets into the ovector).
-- Named captures are not supported there, so not here either.
local DOLLAR, LBRACE, RBRACE = byte "$", byte "{", byte "}"

local function is_digit(c)
    return c >= 48 and c <= 57
end

local function is_word(c)
    return is_digit(c) or c == 95 or (c >= 65 and c <= 90)
        or (c >= 97 and c <= 122)
end

-- 2 * n of a decimal capture number, wrapping at 64 bits as nginx's
-- ngx_uint_t arithmetic does.
local function capture_offset(digits)
    if #digits <= 15 then
        return 2 * tonumber(digits)
    end
    local n = 0ULL
    for i = 1, #digits do
        n = n * 10 + (byte(digits, i) - 48)
    end
    n = n * 2
    return n < 0x7fffffffULL and tonumber(n) or 1 / 0
end

local function compile_template(tpl)
    if not find(tpl, "$", 1, true) then
        return { tpl }
    end
    local parts, np = {}, 0
    local i, len = 1, #tpl
    local invalid = 'lua script: invalid capturing variable name found in "'
        .. tpl .. '"'
    while i <= len do
        if byte(tpl, i) ~= DOLLAR then
            local j = find(tpl, "$", i, true) or len + 1
            np = np + 1
            parts[np] = sub(tpl, i, j - 1)
            i = j
        else
            i = i + 1
            if i > len then
                return nil, invalid
            end
            local c = byte(tpl, i)
            if c == DOLLAR then
                np = np + 1
                parts[np] = "$"
                i = i + 1
            else
                local bracket = c == LBRACE
                if bracket then
                    i = i + 1
                    if i > len then
                        return nil, invalid
                    end
                    c = byte(tpl, i)
                end
                local numeric = is_digit(c)
                local start, stop = i, nil
                while i <= len do
                    c = byte(tpl, i)
                    if bracket and c == RBRACE then
                        stop = i
                        i = i + 1
                        bracket = false
                        break
                    end
                    if numeric and not is_digit(c)
                       or not numeric and not is_word(c)
                    then
                        break
                    end
                    i = i + 1
                end
                stop = stop or i
                local name = sub(tpl, start, stop - 1)
                if bracket then
                    return nil, 'the closing bracket in "' .. name
                        .. '" variable is missing'
                end
                if name == "" then
                    return nil, invalid
                end
                if not numeric then
                    return nil, 'attempt to use named capturing variable "'
                        .. name .. '" (named captures not supported yet)'
                end
                np = np + 1
                parts[np] = capture_offset(name)
            end
        end
    end
    return parts
end

local function compile_error(regex, msg, offset)
    local err = backend.COMPILE_FAILED .. msg .. ' in "' .. regex .. '"'
    if offset ~= #regex then
        err = err .. ' at "' .. ffi_string(ffi_cast(c_str, regex) + offset)
            .. '"'
    end
    err = sub(err, 1, max_err_len)
    local nul = find(err, "\0", 1, true)
    return nul and sub(err, 1, nul - 1) or err
end

-- Compiles regex (and the template `replace` when given) into a table;
-- returns it, or nil and the error text.
local function compile(regex, flags, pcre_opts, replace)
    local code, msg, offset = backend_compile(regex, pcre_opts)
    if not code then
        return nil, compile_error(regex, msg, offset)
    end

    local dfa = band(flags, FLAG_DFA) ~= 0
    local extra = backend_prepare(code, band(flags, FLAG_JIT) ~= 0, dfa,
                                  jit_stack)
    local ncap = dfa and 0 or info(code, "capturecount")
    local ovecsize = dfa and 2 or (ncap + 1) * backend.OVEC_INTS

    -- Named groups as a flat list: number, name, number, name...
    local names
    local name_count = info(code, "namecount")
    if name_count > 0 then
        local entry_size = info(code, "nameentrysize")
        backend_info(code, "nametable", table_out)
        local entry = table_out[0]
        names = new_tab(2 * name_count, 0)
        for k = 0, name_count - 1 do
            names[2 * k + 1] = entry[0] * 256 + entry[1]
            names[2 * k + 2] = ffi_string(entry + 2)
            entry = entry + entry_size
        end
    end

    local tpl
    if replace then
        local err
        tpl, err = compile_template(replace)
        if not tpl then
            log_err(err)
            return nil, "failed to compile the replacement template"
        end
    end

    return {
        code = code,
        extra = extra,
        dfa = dfa,
        exec_opts = band(flags, FLAG_NO_UTF8_CHECK) ~= 0
                    and backend.NO_UTF8_CHECK or 0,
        ncap = ncap,
        ovec = ffi_new("int[?]", ovecsize),
        ovecsize = ovecsize,
        names = names,
        name_count = name_count,
        dupnames = band(flags, FLAG_DUPNAMES) ~= 0,
        tpl = tpl,
        -- keeps the JIT stack it was given alive as long as the pattern
        jit_stack = jit_stack,
    }
end

-- The compiled pattern for regex with opts; `kind` keeps the patterns of
-- match/find/gmatch, of sub with a function and of sub with a template
-- apart, as lua-resty-core does (a replacement callback may use ngx.re).
local KIND_MATCH, KIND_FUNC, KIND_TEMPLATE = "\0", "\1", "\2"

local function get_compiled(kind, regex, opts, flags, pcre_opts, replace)
    if band(flags, FLAG_COMPILE_ONCE) == 0 or cache_half == 0 then
        return compile(regex, flags, pcre_opts, replace)
    end
    -- opts holds option letters only, so kind ends it unambiguously.
    local key = opts .. kind .. regex
    if kind == KIND_TEMPLATE then
        key = opts .. kind .. #regex .. "\0" .. regex .. replace
    end
    local compiled = cache_get(key)
    if compiled then
        return compiled
    end
    local err
    compiled, err = compile(regex, flags, pcre_opts, replace)
    if compiled then
        cache_put(key, compiled)
    end
    return compiled, err
end

local exec = backend.exec

-- The captures table of a match (rc as PCRE returned it, 0 made 1).
local function collect(compiled, rc, subj, res)
    local cap = compiled.ovec
    local ncap = compiled.ncap
    if not res then
        res = new_tab(ncap, compiled.name_count)
    end
    for i = 0, ncap do
        -- i == rc reads a pair PCRE has unset, as lua-resty-core does.
        if i > rc then
            res[i] = false
        else
            local from = cap[2 * i]
            if from >= 0 then
                res[i] = sub(subj, from + 1, cap[2 * i + 1])
            else
                res[i] = false
            end
        end
    end
    local names = compiled.names
    if names then
        if compiled.dupnames then
            -- all matched groups of a name, in order; unmatched ones skipped
            for k = 1, #names, 2 do
                local value = res[names[k]]
                if value then
                    local name = names[k + 1]
                    local list = res[name]
                    if list then
                        list[#list + 1] = value
                    else
                        res[name] = { value }
                    end
                end
            end
        else
            for k = 1, #names, 2 do
                res[names[k + 1]] = res[names[k]]
            end
        end
    end
    return res
end

local function exec_error(rc)
    return "pcre_exec() failed: " .. rc
end

local SMALL_OVECTOR = "capture size too small"

-- match (want_caps) and find.
local function match_helper(subj, regex, opts, flags, pcre_opts, ctx,
                            want_caps, res, nth)
    subj = tostring(subj)
    local compiled, err = get_compiled(KIND_MATCH, regex, opts, flags,
                                       pcre_opts)
    if not compiled then
        if want_caps then
            return nil, err
        end
        return nil, nil, err
    end

    local pos = 0
    if ctx then
        pos = ctx.pos
        if not pos or pos <= 0 then
            pos = 0
        else
            pos = pos - 1
        end
    end

    local rc = exec(compiled, subj, #subj, pos)
    if rc == PCRE_ERROR_NOMATCH then
        return nil
    end
    if rc < 0 or rc == 0 and not compiled.dfa then
        err = rc < 0 and exec_error(rc) or SMALL_OVECTOR
        if want_caps then
            return nil, err
        end
        return nil, nil, err
    end
    if rc == 0 then
        rc = 1
    end

    local cap = compiled.ovec
    if ctx then
        ctx.pos = cap[1] + 1
    end

    if not want_caps then
        if not nth or nth < 0 then
            nth = 0
        end
        if nth > compiled.ncap then
            return nil, nil, "nth out of bound"
        end
        if nth >= rc then
            return nil, nil
        end
        local from = cap[nth * 2] + 1
        local to = cap[nth * 2 + 1]
        if from < 0 or to < 0 then
            return nil, nil
        end
        return from, to
    end

    return collect(compiled, rc, subj, res)
end

local re = {}

function re.match(subj, regex, opts, ctx, res)
    local flags, pcre_opts = parse_opts(opts)
    return match_helper(subj, regex, opts or "", flags, pcre_opts, ctx, true,
                        res)
end

function re.find(subj, regex, opts, ctx, nth)
    local flags, pcre_opts = parse_opts(opts)
    return match_helper(subj, regex, opts or "", flags, pcre_opts, ctx, false,
                        nil, nth)
end

do
    local function exhaust(it)
        it._compiled = nil
        it._subj = nil
        it._pos = nil
    end

    local function iterate(it)
        local pos = it._pos
        if not pos then
            return nil
        end
        local compiled, subj, len = it._compiled, it._subj, it._subj_len

        local rc = exec(compiled, subj, len, pos)
        if rc == PCRE_ERROR_NOMATCH then
            exhaust(it)
            return nil
        end
        if rc < 0 then
            exhaust(it)
            return nil, exec_error(rc)
        end
        if rc == 0 then
            if not compiled.dfa then
                exhaust(it)
                return nil, SMALL_OVECTOR
            end
            rc = 1
        end

        local cap = compiled.ovec
        local next_pos = cap[1]
        if next_pos == cap[0] then
            -- empty match: step over one byte; past the end, this is the
            -- last match
            next_pos = next_pos + 1
            if next_pos > len then
                local res = collect(compiled, rc, subj)
                exhaust(it)
                return res
            end
        end
        it._pos = next_pos
        return collect(compiled, rc, subj)
    end

    local iterator_mt = { __call = iterate }

    function re.gmatch(subj, regex, opts)
        local flags, pcre_opts = parse_opts(opts)
        subj = tostring(subj)
        local compiled, err = get_compiled(KIND_MATCH, regex, opts or "", flags,
                                           pcre_opts)
        if not compiled then
            return nil, err
        end
        return setmetatable({
            _compiled = compiled,
            _subj = subj,
            _subj_len = #subj,
            _pos = 0,
        }, iterator_mt)
    end
end

-- Appends the expansion of a compiled template for one match.
local function expand(buf, parts, cap, rc, subj)
    local limit = rc * 2
    for k = 1, #parts do
        local part = parts[k]
        if type(part) == "string" then
            buf:put(part)
        elseif part < limit then
            local from = cap[part]
            if from >= 0 then
                buf:put(sub(subj, from + 1, cap[part + 1]))
            end
        end
    end
end

local function sub_helper(subj, regex, replace, opts, flags, pcre_opts,
                          global)
    local func = type(replace) == "function"
    if not func and type(replace) ~= "string" then
        replace = tostring(replace)
    end

    local compiled, err
    if func then
        compiled, err = get_compiled(KIND_FUNC, regex, opts, flags,
                                     pcre_opts)
    else
        compiled, err = get_compiled(KIND_TEMPLATE, regex, opts, flags,
                                     pcre_opts, replace)
    end
    if not compiled then
        return nil, nil, err
    end

    subj = tostring(subj)
    local len = #subj
    local count, pos, copied = 0, 0, 0
    local buf -- created at the first match: a callback may call gsub

    while true do
        local rc = exec(compiled, subj, len, pos)
        if rc == PCRE_ERROR_NOMATCH then
            break
        end
        if rc < 0 then
            return nil, nil, exec_error(rc)
        end
        if rc == 0 then
            if not compiled.dfa then
                return nil, nil, SMALL_OVECTOR
            end
            rc = 1
        end

        count = count + 1
        buf = buf or buffer.new()
        local cap = compiled.ovec
        local prefix = cap[0] - copied
        if func then
            local piece = tostring(replace(collect(compiled, rc, subj)))
            if prefix > 0 then
                buf:putcdata(ffi_cast(c_str, subj) + copied, prefix)
            end
            buf:put(piece)
        else
            if prefix > 0 then
                buf:putcdata(ffi_cast(c_str, subj) + copied, prefix)
            end
            expand(buf, compiled.tpl, cap, rc, subj)
        end

        -- read after the callback, which may have reused the pattern, as
        -- lua-resty-core does
        copied = cap[1]
        pos = copied
        if pos == cap[0] then
            pos = pos + 1
            if pos > len then
                break
            end
        end

        if not global then
            break
        end
    end

    if count == 0 then
        return subj, 0
    end
    if copied < len then
        buf:putcdata(ffi_cast(c_str, subj) + copied, len - copied)
    end
    return buf:tostring(), count
end

function re.sub(subj, regex, replace, opts)
    local flags, pcre_opts = parse_opts(opts)
    return sub_helper(subj, regex, replace, opts or "", flags, pcre_opts,
                      false)
end

function re.gsub(subj, regex, replace, opts)
    local flags, pcre_opts = parse_opts(opts)
    return sub_helper(subj, regex, replace, opts or "", flags, pcre_opts,
                      true)
end

-- For the `ngx.re` module (ngx_re_module.lua): split and opt.
local internal = {
    parse_opts = parse_opts,
    exec = exec,
    exec_error = exec_error,
    SMALL_OVECTOR = SMALL_OVECTOR,
}

function internal.compile(regex, opts)
    local flags, pcre_opts = parse_opts(opts)
    return get_compiled(KIND_MATCH, regex, opts or "", flags, pcre_opts)
end

function internal.cache_empty()
    return next(cache_new) == nil and next(cache_old) == nil
end

-- The JIT stack of patterns compiled from now on, at least 32 KiB as in
-- lua-nginx-module; nil and an error if PCRE cannot allocate it.
function internal.set_jit_stack_size(size)
    local stack = new_jit_stack(JIT_STACK_SIZE, size < JIT_STACK_SIZE
                                                and JIT_STACK_SIZE or size)
    if not stack then
        return nil, "pcre jit stack allocation failed"
    end
    jit_stack = stack
    return true
end

return re, internal
