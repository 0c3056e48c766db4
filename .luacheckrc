-- luacheck's settings for `make lint` (Debian's lua-check).

-- The event loop's Lua: OpenResty's globals (luacheck's ngx_lua standard)
-- and two it lacks: coroutine._yield, as lua-resty-core's own .luacheckrc
-- states it, and ngx.run_worker_thread, newer than the standard.
std = "ngx_lua"
read_globals = { "coroutine._yield", "ngx.run_worker_thread" }

-- A pool thread's own chunks run before the thread's `ngx` global exists
-- (they get the table they fill as an argument): plain LuaJIT.
files["src/vm"] = { std = "luajit" }
-- Replaces os.exit, which would end the whole worker from a thread.
files["src/vm/ngx_require.lua"] = { globals = { "os.exit" } }

-- What make bench writes (bench/out: results, wrk_waf.lua's request lists).
exclude_files = { "bench/out/*" }

-- wrk's hook.
files["bench/wrk_json.lua"] = { std = "luajit", globals = { "done" } }
files["bench/wrk_waf.lua"] = { std = "luajit", globals = { "request" }, read_globals = { "wrk" } }

-- Generated data (gen_waf_rules.py): one pattern per line.
files["nginx-conf/waf_rules.lua"] = { max_line_length = false }
