#!/usr/bin/env bash
# Builds the nginx of OpenResty 1.31.1.1 as OpenResty assembles it
# (util/mirror-tarballs, util/configure), http only, from the source
# tarballs of NGX_TP_UPSTREAM/openresty-1.31.1.1 alone (their SOURCES.md:
# what each is and where it differs from the release), with no network:
# nginx 1.31.1 with OpenResty's nginx patches in mirror-tarballs' order,
# ngx_devel_kit and lua-nginx-module 0.10.31rc5 compiled in, OpenResty's
# LuaJIT built with LUA52COMPAT into DIR/luajit and linked with an rpath to
# it, lua-resty-core and lua-resty-lrucache in DIR/lualib, whose paths are
# compiled into the lua module (LUA_DEFAULT_PATH) as OpenResty does: `;;`
# in a lua_package_path means DIR's lualib, not /usr/share/lua/5.1.
#
# Kept under NGX_TP_CACHE/openresty (NGX_TP_CACHE: /var/cache/ngx-threadpool,
# as for the other rows), keyed by the sources' sha256s and the recipe's
# number below (raise it when the build changes): a build of the
# same sources and recipe is reused, a build that did not finish is made
# again, and concurrent runs wait for each other (flock).
# Prints the nginx binary's path, DIR/sbin/nginx; DIR/src is the pristine
# patched nginx tree with a conf_flags file holding the binary's `nginx -V`
# configure arguments, as an OpenResty user builds the module against
# (docs/installation.md, "A custom nginx build"): NGX_SRC=DIR/src.
#
# One LuaJIT per worker: the module's Rust side links Debian's
# libluajit-5.1.so.2 by its soname, and this nginx's rpath makes the
# dynamic loader find that soname in DIR/luajit/lib first, so a worker
# maps OpenResty's LuaJIT only (its /proc/PID/maps; tests/require.rs,
# one_luajit_per_worker_and_the_lua_modules_own_resty_core, checks it).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
upstream=${NGX_TP_UPSTREAM:-$repo/../shared/upstream}
sources=$upstream/openresty-1.31.1.1
cache=${NGX_TP_CACHE:-/var/cache/ngx-threadpool}/openresty

[ -f "$sources/SHA256SUMS" ] || {
    echo "openresty.sh: no $sources/SHA256SUMS (set NGX_TP_UPSTREAM to the folder holding openresty-1.31.1.1/)" >&2
    exit 1
}
(cd "$sources" && sha256sum --quiet -c SHA256SUMS) >&2 || {
    echo "openresty.sh: $sources does not match its SHA256SUMS" >&2
    exit 1
}
recipe=2
key=1.31.1.1-r$recipe-$(sha256sum < "$sources/SHA256SUMS" | cut -c1-16)
out=$cache/$key

mkdir -p "$cache"
exec 9> "$cache/.lock"
flock 9
if [ -e "$out/done" ]; then
    echo "$out/sbin/nginx"
    exit 0
fi

start=$(date +%s)
echo "openresty.sh: building OpenResty 1.31.1.1's nginx into $out (~3 minutes)" >&2
rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
for t in "$sources"/*.tar.*; do tar xf "$t"; done
jobs=$(nproc)
log() { # step, log file, command...: the command's output only on failure
    local step=$1 file=$2
    shift 2
    "$@" > "$work/$file" 2>&1 || {
        tail -40 "$work/$file" >&2
        echo "openresty.sh: $step failed (log above)" >&2
        exit 1
    }
}

# LuaJIT, as OpenResty's configure builds it (LUA52COMPAT; the win32
# default-paths patch changes nothing elsewhere but is part of the recipe).
luajit=$out/luajit
cd "$work"/luajit2-*/
log "LuaJIT's patch" luajit-patch.log patch -p1 -i "$work/openresty-1.31.1.1/patches/luajit-win32-default-paths.patch"
log "LuaJIT's build" luajit-make.log make -j"$jobs" XCFLAGS=-DLUAJIT_ENABLE_LUA52COMPAT PREFIX="$luajit"
log "LuaJIT's install" luajit-install.log make install PREFIX="$luajit"

# lua-resty-core (its version check moved to 10031, SOURCES.md) and
# lua-resty-lrucache into DIR/lualib, as OpenResty installs them.
cd "$work/lua-resty-core-a103a6f"
log "lua-resty-core's patch" core-patch.log patch -p1 -i "$sources/lua-resty-core-a103a6f-ngx_lua-0.10.31.patch"
log "lua-resty-core's install" core-install.log make install LUA_LIB_DIR="$out/lualib"
cd "$work/lua-resty-lrucache-0.15"
log "lua-resty-lrucache's install" lrucache-install.log make install LUA_LIB_DIR="$out/lualib"
mkdir -p "$out/site/lualib"
# OpenResty's lualib has cjson.so (its lua-cjson fork), which the suite's
# configurations require; its source is not among the tarballs, so Debian's
# lua-cjson (make deps installs it; built for the Lua 5.1 C API, it links
# no Lua library and calls the LuaJIT of the process) stands in for it.
cjson=$(dpkg-query -L lua-cjson 2>/dev/null | grep '/lua/5\.1/cjson\.so$' | head -1 || true)
[ -n "$cjson" ] || { echo "openresty.sh: no cjson.so of Debian's lua-cjson (make deps)" >&2; exit 1; }
install -m 0644 "$cjson" "$out/lualib/cjson.so"

