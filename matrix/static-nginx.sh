#!/usr/bin/env bash
# Builds an nginx with lua-nginx-module compiled in, the shape of OpenResty's
# own packages, from the Debian release's own source packages (nginx,
# libnginx-mod-http-lua, libnginx-mod-http-ndk: their upstream tarballs),
# configured with nginx-dev's flags plus the two --add-module and linked to
# the release's OpenResty LuaJIT. Kept under NGX_TP_STATIC_CACHE, keyed by
# the three source versions: a build of the same versions is reused, a new
# version is built beside it. Prints the nginx binary's path, DIR/sbin/nginx;
# DIR/src is the pristine nginx tree with a conf_flags file holding the
# binary's `nginx -V` flags, as an OpenResty user would build the module
# against (docs/installation.md, "A custom nginx build"): NGX_SRC=DIR/src.
set -euo pipefail

cache=${NGX_TP_STATIC_CACHE:-/var/cache/ngx-threadpool/static}
packages=(nginx libnginx-mod-http-lua libnginx-mod-http-ndk)

version() { apt-cache show --no-all-versions "$1" | sed -n 's/^Version: //p' | head -1; }
key=
for p in "${packages[@]}"; do
    v=$(version "$p")
    [ -n "$v" ] || { echo "static-nginx.sh: apt knows no $p (apt-get update?)" >&2; exit 1; }
    key+="${key:+_}$p-${v//[^A-Za-z0-9.+-]/.}"
done
out=$cache/$key
if [ -x "$out/sbin/nginx" ] && [ -e "$out/src/conf_flags" ]; then
    echo "$out/sbin/nginx"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# Only the upstream tarballs: Debian's patches are not needed for this
# shape, and the archive may not serve the .dsc beside them.
apt-get source --tar-only --download-only "${packages[@]}" > fetch.log 2>&1 || {
    cat fetch.log >&2; exit 1; }
for t in *.orig.tar.*; do tar xf "$t"; done
nginx_dir=$(echo nginx-[0-9]*/)
lua_dir=$(echo lua-nginx-module-*/)
ndk_dir=$(echo ngx_devel_kit-*/)
# shellcheck disable=SC1091
source /usr/share/nginx/src/conf_flags
cd "$nginx_dir"
echo "static-nginx.sh: building $key (~1 minute)" >&2
LUAJIT_LIB=$(pkg-config --variable=libdir luajit) LUAJIT_INC=$(pkg-config --cflags-only-I luajit | sed "s/^ *-I//; s/ .*//") \
    ./configure "${NGX_CONF_FLAGS[@]}" --add-module="../$ndk_dir" --add-module="../$lua_dir" \
    > ../configure.log 2>&1 || { tail -30 ../configure.log >&2; exit 1; }
make -j"$(nproc)" > ../make.log 2>&1 || { tail -30 ../make.log >&2; exit 1; }
mkdir -p "$out.new/sbin" "$out.new/src"
install -m 0755 objs/nginx "$out.new/sbin/nginx"
tar xf "$work"/nginx_*.orig.tar.* -C "$out.new/src" --strip-components=1
echo "NGX_CONF_FLAGS=( $(objs/nginx -V 2>&1 | sed -n 's/^configure arguments: //p') )" \
    > "$out.new/src/conf_flags"
rm -rf "$out"
mv "$out.new" "$out"
echo "$out/sbin/nginx"
