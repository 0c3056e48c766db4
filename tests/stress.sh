#!/usr/bin/env bash
# make test-stress: `make test` RUNS times in a row while two CPU-bound
# processes keep the cores busy for the whole run (at the caller's nice,
# 0 from a plain shell), as on a developer's machine after a session. The
# suite's verdicts must not depend on the load: any red run fails, naming
# its failing tests (cargo's "test NAME ... FAILED" lines, under the test
# binary that ran them) and the soak's FAIL lines. Each run's output is
# kept in target/stress/run-N.log.
#
#   tests/stress.sh [RUNS]        (RUNS: 5 by default)
set -u

runs=${1:-5}
case $runs in '' | *[!0-9]* | 0) echo "usage: $0 [RUNS > 0]" >&2; exit 2 ;; esac
make=${MAKE:-make}
out=target/stress
mkdir -p "$out"

# The busy processes spin in the shell and look every ~0.1 s whether this
# script still runs: they end with it even if it is killed outright, when
# the traps below cannot run.
hogs=()
stop_hogs() {
	if [ ${#hogs[@]} -gt 0 ]; then
		kill "${hogs[@]}" 2>/dev/null
		wait "${hogs[@]}" 2>/dev/null
		hogs=()
	fi
}
trap stop_hogs EXIT
trap 'echo "test-stress: interrupted" >&2; exit 130' INT TERM HUP
for _ in 1 2; do
	bash -c 'while kill -0 "$1" 2>/dev/null; do for ((i = 0; i < 100000; i++)); do :; done; done' \
		hog $$ &
	hogs+=($!)
done
echo "test-stress: $runs runs of make test beside 2 busy processes (pids ${hogs[*]})"

# The failing tests of one run's output: "BINARY: TEST" for cargo's
# failures, "soak: REASON" for the soak's, "soak-test: TEST" for its own
# tests', "make: ..." when make failed before or beside them.
failures() {
	awk '
		/^ *Running / { bin = ($2 == "unittests") ? $3 : $2; in_bin = 0 }
		/^ *Doc-tests / { bin = "doc-tests " $2; in_bin = 0 }
		/^test .* \.\.\. FAILED$/ {
			name = $0; sub(/^test /, "", name); sub(/ \.\.\. FAILED$/, "", name)
			print bin ": " name; n++; in_bin++
		}
		# a test binary that died without a verdict per test
		/^error: test failed/ && !in_bin { print bin ": " $0; n++ }
		# the soak: a failure as it happens; at the end, a FAIL line naming
		# the report, then every reason, indented
		/^\[soak [0-9:]+\] FAIL: .*SOAK\.md$/ { soak = 1; n++; next }
		soak && /^\[soak [0-9:]+\]   / { line = $0; sub(/^\[soak [0-9:]+\] +/, "", line); print "soak: " line; next }
		{ soak = 0 }
		/^\[soak [0-9:]+\] FAIL: / { line = $0; sub(/^[^]]*\] FAIL: /, "", line); print "soak: " line; n++ }
		# the tests of the soak itself (make soak-test)
		/^FAIL: / { print "soak-test: " substr($0, 7); n++ }
		/^make(\[[0-9]+\])?: \*\*\* / { last = $0 }
		END { if (!n && last) print last }
	' "$1"
}

red=0
for ((run = 1; run <= runs; run++)); do
	log=$out/run-$run.log
	start=$(date +%s)
	"$make" --no-print-directory test >"$log" 2>&1
	rc=$?
	secs=$(($(date +%s) - start))
	if [ $rc -eq 0 ]; then
		echo "run $run/$runs: passed in ${secs} s"
	else
		red=$((red + 1))
		echo "run $run/$runs: FAILED (exit $rc) in ${secs} s, $log:"
		failures "$log" | sort -u | sed 's/^/  /'
	fi
done
stop_hogs
if [ $red -gt 0 ]; then
	echo "test-stress: $red of $runs runs failed"
	exit 1
fi
echo "test-stress: all $runs runs passed"
