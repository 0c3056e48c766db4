#!/usr/bin/env bash
# Runs a command in a Debian chroot of RELEASE (default trixie; Debian
# testing is `forky` or `testing`), made with debootstrap from the Debian
# archive this machine's apt uses (DEBIAN_MIRROR overrides it) and kept
# outside the checkout, under NGX_TP_CACHE (/var/cache/ngx-threadpool), so
# that the next run on this machine (CI's fresh clone included) reuses it.
# Inside, the checkout, cargo and rustup are mounted at the paths they have
# here, in a mount namespace of the command's own: the mounts go away with
# it, whatever way it ends, and two runs never see each other's.
#
#   matrix/chroot.sh 'make deps && make test'
#   FRESH=1 matrix/chroot.sh matrix/deb-install.sh
#
# The cache keeps two trees per release: RELEASE.base, as debootstrap left
# it, and RELEASE, a copy of it where the builds run and `make deps`
# installs what the project's Makefile asks for. With FRESH=1 the command
# runs in a throwaway overlay of the base instead (a system that has seen
# nothing of the build), gone when the command ends. A tree that
# debootstrap or the copy did not finish is made again.
#
# BUILDD=1 (with FRESH=1) is a build daemon's chroot (make deb): no
# toolchain from this machine, only what the command installs from the
# archive, whose suites are the release's own, its -updates and -security
# where this machine's apt sources have them (Debian 12's rustc-web is in
# bookworm-security). apt's lists and downloaded packages are kept under
# NGX_TP_CACHE/apt/RELEASE for the next run.
#
# With FRESH=1, LAYER=DIR puts DIR between the base and the overlay's
# changes (what an earlier run installed), and KEEP=DIR keeps the changes
# of a run that succeeded as DIR, to be such a layer (make deb's build
# dependencies, packaging/deb.sh).
set -euo pipefail

release=${RELEASE:-trixie}
cache=${NGX_TP_CACHE:-/var/cache/ngx-threadpool}
root=$cache/$release
base=$cache/$release.base
repo=$(cd "$(dirname "$0")/.." && pwd)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}

[ "$(id -u)" = 0 ] || { echo "matrix/chroot.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: matrix/chroot.sh COMMAND" >&2; exit 2; }

# The URI of this machine's apt source for a suite (default: this
# machine's release, the Debian archive), deb822 sources first, then
# one-line ones.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
host_mirror() {
    local suite=${1:-$codename}
    [ -n "$suite" ] || return 0
    {
        cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$suite" '
            BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^[ \t]*#/ || (c = index($i, ":")) == 0) continue
                    key = tolower($i); key = substr(key, 1, c - 1)
                    value = substr($i, c + 1)
                    if (key == "types") types = " " value " "
                    else if (key == "uris") uris = value
                    else if (key == "suites") suites = " " value " "
                    else if (key == "enabled") enabled = value
                }
                gsub(/[ \t]+/, " ", types); gsub(/[ \t]+/, " ", suites)
                if (enabled !~ /no/ && types ~ / deb / && suites ~ (" " suite " ")) {
                    split(uris, u, " "); for (j in u) if (u[j] != "") { print u[j]; exit }
                }
            }'
        cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed 's/\[[^]]*\]//' | awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2 }'
    } | head -1 || true
}

mirror=${DEBIAN_MIRROR:-$(host_mirror)}
[ -n "$mirror" ] || {
    echo "matrix/chroot.sh: no apt source for this machine's release in /etc/apt/sources.list{,.d/*.sources}; set DEBIAN_MIRROR to a Debian archive URL" >&2
    exit 1; }

mkdir -p "$cache"
exec 9>"$cache/$release.lock"
flock 9
# The base is made when a tree is to be made from it (a build tree kept
# from before the base existed stays as it is).
if [ ! -e "$base/.complete" ] && { [ -n "${FRESH:-}" ] || [ ! -e "$root/.complete" ]; }; then
    command -v debootstrap >/dev/null || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    # A debootstrap older than the release has no script of its name:
    # testing and unstable share sid's.
    script=()
    [ -e "/usr/share/debootstrap/scripts/$release" ] || script=(/usr/share/debootstrap/scripts/sid)
    echo "matrix/chroot.sh: making the $release chroot in $base from $mirror (debootstrap, ~1 minute)"
    rm -rf "$base.new" "$base"
    debootstrap --variant=minbase --include=make,ca-certificates "$release" "$base.new" "$mirror" \
        "${script[@]}" > "$cache/$release.debootstrap.log" 2>&1 || {
        tail -20 "$cache/$release.debootstrap.log" >&2; exit 1; }
    # No package's maintainer script starts a daemon in the chroot (the
    # nginx of a fresh chroot would otherwise take port 80 of this host).
    printf '#!/bin/sh\nexit 101\n' > "$base.new/usr/sbin/policy-rc.d"
    chmod 0755 "$base.new/usr/sbin/policy-rc.d"
    touch "$base.new/.complete"
    mv "$base.new" "$base"
