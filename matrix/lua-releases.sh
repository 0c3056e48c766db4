#!/usr/bin/env bash
# `make test-lua-releases`: for each lua-nginx-module release named in
# LUA_RELEASES, builds it (matrix/lua-module.sh, cached) and runs the test
# files LUA_RELEASE_TESTS with it loaded (NGX_TP_LUA_MODULE), with make
# test's binaries. Every release runs; the failed ones are named at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

tests=()
for t in $LUA_RELEASE_TESTS; do tests+=(--test "$t"); done
cargo test --release --no-run "${tests[@]}" || exit 1
failed=
for v in $LUA_RELEASES; do
    start=$(date +%s)
    if so=$(matrix/lua-module.sh "$v"); then
        built=$(date +%s)
        echo "lua-nginx-module $v: $so ($((built - start)) s)"
        NGX_TP_LUA_MODULE=$so cargo test --release --no-fail-fast "${tests[@]}" -- --test-threads=2 ||
            failed="$failed $v"
        echo "lua-nginx-module $v: tests $(($(date +%s) - built)) s"
    else
        failed="$failed $v (build)"
    fi
done
if [ -n "$failed" ]; then echo "test-lua-releases failed on:$failed" >&2; exit 1; fi
