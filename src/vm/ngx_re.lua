-- ngx.re of a pool thread: match, find, gmatch, sub and gsub with the results
-- of lua-resty-core's ngx.re over lua-nginx-module 0.10.23, computed with the
-- same PCRE (libpcre.so.3) through a private copy of it (see ngx_re.rs).
-- Compiled patterns, their cache and the PCRE JIT stack belong to the state
-- of one thread: nothing here is shared with another thread.
local sym, max_cache, match_limit, ngx = ...

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

if type(sym) ~= "function" then
    -- libpcre.so.3 did not load: say so where ngx.re is used, as OpenResty
    -- does when built without PCRE.
    return setmetatable({}, { __index = function(_, key)
        error("no support for 'ngx.re." .. tostring(key) .. "': " .. sym, 2)
    end })
end

ffi.cdef [[
typedef struct ngx_tp_pcre_s ngx_tp_pcre;
/* pcre_extra of pcre.h: the match limit is set through it. */
typedef struct ngx_tp_pcre_extra_s {
    unsigned long flags;
    void *study_data;
    unsigned long match_limit;
    void *callout_data;
    const unsigned char *tables;
    unsigned long match_limit_recursion;
    unsigned char **mark;
    void *executable_jit;
} ngx_tp_pcre_extra;
typedef struct ngx_tp_pcre_jit_stack_s ngx_tp_pcre_jit_stack;
]]

local function pcre_fn(name, ctype)
    local p = sym(name)
    if p == nil then
        error("libpcre.so.3 has no " .. name)
    end
    return ffi_cast(ctype, p)
end

local pcre_compile = pcre_fn("pcre_compile", "ngx_tp_pcre *(*)(const char *,"
    .. " int, const char **, int *, const unsigned char *)")
local pcre_study = pcre_fn("pcre_study", "ngx_tp_pcre_extra *(*)("
    .. "const ngx_tp_pcre *, int, const char **)")
local pcre_free_study = pcre_fn("pcre_free_study",
    "void (*)(ngx_tp_pcre_extra *)")
local pcre_exec = pcre_fn("pcre_exec", "int (*)(const ngx_tp_pcre *,"
    .. " const ngx_tp_pcre_extra *, const char *, int, int, int, int *, int)")
local pcre_dfa_exec = pcre_fn("pcre_dfa_exec", "int (*)(const ngx_tp_pcre *,"
    .. " const ngx_tp_pcre_extra *, const char *, int, int, int, int *, int,"
    .. " int *, int)")
local pcre_fullinfo = pcre_fn("pcre_fullinfo", "int (*)(const ngx_tp_pcre *,"
    .. " const ngx_tp_pcre_extra *, int, void *)")
local pcre_jit_stack_alloc = pcre_fn("pcre_jit_stack_alloc",
    "ngx_tp_pcre_jit_stack *(*)(int, int)")
local pcre_jit_stack_free = pcre_fn("pcre_jit_stack_free",
    "void (*)(ngx_tp_pcre_jit_stack *)")
local pcre_assign_jit_stack = pcre_fn("pcre_assign_jit_stack",
    "void (*)(ngx_tp_pcre_extra *, void *, ngx_tp_pcre_jit_stack *)")
-- pcre_free is a variable holding the deallocator.
local pcre_free = pcre_fn("pcre_free", "void (**)(void *)")[0]

