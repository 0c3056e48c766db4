-- A small LuaJIT FFI binding to ImageMagick 6's MagickWand (Debian's
-- libmagickwand-6.q16-6): just what the thumbnail demo needs. One wand per
-- image, freed by ffi.gc or explicitly with :destroy(); errors are nil, err.
local ffi = require "ffi"

local C = ffi.load("MagickWand-6.Q16.so.6")
local ffi_gc = ffi.gc
local ffi_string = ffi.string
local setmetatable = setmetatable

ffi.cdef [[
typedef struct _MagickWand MagickWand;
typedef int MagickBooleanType;
typedef unsigned long long MagickSizeType;

void MagickWandGenesis(void);
MagickWand *NewMagickWand(void);
MagickWand *DestroyMagickWand(MagickWand *);
MagickBooleanType MagickReadImage(MagickWand *, const char *);
MagickBooleanType MagickReadImageBlob(MagickWand *, const void *, const size_t);
MagickBooleanType MagickThumbnailImage(MagickWand *, const size_t, const size_t);
MagickBooleanType MagickCompositeImage(MagickWand *, const MagickWand *,
    const int compose, const ssize_t, const ssize_t);
MagickBooleanType MagickSetImageFormat(MagickWand *, const char *);
size_t MagickGetImageWidth(MagickWand *);
size_t MagickGetImageHeight(MagickWand *);
unsigned char *MagickGetImageBlob(MagickWand *, size_t *);
char *MagickGetException(const MagickWand *, int *);
void *MagickRelinquishMemory(void *);
MagickBooleanType MagickSetResourceLimit(const int type, const MagickSizeType limit);
]]

-- Enum values from magick/composite.h and magick/resource_.h (IM 6).
local OVER_COMPOSITE_OP = 40
local THREAD_RESOURCE = 6

-- Once per LuaJIT state (event loop or pool thread); MagickWandGenesis is
-- idempotent across states of one process.
C.MagickWandGenesis()
-- Pool threads are the parallelism: ImageMagick's own OpenMP team inside
-- each of them would oversubscribe the cores (threads × OpenMP threads).
C.MagickSetResourceLimit(THREAD_RESOURCE, 1)

local _M = {}
local mt = { __index = _M }

local function wand_error(w, what)
    local severity = ffi.new("int[1]")
    local msg = C.MagickGetException(w.wand, severity)
    local err = what .. ": " .. (msg ~= nil and ffi_string(msg) or "unknown error")
    if msg ~= nil then
        C.MagickRelinquishMemory(msg)
    end
    return nil, err
end

local function new()
    local wand = C.NewMagickWand()
    if wand == nil then
        return nil, "NewMagickWand failed"
    end
    return setmetatable({ wand = ffi_gc(wand, C.DestroyMagickWand) }, mt)
end

-- Reads an image from a file.
function _M.load(path)
    local w, err = new()
    if not w then
        return nil, err
    end
    if C.MagickReadImage(w.wand, path) == 0 then
        local _, rerr = wand_error(w, "read " .. path)
        w:destroy()
        return nil, rerr
    end
    return w
end

-- Reads an image from a string of its encoded bytes (PNG, JPEG, ...).
function _M.load_blob(blob)
    local w, err = new()
    if not w then
        return nil, err
    end
    if C.MagickReadImageBlob(w.wand, blob, #blob) == 0 then
        local _, rerr = wand_error(w, "read blob")
        w:destroy()
        return nil, rerr
    end
    return w
end

function _M.destroy(self)
    if self.wand then
        C.DestroyMagickWand(ffi_gc(self.wand, nil))
        self.wand = nil
    end
end

function _M.size(self)
    return tonumber(C.MagickGetImageWidth(self.wand)), tonumber(C.MagickGetImageHeight(self.wand))
end

-- Resizes to exactly w×h (a thumbnail: profiles stripped).
function _M.thumbnail(self, w, h)
    if C.MagickThumbnailImage(self.wand, w, h) == 0 then
        return wand_error(self, "thumbnail")
    end
    return true
end

-- Draws other over this image with its top-left corner at x, y.
function _M.composite(self, other, x, y)
    if C.MagickCompositeImage(self.wand, other.wand, OVER_COMPOSITE_OP, x, y) == 0 then
        return wand_error(self, "composite")
    end
    return true
end

-- The image encoded in format ("PNG", "JPEG", ...) as a Lua string.
function _M.blob(self, format)
    if format and C.MagickSetImageFormat(self.wand, format) == 0 then
        return wand_error(self, "format " .. format)
    end
    local len = ffi.new("size_t[1]")
    local buf = C.MagickGetImageBlob(self.wand, len)
    if buf == nil then
        return wand_error(self, "encode")
    end
    local s = ffi_string(buf, len[0])
    C.MagickRelinquishMemory(buf)
    return s
end

return _M
