-- The streaming demo's handler (make run, /gzip): gzip of a generated
-- body of `size` bytes, made and compressed `piece` bytes at a time with
-- the process's zlib through the FFI. Streamed (push_stream), each piece's
-- compressed bytes go to the reader as soon as they are made, and the
-- handler returns the sizes; whole (push_task), they are joined and
-- returned at the end. The chunk does not use `...`: it runs once per
-- thread and returns the handler.
local ffi = require "ffi"
local tp = require "resty.threadpool"

-- zlib's public ABI; names of this file's own, so that user code may
-- declare zlib's (a state has one C namespace: the first cdef wins).
ffi.cdef [[
typedef struct gzdemo_stream {
    const unsigned char *next_in; unsigned avail_in; unsigned long total_in;
    unsigned char *next_out; unsigned avail_out; unsigned long total_out;
    const char *msg; void *state;
    void *zalloc; void *zfree; void *opaque;
    int data_type; unsigned long adler; unsigned long reserved;
} gzdemo_stream;
const char *gzdemo_version(void) asm("zlibVersion");
int gzdemo_init(gzdemo_stream *s, int level, int method, int window_bits,
                int mem_level, int strategy, const char *version,
                int stream_size) asm("deflateInit2_");
int gzdemo_deflate(gzdemo_stream *s, int flush) asm("deflate");
int gzdemo_end(gzdemo_stream *s) asm("deflateEnd");
]]

local z = ffi.load("libz.so.1")
local concat = table.concat
local rep = string.rep
local error = error

local Z_NO_FLUSH, Z_SYNC_FLUSH, Z_FINISH = 0, 2, 4
local Z_DEFLATED = 8
local GZIP_WINDOW = 31  -- 15 bits, with a gzip header
local OUT_SIZE = 256 * 1024
local out = ffi.new("unsigned char[?]", OUT_SIZE)

-- The body's piece `i`: lines that vary, so that it compresses as text.
local function piece_of(i, piece)
    local line = "line " .. i .. " of a generated body, streamed through gzip\n"
    return rep(line, math.ceil(piece / #line)):sub(1, piece)
end

return function(size, piece, whole)
    local s = ffi.new("gzdemo_stream")
    if z.gzdemo_init(s, 6, Z_DEFLATED, GZIP_WINDOW, 8, 0, z.gzdemo_version(),
                     ffi.sizeof(s)) ~= 0 then
        error("deflateInit2 failed")
    end
    local parts = whole and {} or nil
    local emitted = 0
    -- compresses `data`; what came out goes to the reader or to parts
    local function deflate(data, flush)
        s.next_in, s.avail_in = data, #data
        repeat
            s.next_out, s.avail_out = out, OUT_SIZE
            z.gzdemo_deflate(s, flush)
            local n = OUT_SIZE - s.avail_out
            if n > 0 then
                local bytes = ffi.string(out, n)
                emitted = emitted + n
                if parts then
                    parts[#parts + 1] = bytes
                else
                    local ok, err = tp.send(bytes)
                    if not ok then
                        return err
                    end
                end
            end
        until s.avail_out ~= 0
    end
    local made, i = 0, 0
    while made < size do
        i = i + 1
        local data = piece_of(i, math.min(piece, size - made))
        made = made + #data
        local flush = made < size and (parts and Z_NO_FLUSH or Z_SYNC_FLUSH) or Z_FINISH
        local err = deflate(data, flush)
        if err then
            z.gzdemo_end(s)
            return nil, err
        end
    end
    z.gzdemo_end(s)
    if parts then
        return concat(parts)
    end
    return made, emitted
end
