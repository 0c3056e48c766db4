#!/usr/bin/env bash
# Installs the Debian packages of its arguments that are missing, on any
# Debian-family release: `make deps` runs it with the Makefile's list. An
# argument `a|b|c` names alternatives (a package that has another name on
# other releases): the first one installed, else the first one apt has a
# candidate for. apt-get update runs first when something is missing (the
# lists may be empty or out of date); what apt then does not know is an
# error that names it.
#
#   matrix/deps.sh nginx 'libluajit2-5.1-dev|libluajit-5.1-dev'
set -euo pipefail

sudo=
[ "$(id -u)" = 0 ] || sudo=sudo

installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'; }
candidate() {
    local c
    c=$(apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: //p')
    [ -n "$c" ] && [ "$c" != "(none)" ]
}

# The words none of whose alternatives is installed.
wanted=()
for word in "$@"; do
    IFS='|' read -r -a alts <<< "$word"
    ok=
    for p in "${alts[@]}"; do
        if installed "$p"; then ok=1; break; fi
    done
    [ -n "$ok" ] || wanted+=("$word")
done
[ ${#wanted[@]} -gt 0 ] || exit 0

$sudo apt-get update -qq
# Each wanted word as the package to install; the words apt knows nothing of.
picked=() unknown=()
for word in "${wanted[@]}"; do
    IFS='|' read -r -a alts <<< "$word"
    p=
    for alt in "${alts[@]}"; do
        if candidate "$alt"; then p=$alt; break; fi
    done
    if [ -n "$p" ]; then picked+=("$p"); else unknown+=("$word"); fi
done
if [ ${#unknown[@]} -gt 0 ]; then
    echo "make deps: apt on this machine ($(. /etc/os-release && echo "$PRETTY_NAME")) has no package for: ${unknown[*]//|/ or }" >&2
    exit 1
fi
echo "installing:" "${picked[@]}"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${picked[@]}"
