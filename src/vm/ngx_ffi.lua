-- The request-free ngx API of a pool thread that lua-resty-core builds on
-- the event loop over lua-nginx-module's exported FFI functions: hashes,
-- base64, URI escaping, time, ngx.worker and the shared dict methods. This
-- file calls the same C functions with the same argument handling, so a
-- call returns in a thread what it returns on the event loop.
--
-- Thread safety (pool threads run beside the event loop in one process),
-- checked against the 0.10.23 and nginx 1.22 sources:
-- * md5, md5_bin, sha1_bin, crc32_*, base64, escape/unescape_uri: pure
--   functions of their arguments; their tables (base64 alphabet, escape
--   bitmaps, CRC tables) are read-only after nginx starts; hashing uses a
--   context on the stack. No request, no pool, no static output buffer:
--   each Lua state passes its own buffer.
-- * now, time, today, localtime, utctime: read ngx_cached_time, which the
--   event loop moves between 64 slots and publishes after a memory barrier,
--   so a reader sees a consistent slot (nginx's own design for readers on
--   other threads and in signal handlers). The cached time is as fresh as
--   the event loop's last wake-up; update_time refreshes it.
-- * update_time: ngx_time_update, which nginx guards with a trylock because
--   "the time may be updated by signal handler or by several threads"
--   (ngx_times.c); a thread that loses the race keeps the current value.
--   It also stores ngx_current_msec, the event loop's timer clock: an
--   aligned word written with a later monotonic value, which the event loop
--   would have stored itself at its next wake-up.
-- * http_time, cookie_time, parse_http_time: arithmetic on the argument
--   and read-only month/day name tables.
-- * worker.pid, id, count: values the event loop took at init_process
--   (prim); worker.exiting reads the ngx_exiting flag, which only the event
--   loop sets (a word-sized read).
-- * shared dicts: every function locks the zone's ngx_shmtx before it
--   touches the dict and unlocks it before returning. The lock is a CAS of
--   the word from 0 to ngx_pid and a CAS back to 0 by the holder, so a
--   second thread of the same process spins and sleeps on the semaphore
--   exactly as another process would: the pid is only used to clean up
--   after a crashed process, never as recursion ownership. Memory comes from
--   the zone's slab (under that lock); a string larger than our buffer is
--   malloc()ed by C and freed here. Time comes from ngx_cached_time (above).
local ngx, prim = ...

local ffi = require "ffi"

local C = ffi.C
local ffi_new = ffi.new
local ffi_str = ffi.string
local type = type
local error = error
local tostring = tostring
local tonumber = tonumber
local next = next
local getmetatable = getmetatable
local floor = math.floor

