-- The PCRE1 backend of ngx_re.lua (libpcre.so.3's API), for a lua-nginx-module
-- whose ngx.re runs on PCRE 8.x; ngx_re_pcre2.lua is the other one. Each
-- gives ngx_re.lua the same small interface: option bits, compile, info,
-- prepare (JIT, match limit), exec filling an int ovector, JIT stacks.
local sym, match_limit = ...

local ffi = require "ffi"
local bit = require "bit"

local ffi_cast = ffi.cast
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local ffi_string = ffi.string
local bor = bit.bor

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

-- sym raises an error naming the library when it lacks the name.
local function pcre_fn(name, ctype)
    return ffi_cast(ctype, sym(name))
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

local PCRE_STUDY_JIT_COMPILE = 0x0001
local PCRE_EXTRA_MATCH_LIMIT = 0x0002
local INFO = {
    capturecount = 2,
    nameentrysize = 7,
    namecount = 8,
    nametable = 9,
}
-- As lua-nginx-module: a DFA workspace of 100 ints.
local DFA_WORKSPACE = 100

local err_ptr = ffi_new("const char *[1]")
local err_offset = ffi_new("int[1]")
local dfa_ws = ffi_new("int[?]", DFA_WORKSPACE)

local B = {
    COMPILE_FAILED = "pcre_compile() failed: ",
    -- option letter -> PCRE option bits, as lua-resty-core passes them
    OPTS = {
        i = 0x0000001,
        m = 0x0000002,
        s = 0x0000004,
        x = 0x0000008,
        a = 0x0000010,
        u = 0x0000800,
        D = 0x0080000,
        J = 0x2000000,
    },
    NO_UTF8_CHECK = 0x0002000,
    -- ints of ovector per capture (PCRE1 uses the last third as workspace)
    OVEC_INTS = 3,
}

-- The compiled pattern, or nil, PCRE's message and the error's offset.
function B.compile(regex, opts)
    local code = pcre_compile(regex, opts, err_ptr, err_offset, nil)
    if code == nil then
        return nil, ffi_string(err_ptr[0]), err_offset[0]
    end
    return ffi_gc(code, pcre_free)
end

-- Writes the pattern's `what` (capturecount, namecount, nameentrysize:
-- int; nametable: const unsigned char *) to out[0].
function B.info(code, what, out)
    pcre_fullinfo(code, nil, INFO[what], out)
end

-- The study data exec needs (nil when studying learnt nothing), JIT
-- compiled on request, with the JIT stack and (as lua-nginx-module does,
-- only for a studied, non-DFA pattern) the match limit.
function B.prepare(code, jit, dfa, jit_stack)
    local sd = pcre_study(code, jit and PCRE_STUDY_JIT_COMPILE or 0, err_ptr)
    if sd == nil then
        return nil
    end
    ffi_gc(sd, pcre_free_study)
    if jit_stack then
        pcre_assign_jit_stack(sd, nil, jit_stack)
    end
    if match_limit > 0 and not dfa then
        sd.flags = bor(sd.flags, PCRE_EXTRA_MATCH_LIMIT)
        sd.match_limit = match_limit
    end
    return sd
end

function B.exec(c, subj, len, pos)
    if c.dfa then
        return pcre_dfa_exec(c.code, c.extra, subj, len, pos, c.exec_opts,
                             c.ovec, 2, dfa_ws, DFA_WORKSPACE)
    end
    return pcre_exec(c.code, c.extra, subj, len, pos, c.exec_opts, c.ovec,
                     c.ovecsize)
end

-- JIT stacks growing from min to max bytes (nil when out of memory).
B.jit_stack_create = pcre_jit_stack_alloc
B.jit_stack_free = pcre_jit_stack_free

return B