-- Our flags (lua-resty-core's values) and PCRE's option bits.
local FLAG_COMPILE_ONCE = 0x01
local FLAG_DFA = 0x02
local FLAG_JIT = 0x04
local FLAG_DUPNAMES = 0x08
local FLAG_NO_UTF8_CHECK = 0x10

local PCRE_CASELESS = 0x0000001
local PCRE_MULTILINE = 0x0000002
local PCRE_DOTALL = 0x0000004
local PCRE_EXTENDED = 0x0000008
local PCRE_ANCHORED = 0x0000010
local PCRE_NO_UTF8_CHECK = 0x0002000
local PCRE_UTF8 = 0x0000800
local PCRE_DUPNAMES = 0x0080000
local PCRE_JAVASCRIPT_COMPAT = 0x2000000

local PCRE_STUDY_JIT_COMPILE = 0x0001
local PCRE_EXTRA_MATCH_LIMIT = 0x0002
local PCRE_INFO_CAPTURECOUNT = 2
local PCRE_INFO_NAMEENTRYSIZE = 7
local PCRE_INFO_NAMECOUNT = 8
local PCRE_INFO_NAMETABLE = 9
local PCRE_ERROR_NOMATCH = -1

-- As lua-nginx-module: error text capped at 127 bytes, DFA workspace of
-- 100 ints, and 32 KiB of JIT stack (what PCRE uses on the machine stack
-- when no stack is assigned, as in OpenResty by default).
local MAX_ERR_LEN = 127
local DFA_WORKSPACE = 100
local JIT_STACK_SIZE = 32 * 1024

-- option letter -> { our flags, PCRE options }
local OPTIONS = {
    [byte "o"] = { FLAG_COMPILE_ONCE, 0 },
    [byte "j"] = { FLAG_JIT, 0 },
    [byte "i"] = { 0, PCRE_CASELESS },
    [byte "s"] = { 0, PCRE_DOTALL },
    [byte "m"] = { 0, PCRE_MULTILINE },
    [byte "u"] = { 0, PCRE_UTF8 },
    [byte "U"] = { FLAG_NO_UTF8_CHECK, PCRE_UTF8 },
    [byte "x"] = { 0, PCRE_EXTENDED },
    [byte "d"] = { FLAG_DFA, 0 },
    [byte "a"] = { 0, PCRE_ANCHORED },
    [byte "D"] = { FLAG_DUPNAMES, PCRE_DUPNAMES },
    [byte "J"] = { 0, PCRE_JAVASCRIPT_COMPAT },
}

local err_ptr = ffi_new("const char *[1]")
local int_out = ffi_new("int[1]")
local table_out = ffi_new("const unsigned char *[1]")
local dfa_ws = ffi_new("int[?]", DFA_WORKSPACE)
local c_str = ffi.typeof("const char *")

-- On failure PCRE uses the machine stack (nil here: a NULL cdata is true).
local function new_jit_stack(size)
    local stack = pcre_jit_stack_alloc(JIT_STACK_SIZE, size)
    if stack == nil then
        return nil
    end
    return ffi_gc(stack, pcre_jit_stack_free)
end

local jit_stack = new_jit_stack(JIT_STACK_SIZE)

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
    local err = 'pcre_compile() failed: ' .. msg .. ' in "' .. regex .. '"'
    if offset ~= #regex then
        err = err .. ' at "' .. ffi_string(ffi_cast(c_str, regex) + offset)
            .. '"'
    end
    err = sub(err, 1, MAX_ERR_LEN)
    local nul = find(err, "\0", 1, true)
    return nul and sub(err, 1, nul - 1) or err
end

-- Compiles regex (and the template `replace` when given) into a table;
-- returns it, or nil and the error text.
local function compile(regex, flags, pcre_opts, replace)
    local re = pcre_compile(regex, pcre_opts, err_ptr, int_out, nil)
    if re == nil then
        return nil, compile_error(regex, ffi_string(err_ptr[0]), int_out[0])
    end
    ffi_gc(re, pcre_free)

    local sd = pcre_study(re, band(flags, FLAG_JIT) ~= 0
                              and PCRE_STUDY_JIT_COMPILE or 0, err_ptr)
    if sd ~= nil then
        ffi_gc(sd, pcre_free_study)
        if jit_stack then
            pcre_assign_jit_stack(sd, nil, jit_stack)
        end
        -- As lua-nginx-module: only a studied, non-DFA pattern has a limit.
        if match_limit > 0 and band(flags, FLAG_DFA) == 0 then
            sd.flags = bor(sd.flags, PCRE_EXTRA_MATCH_LIMIT)
            sd.match_limit = match_limit
        end
    else
        sd = nil -- nothing learned by studying
    end

    local dfa = band(flags, FLAG_DFA) ~= 0
    local ncap = 0
    if not dfa then
        pcre_fullinfo(re, nil, PCRE_INFO_CAPTURECOUNT, int_out)
        ncap = int_out[0]
    end
    local ovecsize = dfa and 2 or (ncap + 1) * 3

    -- Named groups as a flat list: number, name, number, name...
    local names
    pcre_fullinfo(re, nil, PCRE_INFO_NAMECOUNT, int_out)
    local name_count = int_out[0]
    if name_count > 0 then
        pcre_fullinfo(re, nil, PCRE_INFO_NAMEENTRYSIZE, int_out)
        local entry_size = int_out[0]
        pcre_fullinfo(re, nil, PCRE_INFO_NAMETABLE, table_out)
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
        re = re,
        sd = sd,
        dfa = dfa,
        exec_opts = band(flags, FLAG_NO_UTF8_CHECK) ~= 0
                    and PCRE_NO_UTF8_CHECK or 0,
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

local function exec(compiled, subj, len, pos)
    if compiled.dfa then
        return pcre_dfa_exec(compiled.re, compiled.sd, subj, len, pos,
                             compiled.exec_opts, compiled.ovec, 2, dfa_ws,
                             DFA_WORKSPACE)
    end
    return pcre_exec(compiled.re, compiled.sd, subj, len, pos,
                     compiled.exec_opts, compiled.ovec, compiled.ovecsize)
end

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
    local stack = new_jit_stack(size < JIT_STACK_SIZE and JIT_STACK_SIZE
                                or size)
    if not stack then
        return nil, "pcre jit stack allocation failed"
    end
    jit_stack = stack
    return true
end

return re, internal
