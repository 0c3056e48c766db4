#!/usr/bin/env bash
# Builds lua-nginx-module VERSION as a dynamic module for this machine's
# Debian 12 nginx, the way Debian builds its libnginx-mod-http-lua
# (nginx-dev's debhelper build system, nginx_mod.pm): nginx-dev's tree
# (/usr/share/nginx/src) configured with its conf_flags and Debian's
# build flags, ngx_devel_kit's headers from libnginx-mod-http-ndk-dev
# (--add-module: only its headers and `#define NDK`, so that set_by_lua*
# exists; Debian's ndk_http_module.so 0.3.2 is loaded beside it at run
# time, as for Debian's own lua module), the release --add-dynamic-module,
# then `make modules`; linked to Debian's OpenResty LuaJIT (pkg-config
# luajit). The release's lua-resty-core goes into DIR/lualib, and that path
# is compiled into the module as OpenResty does (LUA_DEFAULT_PATH in the
# module's generated ngx_http_lua_autoconf.h): a `lua_package_path` ending
# in `;;` finds it before Debian's lua-resty-core 0.1.25 in
# /usr/share/lua/5.1, which accepts only lua-nginx-module 0.10.23.
# lua-resty-lrucache, which lua-resty-core requires, stays Debian's.
#
#   matrix/lua-module.sh 0.10.29    # prints DIR/ngx_http_lua_module.so
#
# Sources: NGX_TP_UPSTREAM (default ../shared/upstream beside the
# checkout). Builds are kept in NGX_TP_CACHE/lua-module/VERSION
# (/var/cache/ngx-threadpool) and reused while this script and its patches
# are unchanged; an unfinished or outdated one is built again, one build
# of a VERSION at a time (flock). Needs what `make deps` installs plus
# libpcre3-dev and libnginx-mod-http-ndk-dev (make test-lua-releases
# installs them).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
upstream=${NGX_TP_UPSTREAM:-$repo/../shared/upstream}
cache=${NGX_TP_CACHE:-/var/cache/ngx-threadpool}/lua-module
nginx_src=/usr/share/nginx/src
ndk_src=/usr/share/nginx-ndk/src

[ $# = 1 ] || { echo "usage: matrix/lua-module.sh VERSION (e.g. 0.10.29)" >&2; exit 2; }
version=$1

# The lua-resty-core of each release (each accepts exactly one
# lua-nginx-module version: lib/resty/core/base.lua), and the patch that
# makes a stand-in accept it where no release exists; a release's own
# patch where it has a bug that crashes nginx whatever loads it, and
# upstream fixed (see each patch).
resty_patch='' lua_patch=''
case $version in
    0.10.24) resty=lua-resty-core/lua-resty-core-0.1.26.tar.gz ;;
    0.10.25) resty=lua-resty-core/lua-resty-core-0.1.27.tar.gz ;;
    0.10.26)
        resty=lua-resty-core/lua-resty-core-0.1.28.tar.gz
        lua_patch=$repo/matrix/patches/lua-nginx-module-0.10.26-pcre2-dfa-captures.patch ;;
    0.10.27) resty=lua-resty-core/lua-resty-core-0.1.30.tar.gz ;;
    0.10.29) resty=lua-resty-core/lua-resty-core-0.1.32.tar.gz ;;
    0.10.31)
        resty=openresty-1.31.1.1/lua-resty-core-a103a6f.tar.gz
        resty_patch=$upstream/openresty-1.31.1.1/lua-resty-core-a103a6f-ngx_lua-0.10.31.patch ;;
    0.10.32rc2)
        resty=openresty-1.31.1.1/lua-resty-core-a103a6f.tar.gz
        resty_patch=$repo/matrix/patches/lua-resty-core-a103a6f-ngx_lua-0.10.32.patch ;;
    *) echo "lua-module.sh: no lua-resty-core known for lua-nginx-module $version" >&2; exit 2 ;;
