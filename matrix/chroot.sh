#!/usr/bin/env bash
# Runs a command in a Debian chroot of RELEASE (default trixie), made from
# Debian's archive with debootstrap and kept outside the checkout, under
# NGX_TP_CACHE (/var/cache/ngx-threadpool), so that the next run on this
# machine (CI's fresh clone included) reuses it. Inside, the checkout,
# cargo and rustup are mounted at the paths they have here, in a mount
# namespace of the command's own: the mounts go away with it, whatever way
# it ends, and two runs never see each other's.
#
#   matrix/chroot.sh 'make deps && make test'
#
# A chroot that debootstrap did not finish is made again; `make deps`
# inside installs what the project's Makefile asks for on that release.
set -euo pipefail

release=${RELEASE:-trixie}
cache=${NGX_TP_CACHE:-/var/cache/ngx-threadpool}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$cache/$release
repo=$(cd "$(dirname "$0")/.." && pwd)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}

[ "$(id -u)" = 0 ] || { echo "matrix/chroot.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: matrix/chroot.sh COMMAND" >&2; exit 2; }

mkdir -p "$cache"
exec 9>"$cache/$release.lock"
flock 9
if [ ! -e "$root/.complete" ]; then
    command -v debootstrap >/dev/null || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    echo "matrix/chroot.sh: making the $release chroot in $root (debootstrap, ~1 minute)"
    rm -rf "$root.new" "$root"
    debootstrap --variant=minbase --include=make,ca-certificates "$release" "$root.new" "$mirror" \
        > "$cache/$release.debootstrap.log" 2>&1 || {
        tail -20 "$cache/$release.debootstrap.log" >&2; exit 1; }
    # apt-get source (the nginx with the lua module built in) needs the
    # archive's source entries.
    sed -n 's/^deb /deb-src /p' "$root.new/etc/apt/sources.list" >> "$root.new/etc/apt/sources.list"
    touch "$root.new/.complete"
    mv "$root.new" "$root"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The checkout's mount point goes with the run (a fresh clone's path is new
# each time); the toolchain's stay.
[ -d "$root$repo" ] && made= || made=$root$repo
mkdir -p "$root$repo" "$root$cargo_home" "$root$rustup_home"
flock -u 9

# The command runs with the lock released: runs may share the chroot (each
# cargo build takes cargo's own locks, apt-get takes dpkg's).
rc=0
unshare --mount --propagation private -- bash -euo pipefail -c '
root=$1 repo=$2 cargo_home=$3 rustup_home=$4 command=$5
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --bind "$repo" "$root$repo"
mount --bind "$cargo_home" "$root$cargo_home"
mount --bind "$rustup_home" "$root$rustup_home"
exec chroot "$root" /usr/bin/env -i HOME="$HOME" TERM="${TERM:-dumb}" CI="${CI:-}" \
    PATH="$cargo_home/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    CARGO_HOME="$cargo_home" RUSTUP_HOME="$rustup_home" \
    CARGO_TARGET_DIR="$repo/target/'"$release"'" \
    bash -euo pipefail -c "cd \"$repo\" && $command"
' chroot.sh "$root" "$repo" "$cargo_home" "$rustup_home" "$*" || rc=$?
[ -z "$made" ] || rmdir "$made" || true
exit $rc
