#!/usr/bin/env bash
# The README's test command, N times in a row, each from a clean clone of HEAD, each with a CPU
# hog on every core beside it (stress-ng --cpu $(nproc), as a neighbour on a shared machine
# would be). Prints per run its verdict, what did not pass and the ten slowest tests; exits 1
# when any run failed. Needs root (the suite does). Minutes per run: a build and the suite.
#
# The runs share a compiler cache (ccache) for the top-level build, the package's build
# (packaging.build_deb) and the fuzzers' (fuzz.build), so each run spends its minutes on the
# suite, not on recompiling what an earlier one compiled; the load beside the tests is the
# hog's. --no-ccache turns that off. Every run's clone lies at the same path (clone/ under /var/tmp/knod-soak, removed between
# runs): compile lines carry the source dir (KNOD_SOURCE_DIR), so a clone at a new path would
# miss the cache for every test target. The cache stays there between soaks (the first run of
# a later soak is warm too); each soak's logs go to a directory of its own beside it.
#
#   tests/soak.sh [-n N] [--no-hog] [--skip-vm] [--no-ccache] [--keep]
#     -n N       runs (default 5)
#     --no-hog   no CPU hog of the soak's own (to compare, or when a hog of yours runs beside
#                it: two long fuzz runs load both cores as stress-ng --cpu 2 does)
#     --skip-vm  KNOD_SKIP_VM=1 for each run (leaves out the QEMU tests)
#     --no-ccache  every run compiles in full
#     --keep     keep each run's clone too (the logs are always kept, in the work dir printed)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
runs=5 hog=1 skip_vm= keep= ccache=1
while [ $# -gt 0 ]; do
    case "$1" in
    -n) runs=$2; shift 2 ;;
    --no-hog) hog=; shift ;;
    --skip-vm) skip_vm=1; shift ;;
    --no-ccache) ccache=; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set /{/^set /!p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "soak: run it as root, as the README's test command" >&2; exit 2; }
if [ -n "$hog" ] && ! command -v stress-ng >/dev/null; then
    apt-get install -y -qq stress-ng >/dev/null || { echo "soak: cannot install stress-ng" >&2; exit 1; }
fi
if [ -n "$ccache" ] && ! command -v ccache >/dev/null; then
    apt-get install -y -qq ccache >/dev/null || { echo "soak: cannot install ccache (try --no-ccache)" >&2; exit 1; }
fi
base=/var/tmp/knod-soak
mkdir -p "$base"
chmod 0755 "$base" # the suite's callers of other uids run the clone's programs and modules
exec 9>"$base/lock"
flock -n 9 || { echo "soak: another soak is running (it holds $base/lock)" >&2; exit 2; }
work=$(mktemp -d "$base/logs.XXXXXX")
chmod 0755 "$work"
hog_pid=
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null && wait "$hog_pid" 2>/dev/null; hog_pid=; }
trap 'stop_hog' EXIT INT TERM
head=$(git -C "$repo" rev-parse HEAD) # every run tests this commit, whatever lands meanwhile
echo "soak: $runs run(s) of scripts/run-tests.sh on ${head:0:12}, $([ -n "$hog" ] && echo with || echo without) a CPU hog on $(nproc) core(s); logs in $work"
green=0
for i in $(seq "$runs"); do
    clone=$base/clone
    rm -rf "$clone"
    git clone -q "$repo" "$clone" && git -C "$clone" checkout -q "$head"
    [ -n "$hog" ] && { stress-ng --cpu "$(nproc)" --quiet & hog_pid=$!; }
    start=$SECONDS
    (cd "$clone" && KNOD_SKIP_VM=$skip_vm KNOD_CCACHE_DIR=${ccache:+$base/ccache} bash scripts/run-tests.sh) >"$work/run$i.log" 2>&1
    rc=$?
    load=$(cut -d' ' -f1-3 /proc/loadavg) # before the hog stops
    stop_hog
    took=$((SECONDS - start))
    [ "$rc" -eq 0 ] && green=$((green + 1))
    echo
    echo "== run $i of $runs: $([ "$rc" -eq 0 ] && echo green || echo "RED (exit $rc)"), $((took / 60)) min $((took % 60)) s"
    # What the machine carried at the run's end (1, 5 and 15-minute averages): with a hog on
    # every core these stay at or above the core count, whoever the hog was.
    echo "  load average at the end: $load on $(nproc) core(s)"
    if [ -f "$clone/build/ctest-last.log" ]; then
        bash "$repo/scripts/ctest-summary.sh" "$clone/build/ctest-last.log"
        # The failed and timed-out tests of this run (not the skipped), for the tally below.
        sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (\(Failed\|Timeout\|Exception\|Not Run\)).*/\1/p' \
            "$clone/build/ctest-last.log" >"$work/run$i.failed"
    else
        echo "  no test ran; the log's end:"
        tail -20 "$work/run$i.log" | sed 's/^/  /'
    fi
    if [ -n "$keep" ]; then mv "$clone" "$work/run$i"; else rm -rf "$clone"; fi
done
echo
echo "soak: $green of $runs run(s) green"
# A test that failed in several runs is a pattern, not bad luck: the tally says which.
if cat "$work"/run*.failed 2>/dev/null | grep -q .; then
    echo "soak: failures by test (runs it failed in):"
    cat "$work"/run*.failed | sort | uniq -c | sort -rn | awk '{printf "  %d of '"$runs"'  %s\n", $1, $2}'
fi
echo "soak: the runs' logs are in $work"
[ "$green" -eq "$runs" ]
