-- The PCRE2 backend of ngx_re.lua (libpcre2-8.so.0's API), for a
-- lua-nginx-module whose ngx.re runs on PCRE2 (0.10.24 and later with an
-- nginx built with PCRE2); the interface is ngx_re_pcre1.lua's. As in
-- lua-nginx-module, the match limit and the JIT stack live in one match
-- context and the ovector in one match data (grown as patterns need), both
-- this state's own.
local sym, match_limit = ...

local ffi = require "ffi"

local ffi_cast = ffi.cast
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local ffi_string = ffi.string
local tonumber = tonumber

ffi.cdef [[
typedef struct ngx_tp_pcre2_code_s ngx_tp_pcre2_code;
typedef struct ngx_tp_pcre2_match_data_s ngx_tp_pcre2_match_data;
typedef struct ngx_tp_pcre2_match_context_s ngx_tp_pcre2_match_context;
typedef struct ngx_tp_pcre2_jit_stack_s ngx_tp_pcre2_jit_stack;
]]

-- The 8-bit library's functions carry the suffix _8 (pcre2.h's macros).
local function pcre2_fn(name, ctype)
    return ffi_cast(ctype, sym(name .. "_8"))
end

local pcre2_compile = pcre2_fn("pcre2_compile", "ngx_tp_pcre2_code *(*)("
    .. "const char *, size_t, int, int *, size_t *, void *)")
local pcre2_code_free = pcre2_fn("pcre2_code_free",
    "void (*)(ngx_tp_pcre2_code *)")
local pcre2_get_error_message = pcre2_fn("pcre2_get_error_message",
    "int (*)(int, char *, size_t)")
local pcre2_pattern_info = pcre2_fn("pcre2_pattern_info",
    "int (*)(const ngx_tp_pcre2_code *, int, void *)")
local pcre2_jit_compile = pcre2_fn("pcre2_jit_compile",
    "int (*)(ngx_tp_pcre2_code *, int)")
local pcre2_match = pcre2_fn("pcre2_match", "int (*)("
    .. "const ngx_tp_pcre2_code *, const char *, size_t, size_t, int,"
    .. " ngx_tp_pcre2_match_data *, ngx_tp_pcre2_match_context *)")
local pcre2_dfa_match = pcre2_fn("pcre2_dfa_match", "int (*)("
    .. "const ngx_tp_pcre2_code *, const char *, size_t, size_t, int,"
    .. " ngx_tp_pcre2_match_data *, ngx_tp_pcre2_match_context *, int *,"
    .. " size_t)")
local pcre2_match_data_create = pcre2_fn("pcre2_match_data_create",
    "ngx_tp_pcre2_match_data *(*)(int, void *)")
local pcre2_match_data_free = pcre2_fn("pcre2_match_data_free",
    "void (*)(ngx_tp_pcre2_match_data *)")
local pcre2_get_ovector_pointer = pcre2_fn("pcre2_get_ovector_pointer",
    "size_t *(*)(ngx_tp_pcre2_match_data *)")
local pcre2_match_context_create = pcre2_fn("pcre2_match_context_create",
    "ngx_tp_pcre2_match_context *(*)(void *)")
local pcre2_match_context_free = pcre2_fn("pcre2_match_context_free",
    "void (*)(ngx_tp_pcre2_match_context *)")
local pcre2_set_match_limit = pcre2_fn("pcre2_set_match_limit",
    "int (*)(ngx_tp_pcre2_match_context *, int)")
local pcre2_jit_stack_create = pcre2_fn("pcre2_jit_stack_create",
    "ngx_tp_pcre2_jit_stack *(*)(size_t, size_t, void *)")
local pcre2_jit_stack_free = pcre2_fn("pcre2_jit_stack_free",
    "void (*)(ngx_tp_pcre2_jit_stack *)")
local pcre2_jit_stack_assign = pcre2_fn("pcre2_jit_stack_assign",
    "void (*)(ngx_tp_pcre2_match_context *, void *, ngx_tp_pcre2_jit_stack *)")

