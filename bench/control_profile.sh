#!/usr/bin/env bash
# The daemon's own instructions per RequestBinding+Activate+Release pair, by function: the daemon
# (sim data path off) runs under callgrind in a sandbox; one client does a warm-up, the counters
# are zeroed, the client does N pairs, the counters are dumped. A dev tool (needs valgrind,
# which CI does not install: apt-get install valgrind); docs/performance.md has the figures.
#
#   bench/control_profile.sh [--build DIR] [--pairs N] [--out FILE.callgrind]
#                            [--check BASELINE [--margin X]]
#   then: callgrind_annotate --inclusive=yes FILE.callgrind | less   (divide by N)
#
# --check: the regression guard (ctest bench.control_instructions): fail when the instructions per
# pair exceed X (default 1.5) times the baseline file's `instructions_per_pair`. Instruction
# counts, not time: the same on a loaded machine. The baseline file says how to update it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build pairs=300 out= check= margin=1.5
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --check) check=$2; shift 2 ;;
    --margin) margin=$2; shift 2 ;;
    *) echo "control profile: unknown option $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "control profile: SKIP: needs valgrind (scripts/install-deps.sh --for test installs it)" >&2; exit 77; }
# The bench policy grants root; the sandbox runs the daemon as its caller.
[ "$(id -u)" -eq 0 ] || { echo "control profile: SKIP: needs root (the bench policy grants uid 0)" >&2; exit 77; }
work=$(mktemp -d /tmp/knod-profile.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -z "$out" ]; then
    if [ -n "$check" ]; then out=$work/control.callgrind; else out=$PWD/control.callgrind; fi
fi
mkdir -p "$work/build/daemon" "$work/build/bench"
preload=
# valgrind before 3.20 answers pidfd_open with ENOSYS (see bench/callgrind_pidfd_shim.c).
if printf '3.20.0\n%s\n' "$(valgrind --version | sed 's/valgrind-//')" | sort -V -C; then :; else
    cc -O2 -shared -fPIC -o "$work/pidfd_shim.so" "$repo/bench/callgrind_pidfd_shim.c" -ldl
    preload=$work/pidfd_shim.so
fi
cat >"$work/build/daemon/knod-policyd" <<WRAP
#!/bin/sh
LD_PRELOAD=$preload exec valgrind --tool=callgrind --callgrind-out-file=$work/out.%p \
    "$build/daemon/knod-policyd" "\$@" 2>>"$work/valgrind.log"
WRAP
chmod +x "$work/build/daemon/knod-policyd"
bench=$build/bench/knod_control_bench
"$repo/scripts/knod-sandbox.sh" --build "$work/build" --policy "$repo/bench/control_bench_policy.toml" \
    --daemon-arg --rate-limit=1000000 --daemon-arg --linux-audit=false \
    --daemon-arg --sim-datapath=false -- bash -c "
        set -e
        '$bench' --pairs 50 >/dev/null
        callgrind_control -z \$KNOD_DAEMON_PID >/dev/null
        '$bench' --pairs $pairs
        callgrind_control -d \$KNOD_DAEMON_PID >/dev/null"
cp "$(ls "$work"/out.*.1 | head -1)" "$out"
total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
per_pair=$((total / pairs))
echo "$out: $total instructions over $pairs pairs: $per_pair per pair"
[ -n "$check" ] || exit 0
base=$(awk '$1 == "instructions_per_pair" {print $2}' "$check")
[ -n "$base" ] || { echo "control profile: no instructions_per_pair in $check" >&2; exit 2; }
ratio=$(awk -v n="$per_pair" -v b="$base" 'BEGIN {printf "%.2f", n / b}')
echo "baseline $base per pair ($check): this run is ${ratio}x, allowed up to ${margin}x"
if awk -v r="$ratio" -v m="$margin" 'BEGIN {exit !(r > m)}'; then
    echo "control profile: FAIL: the daemon's instructions per pair grew ${ratio}x over the" \
        "baseline; find what grew (callgrind_annotate --inclusive=yes on --out FILE," \
        "docs/performance.md), then take it back or update the baseline with the reason" >&2
    exit 1
fi
