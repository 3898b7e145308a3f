#!/usr/bin/env bash
# The daemon's own instructions per RequestBinding+Activate+Release pair, by function: the daemon
# (sim data path off) runs under callgrind in a sandbox; one client does a warm-up, the counters
# are zeroed, the client does N pairs, the counters are dumped. A dev tool (needs valgrind,
# which CI does not install: apt-get install valgrind); docs/performance.md has the figures.
#
#   bench/control_profile.sh [--build DIR] [--pairs N] [--out FILE.callgrind]
#   then: callgrind_annotate --inclusive=yes FILE.callgrind | less   (divide by N)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build pairs=300 out=$PWD/control.callgrind
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "control profile: unknown option $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "control profile: needs valgrind (a dev tool)" >&2; exit 77; }
work=$(mktemp -d /tmp/knod-profile.XXXXXX)
trap 'rm -rf "$work"' EXIT
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
echo "$out: $total instructions over $pairs pairs: $((total / pairs)) per pair"
