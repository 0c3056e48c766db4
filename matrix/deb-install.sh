#!/usr/bin/env bash
# Installs a package `make deb` built (DEB, default the one under
# CARGO_TARGET_DIR or target/) as a user would, `apt-get install ./PKG.deb`,
# which brings nginx, the lua module and the rest from the archive, then
# serves docs/configuration.md's example (nginx-conf/debian/) through the
# stock /etc/nginx on a free loopback port and stops nginx again. Meant for
# a system that is there to be tried on and has seen nothing of the build:
# a fresh chroot of the package's release (`make deb-test` runs it so).
#
#   FRESH=1 RELEASE=forky matrix/chroot.sh matrix/deb-install.sh
set -euo pipefail

deb=$(realpath "${1:-$(ls "${CARGO_TARGET_DIR:-target}"/debian/libnginx-mod-http-threadpool_*.deb)}")
example=nginx-conf/debian
started=
stop() {
    [ -n "$started" ] || return 0
    local pid
    pid=$(cat /run/nginx.pid 2>/dev/null) || return 0
    nginx -s quit 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}
trap stop EXIT

echo "deb-install.sh: apt-get install $deb"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" > /var/log/deb-install.log 2>&1 || {
    tail -30 /var/log/deb-install.log >&2; exit 1; }
enabled=$(ls /etc/nginx/modules-enabled/)
echo "modules-enabled:" $enabled
grep -qx 60-mod-http-threadpool.conf <<< "$enabled" || {
    echo "deb-install.sh: the package did not enable the module" >&2; exit 1; }

# A loopback port no socket holds in any state (/proc/net/tcp lists
# listeners, connections and TIME_WAIT alike), below the kernel's ephemeral
# ports: a port taken from those can be a client's local port by the time
# nginx binds it ("Address already in use"). Other runs may hold the
# example's 8080.
ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
held=$(awk 'NR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null | sort -u)
port=
for _ in $(seq 50); do
    p=$((20000 + RANDOM % (ephemeral - 20000)))
    if ! grep -qx "$(printf '%04X' "$p")" <<< "$held"; then port=$p; break; fi
done
[ -n "$port" ] || { echo "deb-install.sh: no free port" >&2; exit 1; }
# Loopback only: the stock default site would listen on port 80 of all
# addresses.
rm -f /etc/nginx/sites-enabled/default
sed "s/127\.0\.0\.1:8080/127.0.0.1:$port/" "$example/threadpool.conf" > /etc/nginx/conf.d/threadpool.conf
mkdir -p /etc/nginx/lua
cp -r "$example/lua/myapp" /etc/nginx/lua/
nginx -t
started=1
nginx

# GET PATH on the port, the body's first line (the answer ends the
# connection: HTTP/1.0).
get() {
    local line body= in_body=
    exec 3<> "/dev/tcp/127.0.0.1/$port" || return 1
    printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$1" >&3
    while IFS= read -r line <&3; do
        line=${line%$'\r'}
        if [ -n "$in_body" ]; then body=$line; break; fi
        [ -n "$line" ] || in_body=1
    done
    exec 3<&-
    printf '%s' "$body"
}
answer=
for _ in $(seq 50); do
    answer=$(get "/upper?s=debian" 2>/dev/null) && [ -n "$answer" ] && break
    sleep 0.1
done
echo "$(. /etc/os-release && echo "$PRETTY_NAME"), $(dpkg-deb -f "$deb" Depends | grep -o "nginx-abi-[^,]*"), $(dpkg-query -W -f='${Package} ${Version}' libnginx-mod-http-lua): $answer"
[ "$answer" = "DEBIAN (thread_pool)" ] || {
    echo "deb-install.sh: /upper?s=debian answered \"$answer\", not \"DEBIAN (thread_pool)\"" >&2
    tail -20 /var/log/nginx/error.log >&2
    exit 1; }
if grep -E '\[(alert|emerg|crit|error)\]' /var/log/nginx/error.log; then
    echo "deb-install.sh: nginx's error log has the lines above" >&2
    exit 1
fi