ffi.cdef [[
void ngx_http_lua_ffi_md5_bin(const unsigned char *src, size_t len,
    unsigned char *dst);
void ngx_http_lua_ffi_md5(const unsigned char *src, size_t len,
    unsigned char *dst);
int ngx_http_lua_ffi_sha1_bin(const unsigned char *src, size_t len,
    unsigned char *dst);
unsigned int ngx_http_lua_ffi_crc32_long(const unsigned char *src,
    size_t len);
unsigned int ngx_http_lua_ffi_crc32_short(const unsigned char *src,
    size_t len);

size_t ngx_http_lua_ffi_encode_base64(const unsigned char *src, size_t len,
    unsigned char *dst, int no_padding);
int ngx_http_lua_ffi_decode_base64(const unsigned char *src, size_t len,
    unsigned char *dst, size_t *dlen);

size_t ngx_http_lua_ffi_uri_escaped_length(const unsigned char *src,
    size_t len, int type);
void ngx_http_lua_ffi_escape_uri(const unsigned char *src, size_t len,
    unsigned char *dst, int type);
size_t ngx_http_lua_ffi_unescape_uri(const unsigned char *src, size_t len,
    unsigned char *dst);

double ngx_http_lua_ffi_now(void);
long ngx_http_lua_ffi_time(void);
void ngx_http_lua_ffi_today(unsigned char *buf);
void ngx_http_lua_ffi_localtime(unsigned char *buf);
void ngx_http_lua_ffi_utctime(unsigned char *buf);
void ngx_http_lua_ffi_update_time(void);
int ngx_http_lua_ffi_cookie_time(unsigned char *buf, long t);
void ngx_http_lua_ffi_http_time(unsigned char *buf, long t);
void ngx_http_lua_ffi_parse_http_time(const unsigned char *str, size_t len,
    long *time);

int ngx_http_lua_ffi_worker_exiting(void);

int ngx_http_lua_ffi_shdict_get(void *zone, const unsigned char *key,
    size_t key_len, int *value_type, unsigned char **str_value_buf,
    size_t *str_value_len, double *num_value, int *user_flags,
    int get_stale, int *is_stale, char **errmsg);
int ngx_http_lua_ffi_shdict_incr(void *zone, const unsigned char *key,
    size_t key_len, double *value, char **err, int has_init,
    double init, long init_ttl, int *forcible);
int ngx_http_lua_ffi_shdict_store(void *zone, int op,
    const unsigned char *key, size_t key_len, int value_type,
    const unsigned char *str_value_buf, size_t str_value_len,
    double num_value, long exptime, int user_flags, char **errmsg,
    int *forcible);
int ngx_http_lua_ffi_shdict_flush_all(void *zone);
long ngx_http_lua_ffi_shdict_get_ttl(void *zone, const unsigned char *key,
    size_t key_len);
int ngx_http_lua_ffi_shdict_set_expire(void *zone, const unsigned char *key,
    size_t key_len, long exptime);
size_t ngx_http_lua_ffi_shdict_capacity(void *zone);
size_t ngx_http_lua_ffi_shdict_free_space(void *zone);
void *ngx_http_lua_ffi_shdict_udata_to_zone(void *zone_udata);

void free(void *ptr);
]]

local md5_bin_c = C.ngx_http_lua_ffi_md5_bin
local md5_c = C.ngx_http_lua_ffi_md5
local sha1_bin_c = C.ngx_http_lua_ffi_sha1_bin
local crc32_long_c = C.ngx_http_lua_ffi_crc32_long
local crc32_short_c = C.ngx_http_lua_ffi_crc32_short
local encode_base64_c = C.ngx_http_lua_ffi_encode_base64
local decode_base64_c = C.ngx_http_lua_ffi_decode_base64
local escaped_length_c = C.ngx_http_lua_ffi_uri_escaped_length
local escape_uri_c = C.ngx_http_lua_ffi_escape_uri
local unescape_uri_c = C.ngx_http_lua_ffi_unescape_uri
local now_c = C.ngx_http_lua_ffi_now
local time_c = C.ngx_http_lua_ffi_time
local today_c = C.ngx_http_lua_ffi_today
local localtime_c = C.ngx_http_lua_ffi_localtime
local utctime_c = C.ngx_http_lua_ffi_utctime
local update_time_c = C.ngx_http_lua_ffi_update_time
local cookie_time_c = C.ngx_http_lua_ffi_cookie_time
local http_time_c = C.ngx_http_lua_ffi_http_time
local parse_http_time_c = C.ngx_http_lua_ffi_parse_http_time
local worker_exiting_c = C.ngx_http_lua_ffi_worker_exiting
local shdict_get_c = C.ngx_http_lua_ffi_shdict_get
local shdict_incr_c = C.ngx_http_lua_ffi_shdict_incr
local shdict_store_c = C.ngx_http_lua_ffi_shdict_store
local shdict_flush_all_c = C.ngx_http_lua_ffi_shdict_flush_all
local shdict_get_ttl_c = C.ngx_http_lua_ffi_shdict_get_ttl
local shdict_set_expire_c = C.ngx_http_lua_ffi_shdict_set_expire
local shdict_capacity_c = C.ngx_http_lua_ffi_shdict_capacity
local shdict_free_space_c = C.ngx_http_lua_ffi_shdict_free_space
local udata_to_zone_c = C.ngx_http_lua_ffi_shdict_udata_to_zone
local free_c = C.free

-- The lua module's return codes.
local FFI_OK = 0
local FFI_ERROR = -1
local FFI_DECLINED = -5

-- One scratch buffer per thread state, as lua-resty-core keeps one per VM;
-- a larger need gets a buffer of its own.
local BUF_SIZE = 4096
local scratch = ffi_new("unsigned char[?]", BUF_SIZE)
local size_out = ffi_new("size_t[1]")

