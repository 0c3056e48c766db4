-- The talk's thumbnail handler: resize an original to 300×200 and draw a
-- 25×25 watermark in its corner. The chunk runs once per pool thread (and once
-- per worker when required on the event loop): it loads the watermark then and
-- returns the handler. Images live in the nginx prefix's images/ directory, or
-- in $THUMB_IMAGES (set with nginx's `env THUMB_IMAGES=DIR;`).
local magick = require "magick"

local WIDTH, HEIGHT, MARK = 300, 200, 25
local dir = (os.getenv("THUMB_IMAGES") or ngx.config.prefix() .. "images") .. "/"

local watermark = assert(magick.load(dir .. "watermark.png"))
ngx.log(ngx.NOTICE, "thumb: watermark loaded")

-- name: a file under images/, already checked by the caller (no "/" or "..").
return function(name)
    local img, err = magick.load(dir .. name)
    if not img then
        return nil, err
    end
    local ok
    ok, err = img:thumbnail(WIDTH, HEIGHT)
    if ok then
        ok, err = img:composite(watermark, WIDTH - MARK - 5, HEIGHT - MARK - 5)
    end
    local blob
    if ok then
        blob, err = img:blob("JPEG")
    end
    img:destroy()
    return blob, err
end