# The lua module's default package paths, appended to its config exactly
# as util/configure does (with DIR for /usr/local/openresty).
lualib=$out/lualib site=$out/site/lualib
cat >> "$work/lua-nginx-module-0.10.31rc5/config" <<EOF

echo '
#ifndef LUA_DEFAULT_PATH
#define LUA_DEFAULT_PATH "$site/?.ljbc;$site/?/init.ljbc;$lualib/?.ljbc;$lualib/?/init.ljbc;$site/?.lua;$site/?/init.lua;$lualib/?.lua;$lualib/?/init.lua"
#endif

#ifndef LUA_DEFAULT_CPATH
#define LUA_DEFAULT_CPATH "$site/?.so;$lualib/?.so"
#endif
' >> "\$ngx_addon_dir/src/ngx_http_lua_autoconf.h"
EOF

# nginx: the git tag's layout made a release's, then the patches
# mirror-tarballs applies to 1.31.1, in its order (server_header with the
# ".unknown" it fills in).
cd "$work/nginx-1.31.1"
cp auto/configure configure
patches=(win32_max_err_str stream_balancer_export stream_proxy_get_next_upstream_tries
    stream_proxy_timeout_fields stream_ssl_preread_no_skip resolver_conf_parsing
    daemon_destroy_pool init_cycle_pool_release balancer_status_code
    builtin_error_page_footer delayed_posted_events privileged_agent_process
    privileged_agent_process_connections privileged_agent_process_thread_pool
    single_process_graceful_exit intercept_error_log upstream_pipelining
    server_header no_error_pages no_Werror log_escape_non_ascii proxy_host_port_vars
    cache_manager_exit larger_max_error_str pcre_conf_opt
    always_enable_cc_feature_tests ssl_cert_cb_yield ssl_sess_cb_yield
    ssl_client_hello_cb_yield proxy_ssl_verify_cb_yield
    balancer_pool_max_retry upstream_timeout_fields safe_resolver_ipv6_option
    socket_cloexec reuseport_close_unused_fds upstream_ssl_session_cleanup
    proc_exit_handler stream_proxy_protocol_v2 quic_ssl_lua_yield
    http2_subreq_error_wakeup)
for p in "${patches[@]}"; do
    file=$work/openresty-1.31.1.1/patches/nginx/1.31.1/nginx-1.31.1-$p.patch
    if [ "$p" = server_header ]; then
        sed 's/NGINX_VERSION ".unknown"/NGINX_VERSION ".1"/' "$file" > "$work/server_header.patch"
        file=$work/server_header.patch
    fi
    log "nginx patch $p" "patch-$p.log" patch -p1 -i "$file"
done
# The tree the module's build.rs configures again (NGX_SRC): as patched,
# before configure writes objs/ into it.
cp -a "$work/nginx-1.31.1" "$out/src"

flags=(--prefix="$out/nginx" --with-cc-opt=-O2
    --add-module=../ngx_devel_kit-0.3.4 --add-module=../lua-nginx-module-0.10.31rc5
    --with-ld-opt="-Wl,-rpath,$luajit/lib"
    --with-threads --with-compat --with-pcre-jit --with-http_ssl_module
    --with-http_v2_module --with-http_realip_module --with-http_addition_module
    --with-http_sub_module --with-http_dav_module --with-http_flv_module
    --with-http_mp4_module --with-http_gunzip_module
    --with-http_gzip_static_module --with-http_auth_request_module
    --with-http_random_index_module --with-http_secure_link_module
    --with-http_stub_status_module)
LUAJIT_LIB=$luajit/lib LUAJIT_INC=$luajit/include/luajit-2.1 \
    log "nginx's configure" configure.log ./configure "${flags[@]}"
log "nginx's build" make.log make -j"$jobs"
mkdir -p "$out/sbin" "$out/nginx/logs"
install -m 0755 objs/nginx "$out/sbin/nginx"
# nginx -V, one argument a word (none of the flags above holds a space).
args=$("$out/sbin/nginx" -V 2>&1 | sed -n 's/^configure arguments: //p')
[ "$args" = "${flags[*]}" ] || {
    echo "openresty.sh: nginx -V shows other configure arguments: $args" >&2
    exit 1
}
echo "NGX_CONF_FLAGS=( $args )" > "$out/src/conf_flags"
echo "openresty.sh: built in $(($(date +%s) - start)) s" >&2
touch "$out/done"
echo "$out/sbin/nginx"