esac
lua_tar=$upstream/lua-nginx-module/lua-nginx-module-$version.tar.gz
resty_tar=$upstream/$resty
patches=(${resty_patch:+"$resty_patch"} ${lua_patch:+"$lua_patch"})
for f in "$lua_tar" "$resty_tar" "${patches[@]}"; do
    [ -r "$f" ] || { echo "lua-module.sh: $f missing (NGX_TP_UPSTREAM=$upstream)" >&2; exit 1; }
done
for d in "$nginx_src/conf_flags" "$ndk_src/config"; do
    [ -e "$d" ] || { echo "lua-module.sh: $d missing (nginx-dev, libnginx-mod-http-ndk-dev)" >&2; exit 1; }
done

# What the build is made of: a change to this script or a patch makes it
# again.
stamp=$(cat "$0" "${patches[@]}" | sha256sum | cut -d' ' -f1)
out=$cache/$version
mkdir -p "$cache"
exec 9>"$cache/$version.lock"
flock 9
if [ -e "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$stamp" ]; then
    echo "$out/ngx_http_lua_module.so"
    exit 0
fi

new=$out.new
rm -rf "$new"
mkdir -p "$new/build"
cd "$new/build"
log=$new/build.log
fail() { echo "lua-module.sh: $1 failed for $version; the end of $log:" >&2; tail -30 "$log" >&2; exit 1; }
echo "lua-module.sh: building lua-nginx-module $version into $out (~1 minute)" >&2

cp -r "$nginx_src" nginx
tar xzf "$lua_tar"
tar xzf "$resty_tar"
lua_dir=$PWD/lua-nginx-module-$version
resty_dir=$(echo "$PWD"/lua-resty-core-*/)
if [ -n "$resty_patch" ]; then
    patch -d "$resty_dir" -p1 < "$resty_patch" >> "$log" 2>&1 || fail "patching lua-resty-core"
fi
if [ -n "$lua_patch" ]; then
    patch -d "$lua_dir" -p1 < "$lua_patch" >> "$log" 2>&1 || fail "patching lua-nginx-module"
fi
make -C "$resty_dir" install LUA_LIB_DIR="$new/lualib" >> "$log" 2>&1 || fail "installing lua-resty-core"

# Releases before PCRE2 support (0.10.24, 0.10.25: no NGX_PCRE2 in their
# source) call PCRE 8's API themselves (libpcre3-dev's pcre.h) while
# Debian's nginx links PCRE2: their module must link libpcre.so.3 itself,
# as Debian's 0.10.23 does, or dlopen fails on pcre_malloc.
ld_opt=
grep -rqs NGX_PCRE2 "$lua_dir/src" || ld_opt=-lpcre
cc_opt="$(dpkg-buildflags --get CFLAGS) -fPIC $(dpkg-buildflags --get CPPFLAGS)"
ld_opt="$(dpkg-buildflags --get LDFLAGS) -fPIC $ld_opt"
cd nginx
# shellcheck disable=SC1091
source ./conf_flags
LUAJIT_LIB=$(pkg-config --variable=libdir luajit) \
LUAJIT_INC=$(pkg-config --cflags-only-I luajit | sed 's/^ *-I//; s/ .*//') \
    ./configure --with-cc-opt="$cc_opt" --with-ld-opt="$ld_opt" "${NGX_CONF_FLAGS[@]}" \
    --add-module="$ndk_src" --add-dynamic-module="$lua_dir" >> "$log" 2>&1 || fail configure
# OpenResty's own way of compiling its lualib path in (its configure
# appends this to the generated header).
{
    echo "#ifndef LUA_DEFAULT_PATH"
    echo "#define LUA_DEFAULT_PATH \"$out/lualib/?.lua;$out/lualib/?/init.lua\""
    echo "#endif"
} >> "$lua_dir/src/ngx_http_lua_autoconf.h"
make -j"$(nproc)" -f objs/Makefile modules >> "$log" 2>&1 || fail "make modules"
install -m 0644 objs/ngx_http_lua_module.so "$new/"
cd "$new"
rm -rf build
echo "$stamp" > .complete
rm -rf "$out"
mv "$new" "$out"
echo "$out/ngx_http_lua_module.so"
