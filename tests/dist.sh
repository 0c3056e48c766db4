#!/usr/bin/env bash
# make dist-check: the source tarball of `make dist`, unpacked into a
# directory of its own and built there as the README's Install says for a
# checkout (`make build`, then `make install`, staged with DESTDIR), with
# nothing else: no git, no file of this checkout, no network for cargo
# (CARGO_NET_OFFLINE: the tarball's vendored crates only). Then the installed
# module is loaded by Debian's nginx after the lua module (`nginx -t` on
# a configuration with a pool and its handler), and the build must have
# left Cargo.lock as the tarball has it (every crate pinned) and written
# nothing into the unpacked tree.
#
# It all happens under CACHE, NGX_TP_CACHE/dist (/var/cache/ngx-threadpool
# /dist, outside the checkout, as the matrix rows keep theirs) where that
# can be written, else FALLBACK (make gives TARGET_DIR/dist/cache): the
# tarball is unpacked into CACHE/src, emptied before and removed after,
# and cargo's output goes to CACHE/target, which is kept (CARGO_TARGET_DIR
# outside the unpacked tree). The path stays the same from run to run, so
# cargo reuses the vendored crates it built (their files get one fixed
# old time); the tree's own files get the time of the unpacking, not the
# commit's, so the module and the crates of the tree are always built
# again from them. One run at a time (flock).
#
#   TARBALL=target/dist/ngx_threadpool-V.tar.gz VERSION=V FALLBACK=DIR tests/dist.sh
set -euo pipefail

: "${TARBALL:?}" "${VERSION:?}"
make=${MAKE:-make}
cache=${NGX_TP_CACHE:-/var/cache/ngx-threadpool}/dist
if ! { mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; }; then
	cache=${FALLBACK:?}
	mkdir -p "$cache"
fi
exec 9> "$cache/lock"
flock 9
work=$cache/src
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

tar -xzf "$TARBALL" -C "$work"
src=$work/ngx_threadpool-$VERSION
[ -f "$src/Makefile" ] || { echo "dist: no ngx_threadpool-$VERSION/Makefile in $TARBALL" >&2; exit 1; }
# The tree's own files: the unpacking's time, so that cargo cannot take a
# file of an older commit for one it built already. The vendored crates:
# one fixed old time, so that their build scripts' rerun-if-changed never
# fires (a crate's files are those of its version, whose checksum
# Cargo.lock holds).
find "$src" -path "$src/vendor" -prune -o -exec touch -h {} +
find "$src/vendor" -exec touch -h -d @946684800 {} +
(cd "$src" && find . | sort) > "$work/files"
lock=$(sha256sum < "$src/Cargo.lock")

echo "dist: building $TARBALL in $src (cargo's output in $cache/target)"
export CARGO_TARGET_DIR=$cache/target CARGO_NET_OFFLINE=true
"$make" -C "$src" --no-print-directory build
"$make" -C "$src" --no-print-directory install DESTDIR="$work/root"

if [ "$(sha256sum < "$src/Cargo.lock")" != "$lock" ]; then
	echo "dist: the build changed Cargo.lock: the tarball's does not pin every crate" >&2
	exit 1
fi
if ! (cd "$src" && find . | sort) | diff "$work/files" - >&2; then
	echo "dist: the build wrote into the unpacked tree (above)" >&2
	exit 1
fi

so=$work/root/usr/lib/nginx/modules/ngx_http_threadpool_module.so
mkdir -p "$work/prefix/conf" "$work/prefix/logs"
cat > "$work/prefix/conf/nginx.conf" <<EOF
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
load_module $so;
error_log logs/error.log info;
pid logs/nginx.pid;
events {}
http {
    lua_package_path "$work/root/usr/share/lua/5.1/?.lua;;";
    lua_thread_pool upper threads=1;
    thread_pool_process_by_lua_block upper {
        return (...):upper()
    }
}
EOF
out=$(/usr/sbin/nginx -p "$work/prefix" -c conf/nginx.conf -t 2>&1) || {
	echo "$out" >&2
	echo "dist: nginx -t refused the module built from $TARBALL" >&2
	exit 1
}
echo "$out"
echo "dist: $TARBALL builds with make build, installs with make install, and loads in nginx"
