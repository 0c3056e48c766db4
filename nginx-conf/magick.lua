-- A small LuaJIT FFI binding to ImageMagick's MagickWand, 6 (Debian 12's
-- libmagickwand-6.q16-6) or 7 (Debian 13's libmagickwand-7.q16-10),
-- whichever is installed: just what the thumbnail demo needs. One wand per
-- image, freed by ffi.gc or explicitly with :destroy(); errors are nil, err.
local ffi = require "ffi"

local ffi_gc = ffi.gc
local ffi_string = ffi.string
local setmetatable = setmetatable

-- Per major version: the library, the enum values used (magick/composite.h
-- and magick/resource_.h of 6; MagickCore/composite.h and resource_.h of
-- 7.1.1), and MagickCompositeImage, which gained a clip_to_self argument
-- in 7. The newest that loads wins.
local VERSIONS = {
    {
        lib = "MagickWand-7.Q16.so.10",
        over_composite_op = 54,
        thread_resource = 7,
        composite = "MagickBooleanType MagickCompositeImage(MagickWand *,"
            .. " const MagickWand *, const int compose,"
            .. " const MagickBooleanType clip_to_self, const ssize_t,"
            .. " const ssize_t);",
        -- clipped to the source's own area, as 6 always does
        composite_image = function(C, dst, src, op, x, y)
            return C.MagickCompositeImage(dst, src, op, 1, x, y)
        end,
    },
    {
        lib = "MagickWand-6.Q16.so.6",
        over_composite_op = 40,
        thread_resource = 6,
        composite = "MagickBooleanType MagickCompositeImage(MagickWand *,"
            .. " const MagickWand *, const int compose, const ssize_t,"
            .. " const ssize_t);",
        composite_image = function(C, dst, src, op, x, y)
            return C.MagickCompositeImage(dst, src, op, x, y)
        end,
    },
}

local C, V
for _, v in ipairs(VERSIONS) do
    local ok, lib = pcall(ffi.load, v.lib)
    if ok then
        C, V = lib, v
        break
    end
end
if not C then
    error("no MagickWand 6 or 7 library (libmagickwand-7.q16-10 or"
          .. " libmagickwand-6.q16-6) could be loaded")
end

ffi.cdef([[
typedef struct _MagickWand MagickWand;
typedef int MagickBooleanType;
typedef unsigned long long MagickSizeType;

void MagickWandGenesis(void);
MagickWand *NewMagickWand(void);
MagickWand *DestroyMagickWand(MagickWand *);
MagickBooleanType MagickReadImage(MagickWand *, const char *);
MagickBooleanType MagickReadImageBlob(MagickWand *, const void *, const size_t);
MagickBooleanType MagickThumbnailImage(MagickWand *, const size_t, const size_t);
MagickBooleanType MagickSetImageFormat(MagickWand *, const char *);
size_t MagickGetImageWidth(MagickWand *);
size_t MagickGetImageHeight(MagickWand *);
unsigned char *MagickGetImageBlob(MagickWand *, size_t *);
char *MagickGetException(const MagickWand *, int *);
void *MagickRelinquishMemory(void *);
MagickBooleanType MagickSetResourceLimit(const int type, const MagickSizeType limit);
]] .. V.composite)

-- Once per LuaJIT state (event loop or pool thread); MagickWandGenesis is
-- idempotent across states of one process.
C.MagickWandGenesis()
-- Pool threads are the parallelism: ImageMagick's own OpenMP team inside
-- each of them would oversubscribe the cores (threads × OpenMP threads).
C.MagickSetResourceLimit(V.thread_resource, 1)

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
    if V.composite_image(C, self.wand, other.wand, V.over_composite_op, x, y) == 0 then
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