fi
if [ -z "${FRESH:-}" ] && [ ! -e "$root/.complete" ]; then
    rm -rf "$root.new" "$root"
    cp -a "$base" "$root.new"
    # apt-get source (the nginx with the lua module built in) needs the
    # archive's source entries.
    sed -n 's/^deb /deb-src /p' "$root.new/etc/apt/sources.list" >> "$root.new/etc/apt/sources.list"
    mv "$root.new" "$root"
fi
# A fresh system: an overlay of the base, its changes under the cache (not
# /tmp) and removed with it.
fresh=
if [ -n "${FRESH:-}" ]; then
    fresh=$(mktemp -d "$cache/$release.fresh.XXXXXX")
    mkdir "$fresh/upper" "$fresh/work" "$fresh/root"
    trap 'rm -rf "$fresh"' EXIT
fi
# What reaches the archive from here goes in too: the resolver, and apt's
# settings for it (a proxy; Check-Valid-Until off where this machine's apt
# reads a snapshot of the archive, whose testing Release has expired).
if [ -n "$fresh" ]; then etc=$fresh/upper/etc; else etc=$root/etc; fi
mkdir -p "$etc/apt/apt.conf.d"
cp /etc/resolv.conf "$etc/resolv.conf"
apt-config dump | grep -E '^Acquire::(Check-Valid-Until|https?::Proxy) ' \
    > "$etc/apt/apt.conf.d/99ngx-threadpool-host" || true
aptcache=
if [ -n "${BUILDD:-}" ]; then
    [ -n "$fresh" ] || { echo "matrix/chroot.sh: BUILDD=1 needs FRESH=1" >&2; exit 2; }
    echo "deb $mirror $release main" > "$etc/apt/sources.list"
    for suffix in -updates -security; do
        uri=$(host_mirror "$codename$suffix")
        [ -z "$uri" ] || echo "deb $uri $release$suffix main"
    done >> "$etc/apt/sources.list"
    aptcache=$cache/apt/$release
    mkdir -p "$aptcache/archives/partial" "$aptcache/lists/partial"
fi
# The checkout's mount point goes with the run (a fresh clone's path is new
# each time); the toolchain's stay. A worktree's git directory lies outside
# it: it is mounted too, read-only (for git in the chroot).
gitdir=$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
case $gitdir in "$repo"/*) gitdir= ;; esac
made=()
if [ -z "$fresh" ]; then
    for dir in "$repo" ${gitdir:+"$gitdir"}; do
        [ -d "$root$dir" ] || made+=("$root$dir")
    done
    mkdir -p "$root$repo" "$root$cargo_home" "$root$rustup_home" ${gitdir:+"$root$gitdir"}
fi
flock -u 9

# The command runs with the lock released: runs may share the chroot (each
# cargo build takes cargo's own locks, apt-get takes dpkg's).
rc=0
unshare --mount --propagation private -- bash -euo pipefail -c '
root=$1 repo=$2 cargo_home=$3 rustup_home=$4 command=$5 base=$6 fresh=$7 release=$8 gitdir=$9 aptcache=${10} layer=${11}
if [ -n "$fresh" ]; then
    mount -t overlay overlay -o "lowerdir=${layer:+$layer:}$base,upperdir=$fresh/upper,workdir=$fresh/work" "$fresh/root"
    root=$fresh/root
    mkdir -p "$root$repo" ${gitdir:+"$root$gitdir"}
    [ -n "$aptcache" ] || mkdir -p "$root$cargo_home" "$root$rustup_home"
fi
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --bind "$repo" "$root$repo"
if [ -n "$gitdir" ]; then
    mount --bind "$gitdir" "$root$gitdir"
    mount -o remount,bind,ro "$root$gitdir"
fi
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ -n "$aptcache" ]; then
    mount --bind "$aptcache/archives" "$root/var/cache/apt/archives"
    mount --bind "$aptcache/lists" "$root/var/lib/apt/lists"
    exec chroot "$root" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" PATH="$path" \
        bash -euo pipefail -c "cd \"$repo\" && $command"
fi
mount --bind "$cargo_home" "$root$cargo_home"
mount --bind "$rustup_home" "$root$rustup_home"
exec chroot "$root" /usr/bin/env -i HOME="$HOME" TERM="${TERM:-dumb}" CI="${CI:-}" \
    PATH="$cargo_home/bin:$path" \
    CARGO_HOME="$cargo_home" RUSTUP_HOME="$rustup_home" \
    CARGO_TARGET_DIR="$repo/target/$release" \
    bash -euo pipefail -c "cd \"$repo\" && $command"
' chroot.sh "$root" "$repo" "$cargo_home" "$rustup_home" "$*" "$base" "$fresh" "$release" "$gitdir" "$aptcache" "${LAYER:-}" || rc=$?
if [ $rc = 0 ] && [ -n "${KEEP:-}" ] && [ -n "$fresh" ]; then
    rm -rf "$KEEP"
    mv "$fresh/upper" "$KEEP"
fi
[ ${#made[@]} = 0 ] || rmdir "${made[@]}" 2>/dev/null || true
exit $rc
