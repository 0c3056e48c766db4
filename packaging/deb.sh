#!/usr/bin/env bash
# Builds the Debian package from debian/ as a build daemon would: the
# source tree (the checkout's files, without target/) copied to
# OUT/build/SOURCE-VERSION, its crates vendored there on this machine
# (packaging/vendor.sh), then, in a fresh chroot of RELEASE that reaches
# only Debian's archive (matrix/chroot.sh, FRESH=1 BUILDD=1), the build
# dependencies installed (kept as a layer under the cache, see below),
# `dpkg-buildpackage -b` and the release's lintian on the result: any tag
# not overridden in debian/ with its reason fails the build (without
# --show-overrides, which Debian 12's lintian counts as tags that fail).
# The packages, the .changes, the build log and lintian's report land in
# OUT; the build tree is removed. `make deb` runs it.
#
#   RELEASE=trixie OUT=target/trixie/debian packaging/deb.sh
set -euo pipefail
cd "$(dirname "$0")/.."
release=${RELEASE:?}
out=$(realpath -m "${OUT:?}")
cache=${NGX_TP_CACHE:-/var/cache/ngx-threadpool}
source=$(dpkg-parsechangelog -S Source)
version=$(dpkg-parsechangelog -S Version)
src=$out/build/$source-${version%-*}
t0=${T0:-$(date +%s)}

# Vendoring runs as the caller (its cargo, its crates cache), the rest as
# root (this script again, through sudo where the caller is not root).
if [ "${1:-}" != --as-root ]; then
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
[ ! -e "$out" ] || $sudo rm -rf "$out"
mkdir -p "$src"
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    # tracked and new files, as they are in the working tree
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf - | tar -xf - -C "$src"
else
    tar --exclude=./target -cf - . | tar -xf - -C "$src"
fi
packaging/vendor.sh "$src"
echo "deb.sh: $source $version for $release in a fresh chroot ($(($(date +%s) - t0)) s to copy and vendor)"
exec $sudo env RELEASE="$release" OUT="$out" NGX_TP_CACHE="$cache" OWNER="$(id -u):$(id -g)" T0="$t0" "$0" --as-root
fi

# The build dependencies of debian/control, installed once into a layer
# over the release's base (matrix/chroot.sh LAYER, KEEP) and kept under the
# cache, made again when they or the base change: each build runs in a fresh
# overlay of it, where apt brings them up to date with the archive.
deps="apt-get update -qq
apt-get build-dep -y -qq --no-install-recommends '$src' > '$out/build-deps.log' 2>&1 ||
    { tail -30 '$out/build-deps.log' >&2; exit 1; }"
key=$({ sed -n '/^Build-Depends/,/^[^ ]/p' debian/control; stat -c %Y "$cache/$release.base/.complete" 2>/dev/null; } |
    sha256sum | cut -c1-16)
layer=$cache/$release.build-deps-$key
inner="$deps
apt-get dist-upgrade -y -qq >> '$out/build-deps.log' 2>&1 || { tail -30 '$out/build-deps.log' >&2; exit 1; }
echo \"deb.sh: build dependencies installed in \$SECONDS s: \$(rustc --version)\"
cd '$src' && dpkg-buildpackage -b -us -uc > '$out/build.log' 2>&1 || { tail -40 '$out/build.log' >&2; exit 1; }
apt-get install -y -qq --no-install-recommends lintian > '$out/lintian-install.log' 2>&1 ||
    { tail -30 '$out/lintian-install.log' >&2; exit 1; }
echo \"deb.sh: built at \$SECONDS s; \$(dpkg-query -W -f='lintian \${Version}' lintian) --pedantic\"
rc=0
lintian --pedantic --info --fail-on error,warning,info,pedantic \
    '$out/build/${source}_${version}_'*.changes > '$out/lintian.txt' 2>&1 || rc=\$?
cat '$out/lintian.txt'
exit \$rc"
# One build per release at a time: they share apt's cache and the layer.
mkdir -p "$cache/apt"
exec 9>"$cache/apt/$release.lock"
flock 9
rc=0
if [ ! -e "$layer.complete" ]; then
    echo "deb.sh: installing the build dependencies into $layer"
    rm -rf "$cache/$release".build-deps-*
    RELEASE="$release" FRESH=1 BUILDD=1 KEEP="$layer" matrix/chroot.sh "$deps" || rc=$?
    [ $rc != 0 ] || touch "$layer.complete"
fi
[ $rc != 0 ] || env RELEASE="$release" FRESH=1 BUILDD=1 LAYER="$layer" matrix/chroot.sh "$inner" || rc=$?
chown -R "$OWNER" "$out"
mv "$out"/build/*.deb "$out"/build/*.changes "$out"/build/*.buildinfo "$out"/ 2>/dev/null || true
rm -rf "$out/build"
[ $rc = 0 ] || { echo "deb.sh: failed for $release, logs in $out" >&2; exit $rc; }
echo "deb.sh: $(cd "$out" && ls ./*.deb | tr '\n' ' ')in $out ($(($(date +%s) - t0)) s)"
