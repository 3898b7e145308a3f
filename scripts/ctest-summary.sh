#!/usr/bin/env bash
# Prints, from a ctest log, the tests that did not pass and the ten slowest, with the total.
# Usage: ctest-summary.sh CTEST_LOG   (run-tests.sh and tests/soak.sh call it)
set -uo pipefail
log=$1
# ctest's result lines: "  12/355 Test  #34: name ......   Passed   12.34 sec" (or Failed,
# ***Timeout, Not Run, ***Exception).
results=$(sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) \.*\**\(.*\) \+\([0-9.]*\) sec$/\3 \1 \2/p' "$log")
echo "== slowest tests"
sort -rn <<<"$results" | head -10 | awk '{printf "  %8.1f s  %s\n", $1, $2}'
bad=$(awk '$3 != "Passed" && $0 != "" {print "  " $2 " (" substr($0, index($0, $3)) ")"}' <<<"$results")
echo "== not passed (failed, timed out or skipped): $( [ -n "$bad" ] && grep -c . <<<"$bad" || echo 0)"
[ -n "$bad" ] && echo "$bad"
grep -E '^Total Test time|tests passed, ' "$log" | sed 's/^/  /'
exit 0