local function buffer(size)
    if size > BUF_SIZE then
        return ffi_new("unsigned char[?]", size)
    end
    return scratch
end

-- The string functions read nil and false as "" and other values through
-- tostring.
local function str_arg(s)
    if type(s) == "string" then
        return s
    end
    if not s then
        return ""
    end
    return tostring(s)
end

function ngx.get_phase()
    return "thread_pool"
end

-- Hashes and checksums.

local MD5_LEN = 16
local SHA1_LEN = 20
local digest = ffi_new("unsigned char[?]", MD5_LEN * 2)

function ngx.md5_bin(s)
    s = str_arg(s)
    md5_bin_c(s, #s, digest)
    return ffi_str(digest, MD5_LEN)
end

function ngx.md5(s)
    s = str_arg(s)
    md5_c(s, #s, digest)
    return ffi_str(digest, MD5_LEN * 2)
end

function ngx.sha1_bin(s)
    s = str_arg(s)
    if sha1_bin_c(s, #s, digest) == 0 then
        error("SHA-1 support missing in Nginx")
    end
    return ffi_str(digest, SHA1_LEN)
end

function ngx.crc32_short(s)
    s = str_arg(s)
    return crc32_short_c(s, #s)
end

function ngx.crc32_long(s)
    s = str_arg(s)
    return crc32_long_c(s, #s)
end

-- Base64.

function ngx.encode_base64(s, no_padding)
    s = str_arg(s)
    if no_padding and no_padding ~= true then
        error("bad no_padding: boolean expected, got " .. type(no_padding), 2)
    end
    local len = #s
    local out_len = no_padding and floor((len * 8 + 5) / 6)
                    or floor((len + 2) / 3) * 4
    local out = buffer(out_len)
    return ffi_str(out, encode_base64_c(s, len, out, no_padding and 1 or 0))
end

function ngx.decode_base64(s)
    if type(s) ~= "string" then
        error("string argument only", 2)
    end
    local out = buffer(floor((#s + 3) / 4) * 3)
    if decode_base64_c(s, #s, out, size_out) == 0 then
        return nil
    end
    return ffi_str(out, size_out[0])
end

-- URI escaping.

local ESCAPE_URI = 0
local ESCAPE_URI_COMPONENT = 2
local ESCAPE_MAIL_AUTH = 6

function ngx.escape_uri(s, esc_type)
    s = str_arg(s)
    if esc_type == nil then
        esc_type = ESCAPE_URI_COMPONENT
    elseif type(esc_type) ~= "number" then
        -- level 3 as on the event loop
        error("\"type\" is not a number", 3)
    elseif esc_type < ESCAPE_URI or esc_type > ESCAPE_MAIL_AUTH then
        error("\"type\" " .. esc_type .. " out of range", 3)
    end
    local len = #s
    local out_len = escaped_length_c(s, len, esc_type)
    if out_len == len then
        return s
    end
    local out = buffer(out_len)
    escape_uri_c(s, len, out, esc_type)
    return ffi_str(out, out_len)
end

function ngx.unescape_uri(s)
    s = str_arg(s)
    local out = buffer(#s)
    return ffi_str(out, unescape_uri_c(s, #s, out))
end

-- Time.

local time_out = ffi_new("long[1]")
local TODAY_LEN = #"2010-11-19"
local DATETIME_LEN = #"2010-11-19 20:56:31"
local HTTP_TIME_LEN = #"Mon, 28 Sep 1970 06:00:00 GMT"

function ngx.now()
    return tonumber(now_c())
end

function ngx.time()
    return tonumber(time_c())
end

function ngx.update_time()
    update_time_c()
end

function ngx.today()
    today_c(scratch)
    return ffi_str(scratch, TODAY_LEN)
end

function ngx.localtime()
    localtime_c(scratch)
    return ffi_str(scratch, DATETIME_LEN)
end

function ngx.utctime()
    utctime_c(scratch)
    return ffi_str(scratch, DATETIME_LEN)
end

function ngx.http_time(sec)
    if type(sec) ~= "number" then
        error("number argument only", 2)
    end
    http_time_c(scratch, sec)
    return ffi_str(scratch, HTTP_TIME_LEN)
end

function ngx.cookie_time(sec)
    if type(sec) ~= "number" then
        error("number argument only", 2)
    end
    return ffi_str(scratch, cookie_time_c(scratch, sec))
end

function ngx.parse_http_time(s)
    if type(s) ~= "string" then
        error("string argument only", 2)
    end
    parse_http_time_c(s, #s, time_out)
    local t = time_out[0]
    if t == FFI_ERROR then
        return nil
    end
    return tonumber(t)
end

-- The worker: its identity as the event loop saw it at init_process.

local worker_pid = prim.worker_pid
local worker_id = prim.worker_id
local worker_count = prim.worker_count

ngx.worker = {
    pid = function() return worker_pid end,
    id = function() return worker_id end,
    count = function() return worker_count end,
    exiting = function() return worker_exiting_c() ~= 0 end,
}

-- Shared dicts: ngx_table.rs injected ngx.shared with the lua module's own
-- list methods; the others are lua-resty-core's, over FFI, added here.

local shared = ngx.shared
if not shared then
    ngx.shared = {}
    return
end
local _, a_dict = next(shared)
if not a_dict then
    return
end

-- the lua module's value types (Lua type tags) and store operations
local TNIL, TBOOLEAN, TNUMBER, TSTRING = 0, 1, 3, 4
local OP_SET, OP_ADD, OP_REPLACE, OP_SAFE_SET, OP_SAFE_ADD = 0, 1, 2, 4, 5
local MAX_KEY_LEN = 65535

local value_type = ffi_new("int[1]")
local user_flags = ffi_new("int[1]")
local num_value = ffi_new("double[1]")
local is_stale = ffi_new("int[1]")
local forcible = ffi_new("int[1]")
local str_value = ffi_new("unsigned char *[1]")
local errmsg = ffi_new("char *[1]")

-- The zone of a dict, raising for anything else (at the user's call: level
-- 3 from here, as on the event loop).
local function zone_of(dict)
    if type(dict) ~= "table" then
        error("bad \"zone\" argument", 3)
    end
    local udata = dict[1]
    if type(udata) ~= "userdata" then
        error("bad \"zone\" argument", 3)
    end
    local zone = udata_to_zone_c(udata)
    if zone == nil then
        error("bad \"zone\" argument", 3)
    end
    return zone
end

-- The key as a string, or nil and why it cannot be one.
local function key_arg(key)
    if key == nil then
        return nil, "nil key"
    end
    if type(key) ~= "string" then
        key = tostring(key)
    end
    local len = #key
    if len == 0 then
        return nil, "empty key"
    end
    if len > MAX_KEY_LEN then
        return nil, "key too long"
    end
    return key
end

local function store(dict, op, key, value, exptime, flags)
    local zone = zone_of(dict)
    if not exptime then
        exptime = 0
    elseif exptime < 0 then
        -- level 2: the methods tail-call store
        error('bad "exptime" argument', 2)
    end
    local err
    key, err = key_arg(key)
    if not key then
        return nil, err
    end
    local vtype, str, str_len, num = TNIL, nil, 0, 0
    local t = type(value)
    if t == "string" then
        vtype, str, str_len = TSTRING, value, #value
    elseif t == "number" then
        vtype, num = TNUMBER, value
    elseif t == "boolean" then
        vtype, num = TBOOLEAN, value and 1 or 0
    elseif value ~= nil then
        return nil, "bad value type"
    end
    local rc = shdict_store_c(zone, op, key, #key, vtype, str, str_len, num,
                              exptime * 1000, flags or 0, errmsg, forcible)
    if rc == FFI_OK then
        return true, nil, forcible[0] == 1
    end
    return false, ffi_str(errmsg[0]), forcible[0] == 1
end

-- get and get_stale: the value, its flags (nil when 0) and, for get_stale,
-- whether it had expired.
local function fetch(dict, key, stale)
    local zone = zone_of(dict)
    local err
    key, err = key_arg(key)
    if not key then
        return nil, err
    end
    str_value[0] = scratch
    size_out[0] = BUF_SIZE
    local rc = shdict_get_c(zone, key, #key, value_type, str_value, size_out,
                            num_value, user_flags, stale and 1 or 0,
                            is_stale, errmsg)
    if rc ~= FFI_OK then
        if errmsg[0] ~= nil then
            return nil, ffi_str(errmsg[0])
        end
        error("failed to get the key")
    end
    local t = value_type[0]
    if t == TNIL then
        return nil
    end
    local value
    if t == TSTRING then
        local p = str_value[0]
        value = ffi_str(p, size_out[0])
        if p ~= scratch then
            -- too big for the scratch buffer: C malloc()ed it
            free_c(p)
        end
    elseif t == TNUMBER then
        value = tonumber(num_value[0])
    elseif t == TBOOLEAN then
        value = scratch[0] ~= 0
    else
        error("unknown value type: " .. t)
    end
    local flags = tonumber(user_flags[0])
    if stale then
        return value, flags ~= 0 and flags or nil, is_stale[0] == 1
    end
    if flags ~= 0 then
        return value, flags
    end
    return value
end

-- the methods of every dict (the zones share one metatable)
local methods = getmetatable(a_dict)

function methods.get(dict, key)
    return fetch(dict, key, false)
end

function methods.get_stale(dict, key)
    return fetch(dict, key, true)
end

function methods.set(dict, key, value, exptime, flags)
    return store(dict, OP_SET, key, value, exptime, flags)
end

function methods.safe_set(dict, key, value, exptime, flags)
    return store(dict, OP_SAFE_SET, key, value, exptime, flags)
end

function methods.add(dict, key, value, exptime, flags)
    return store(dict, OP_ADD, key, value, exptime, flags)
end

function methods.safe_add(dict, key, value, exptime, flags)
    return store(dict, OP_SAFE_ADD, key, value, exptime, flags)
end

function methods.replace(dict, key, value, exptime, flags)
    return store(dict, OP_REPLACE, key, value, exptime, flags)
end

function methods.delete(dict, key)
    return store(dict, OP_SET, key, nil)
end

-- A number argument of incr: a number or a numeric string.
local function number_arg(v, name)
    if type(v) == "number" then
        return v
    end
    local n = tonumber(v)
    if not n then
        error("bad " .. name .. " arg: number expected, got " .. type(v), 3)
    end
    return n
end

function methods.incr(dict, key, value, init, init_ttl)
    local zone = zone_of(dict)
    local err
    key, err = key_arg(key)
    if not key then
        return nil, err
    end
    if type(value) ~= "number" then
        value = tonumber(value)
    end
    num_value[0] = value
    if init then
        init = number_arg(init, "init")
    end
    if init_ttl ~= nil then
        init_ttl = number_arg(init_ttl, "init_ttl")
        if init_ttl < 0 then
            error('bad "init_ttl" argument', 2)
        end
        if not init then
            error('must provide "init" when providing "init_ttl"', 2)
        end
    else
        init_ttl = 0
    end
    local rc = shdict_incr_c(zone, key, #key, num_value, errmsg,
                             init and 1 or 0, init or 0, init_ttl * 1000,
                             forcible)
    if rc ~= FFI_OK then
        return nil, ffi_str(errmsg[0])
    end
    if not init then
        return tonumber(num_value[0])
    end
    return tonumber(num_value[0]), nil, forcible[0] == 1
end

function methods.flush_all(dict)
    shdict_flush_all_c(zone_of(dict))
end

function methods.ttl(dict, key)
    local zone = zone_of(dict)
    local err
    key, err = key_arg(key)
    if not key then
        return nil, err
    end
    local ms = shdict_get_ttl_c(zone, key, #key)
    if ms == FFI_DECLINED then
        return nil, "not found"
    end
    return tonumber(ms) / 1000
end

function methods.expire(dict, key, exptime)
    local zone = zone_of(dict)
    if not exptime then
        error('bad "exptime" argument', 2)
    end
    local err
    key, err = key_arg(key)
    if not key then
        return nil, err
    end
    if shdict_set_expire_c(zone, key, #key, exptime * 1000) == FFI_DECLINED
    then
        return nil, "not found"
    end
    return true
end

function methods.capacity(dict)
    return tonumber(shdict_capacity_c(zone_of(dict)))
end

function methods.free_space(dict)
    return tonumber(shdict_free_space_c(zone_of(dict)))
end
