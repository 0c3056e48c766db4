-- LuaRocks packaging of the Lua shim. The shim needs the nginx module
-- ngx_http_threadpool_module.so (README: Install), which LuaRocks cannot
-- install. The version follows Cargo.toml's; source.url must name the
-- repository the rock is published from.
package = "lua-resty-threadpool"
version = "0.1.0-1"
source = {
    url = "git+https://github.com/OWNER/ngx_threadpool.git",
    tag = "v0.1.0",
}
description = {
    summary = "Run CPU-heavy Lua in per-worker thread pools of nginx",
    detailed = [[
resty.threadpool pushes tasks to the thread pools of the ngx_threadpool
nginx module: each worker runs threads with a LuaJIT state of their own,
while the request waits and the event loop serves other requests.
Needs lua-nginx-module 0.10.23 or later, lua-resty-core and the module.]],
    license = "BSD-2-Clause",
}
dependencies = {
    "lua == 5.1",
}
build = {
    type = "builtin",
    modules = {
        ["resty.threadpool"] = "lua/resty/threadpool.lua",
    },
}