local PCRE2_JIT_COMPLETE = 0x1
local INFO = {
    capturecount = 4,
    namecount = 17,
    nameentrysize = 18,
    nametable = 19,
}
-- As lua-nginx-module: a DFA workspace of 100 ints, messages of at most
-- 128 bytes.
local DFA_WORKSPACE = 100
local ERR_MSG_SIZE = 128

local err_code = ffi_new("int[1]")
local err_offset = ffi_new("size_t[1]")
local err_msg = ffi_new("char[?]", ERR_MSG_SIZE)
local dfa_ws = ffi_new("int[?]", DFA_WORKSPACE)

local match_context = ffi_gc(pcre2_match_context_create(nil),
                             pcre2_match_context_free)
if match_limit > 0 then
    pcre2_set_match_limit(match_context, match_limit)
end

local match_data, match_data_pairs = nil, 0

local B = {
    COMPILE_FAILED = "pcre2_compile() failed: ",
    -- option letter -> PCRE2 option bits, as lua-resty-core passes them
    -- (J is the three options PCRE2 split PCRE_JAVASCRIPT_COMPAT into)
    OPTS = {
        i = 0x00000008,
        m = 0x00000400,
        s = 0x00000020,
        x = 0x00000080,
        a = 0x80000000,
        u = 0x00080000,
        D = 0x00000040,
        J = 0x00000203,
    },
    NO_UTF8_CHECK = 0x40000000,
    -- the ovector handed to ngx_re.lua: start and end per capture
    OVEC_INTS = 2,
}

-- The compiled pattern, or nil, PCRE2's message and the error's offset.
function B.compile(regex, opts)
    local code = pcre2_compile(regex, #regex, opts, err_code, err_offset, nil)
    if code == nil then
        pcre2_get_error_message(err_code[0], err_msg, ERR_MSG_SIZE)
        return nil, ffi_string(err_msg), tonumber(err_offset[0])
    end
    return ffi_gc(code, pcre2_code_free)
end

-- Writes the pattern's `what` (capturecount, namecount, nameentrysize:
-- int; nametable: const unsigned char *) to out[0].
function B.info(code, what, out)
    pcre2_pattern_info(code, INFO[what], out)
end

-- Nothing per pattern: JIT compiled on request (a failure leaves the
-- interpreter, as lua-nginx-module ignores it); the JIT stack goes to the
-- match context, which every pattern matches with.
function B.prepare(code, jit, _, jit_stack)
    if jit then
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE)
    end
    if jit_stack then
        pcre2_jit_stack_assign(match_context, nil, jit_stack)
        -- held while the context uses it: the patterns compiled with it
        -- may all be gone
        B.context_jit_stack = jit_stack
    end
    return nil
end

function B.exec(c, subj, len, pos)
    local npairs = c.dfa and 1 or c.ncap + 1
    if npairs > match_data_pairs then
        match_data = ffi_gc(pcre2_match_data_create(npairs, nil),
                            pcre2_match_data_free)
        match_data_pairs = npairs
    end
    local rc
    if c.dfa then
        rc = pcre2_dfa_match(c.code, subj, len, pos, c.exec_opts, match_data,
                             match_context, dfa_ws, DFA_WORKSPACE)
    else
        rc = pcre2_match(c.code, subj, len, pos, c.exec_opts, match_data,
                         match_context)
    end
    if rc < 0 then
        return rc
    end
    -- offsets into the int ovector with C's conversion, as
    -- lua-nginx-module copies them (PCRE2_UNSET becomes -1)
    local ov = pcre2_get_ovector_pointer(match_data)
    local cap = c.ovec
    for i = 0, 2 * npairs - 1 do
        cap[i] = ov[i]
    end
    return rc
end

-- JIT stacks growing from min to max bytes (nil when out of memory).
function B.jit_stack_create(min, max)
    return pcre2_jit_stack_create(min, max, nil)
end

B.jit_stack_free = pcre2_jit_stack_free

return B
