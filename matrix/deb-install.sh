#!/usr/bin/env bash
# Installs the package `make deb` built for this release into the system's
# own nginx (/etc/nginx as Debian ships it), serves docs/configuration.md's example
# (nginx-conf/debian/) through it on 127.0.0.1:8080, then purges the
# package and the example again. For a machine or chroot that is there to
# be tried on: it starts and stops the system's nginx.
#
#   matrix/chroot.sh 'make deb && matrix/deb-install.sh'     # Debian 13
#   make deb && matrix/deb-install.sh                         # this Debian
set -euo pipefail

deb=$(ls "${CARGO_TARGET_DIR:-target}"/debian/libnginx-mod-http-threadpool_*.deb)
example=nginx-conf/debian
[ -e /etc/nginx/lua ] && lua_dir= || lua_dir=/etc/nginx/lua
cleanup() {
    nginx -s quit 2>/dev/null || true
    sleep 1
    rm -rf /etc/nginx/conf.d/threadpool.conf /etc/nginx/lua/myapp $lua_dir
    dpkg --purge libnginx-mod-http-threadpool >/dev/null 2>&1 || true
}
trap cleanup EXIT

dpkg -i "$deb" >/dev/null
ls /etc/nginx/modules-enabled/
cp "$example/threadpool.conf" /etc/nginx/conf.d/
mkdir -p /etc/nginx/lua
cp -r "$example/lua/myapp" /etc/nginx/lua/
nginx -t
nginx
answer=$(python3 - <<'PY'
import time, urllib.request
for _ in range(50):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8080/upper?s=debian", timeout=5).read().decode(), end="")
        break
    except OSError:
        time.sleep(0.1)
PY
)
echo "$(. /etc/os-release && echo "$PRETTY_NAME"), $(dpkg-deb -f "$deb" Depends | cut -d, -f1): $answer"
[ "$answer" = "DEBIAN (thread_pool)" ] || { echo "deb-install.sh: unexpected answer" >&2; exit 1; }
