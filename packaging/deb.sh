#!/usr/bin/env bash
# Builds the Debian package of the installed files (make install-files,
# staged under DEB_OUT/root) into DEB_OUT, without cargo: `make package`
# runs it with the Makefile's names (DEB_PKG, DEB_VERSION, MODULES_DIR,
# MODULE_SO, SNIPPET, ENABLED, LUA_OLDEST, LUA_NEWEST, NGX_SRC, MAKE).
#
# It depends on the nginx ABI of the tree the module was built against
# (NGX_SRC, as Debian's dh_nginx reads it), on the range of lua module
# releases the module is tested with (Cargo.toml's
# package.metadata.lua-nginx-module; the module checks the version it finds
# at start-up too) and on the libraries the .so links; its maintainer
# scripts are Debian's own for nginx modules (dh_nginx's, from nginx-dev),
# which enable and disable the snippet. The README, the changelog and the
# docs/ they link to go to /usr/share/doc, compressed.
set -euo pipefail

test -n "${DEB_MAINTAINER:-}" || { echo "set DEB_MAINTAINER='Name <email>'" >&2; exit 1; }
abi=$(sed -n 's/^nginx:abi=//p' "$NGX_SRC/debian/libnginx-mod.abisubstvars" 2>/dev/null) || true
test -n "$abi" || { echo "$NGX_SRC is not Debian's nginx-dev tree: no nginx ABI to depend on" >&2; exit 1; }
# Debian's lua module versions carry an epoch (1:0.10.23-…)
epoch=$(dpkg-query -W -f='${Version}' libnginx-mod-http-lua | sed -n 's/^\([0-9]*:\).*/\1/p')
after=$(awk -F. '{ print $1 "." $2 "." $3 + 1 "~" }' <<< "$LUA_NEWEST")
arch=$(dpkg --print-architecture)
root=$DEB_OUT/root
doc=$root/usr/share/doc/$DEB_PKG

umask 022
rm -rf "$DEB_OUT"
mkdir -p "$root/DEBIAN" "$DEB_OUT/debian"
"$MAKE" --no-print-directory install-files DESTDIR="$root"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root$MODULES_DIR/$MODULE_SO"
install -d -m 0755 "$doc/docs"
for f in README.md CHANGELOG.md docs/*.md; do
    gzip -9n < "$f" > "$doc/$f.gz"
    chmod 0644 "$doc/$f.gz"
done

printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$DEB_PKG" "$DEB_PKG" > "$DEB_OUT/debian/control"
shlibs=$(cd "$DEB_OUT" && dpkg-shlibdeps -O -e "root$MODULES_DIR/$MODULE_SO" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
test -n "$shlibs" || { echo "dpkg-shlibdeps found no dependencies (make deps installs dpkg-dev)" >&2; exit 1; }

for script in postinst prerm postrm; do
    { printf '#!/bin/sh\nset -e\n'
      sed "s/#NAMES#/$SNIPPET:$ENABLED/" "/usr/share/debhelper/autoscripts/$script-nginx"
    } > "$root/DEBIAN/$script"
    chmod 0755 "$root/DEBIAN/$script"
done
(cd "$root" && find usr -type f | sort | xargs md5sum) > "$root/DEBIAN/md5sums"
cat > "$root/DEBIAN/control" <<CONTROL
Package: $DEB_PKG
Version: $DEB_VERSION
Architecture: $arch
Maintainer: $DEB_MAINTAINER
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $abi, libnginx-mod-http-lua (>= $epoch$LUA_OLDEST), libnginx-mod-http-lua (<< $epoch$after), lua-resty-core, $shlibs
Recommends: nginx
Section: httpd
Priority: optional
Description: per-worker thread pools of LuaJIT states for nginx's lua module
 An nginx module that runs CPU-heavy Lua in threads of each worker,
 with a persistent LuaJIT state per thread, while the request waits
 and the event loop serves other requests. Lua: resty.threadpool.
CONTROL
dpkg-deb --root-owner-group -Zxz --build "$root" "$DEB_OUT/${DEB_PKG}_${DEB_VERSION}_$arch.deb"
