#!/usr/bin/env bash
# Builds OpenResty's LuaJIT (the 2.1-20251030 tarball of
# NGX_TP_UPSTREAM/openresty-1.31.1.1, default ../shared/upstream) with its
# internal assertions and its C API checks (LUA_USE_ASSERT,
# LUA_USE_APICHECK) into DIR (default target/luajit-assert), once; prints
# the directory holding its libluajit-5.1.so.2, for NGX_TP_LUAJIT: the
# harness then gives nginx LD_LIBRARY_PATH=that directory, so that nginx,
# the lua module and this module all load it in place of Debian's
# (tests/faults.rs checks the workers' maps). Its default module paths are
# Debian's (PREFIX=/usr, the multiarch lib dir), so that `require "cjson"`
# finds lua-cjson's C module as with Debian's LuaJIT. Rebuilt when the
# recipe below changes (RECIPE). ~1-2 minutes on 2 cores.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
upstream=${NGX_TP_UPSTREAM:-$repo/../shared/upstream}
tarball=$upstream/openresty-1.31.1.1/luajit_2.1.0+openresty20251030.orig.tar.xz
dir=${1:-$repo/target/luajit-assert}
src=$dir/luajit2-2.1-20251030/src
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
flags=(XCFLAGS="-DLUA_USE_ASSERT -DLUA_USE_APICHECK" CCDEBUG=-g PREFIX=/usr MULTILIB="lib/$multiarch")
RECIPE="2 ${flags[*]}"
[ -r "$tarball" ] || { echo "luajit-assert.sh: $tarball missing (NGX_TP_UPSTREAM=$upstream)" >&2; exit 1; }
if [ ! -e "$src/libluajit-5.1.so.2" ] || [ "$(cat "$dir/recipe" 2>/dev/null)" != "$RECIPE" ]; then
    mkdir -p "$dir"
    rm -rf "$dir/luajit2-2.1-20251030"
    tar -C "$dir" -xf "$tarball"
    make -C "$dir/luajit2-2.1-20251030" -j"$(nproc)" "${flags[@]}" >"$dir/build.log" 2>&1 ||
        { tail -30 "$dir/build.log" >&2; exit 1; }
    # the soname the lua module and this module link against
    ln -sf libluajit.so "$src/libluajit-5.1.so.2"
    echo "$RECIPE" >"$dir/recipe"
fi
echo "$src"
