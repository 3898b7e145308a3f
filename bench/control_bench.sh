#!/usr/bin/env bash
# The control-plane benchmark in one command: knod_control_bench in a sandbox with the sim data
# path off, then in another with it on (a veth pair, namespace and BPF pins with names of this
# run's own, so it needs root), the same arguments to both. Prints both tables, or with --json
# one object {"datapath_off": ..., "datapath_on": ...}. docs/performance.md has the figures.
#
#   bench/control_bench.sh [--build DIR] [--modes off,on] [--json] [BENCH ARGS...]
#   (BENCH ARGS: knod_control_bench's --seconds, --clients, --live, --probes, --commits,
#    --build-budget, --holders, --holder-bindings, --holder-uids; the default --live is
#    10,1000,10000). The scale case (docs/performance.md): --modes off --live 0 --holders 10,2000
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
modes=off,on
json=
args=()
live_given=
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --json) json=--json; shift ;;
    --live) live_given=1; args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
    esac
done
[ -n "$live_given" ] || args+=(--live 10,1000,10000)
[ "$(id -u)" -eq 0 ] || { echo "control bench: needs root (the sim's veth and BPF)"; exit 77; }
bench=$build/bench/knod_control_bench
[ -x "$bench" ] || { echo "control bench: $bench is not built" >&2; exit 1; }
n=$(($$ % 100000))
common=(--build "$build" --policy "$repo/bench/control_bench_policy.toml" --bus-stats
    --daemon-arg --rate-limit=1000000 --daemon-arg --linux-audit=false)
run_mode() {
    case "$1" in
    off) "$repo/scripts/knod-sandbox.sh" "${common[@]}" --daemon-arg --sim-datapath=false -- \
        "$bench" --label "sim data path off" "${args[@]}" $json ;;
    on) "$repo/scripts/knod-sandbox.sh" "${common[@]}" --daemon-arg "--sim-netdev=knodsimc$n" \
        --daemon-arg "--sim-netns=knod-simc$n" --daemon-arg "--bpf-pin-root=/sys/fs/bpf/knodcb$n" \
        -- "$bench" --label "sim data path on" --netdev "knodsimc$n" "${args[@]}" $json ;;
    *) echo "control bench: unknown mode $1 (off, on)" >&2; return 2 ;;
    esac
}
rc=0 sep=
[ -z "$json" ] || printf '{'
for mode in ${modes//,/ }; do
    if [ -n "$json" ]; then
        out=$(run_mode "$mode") || rc=1
        printf '%s"datapath_%s":%s' "$sep" "$mode" "${out:-null}"
        sep=,
    else
        run_mode "$mode" || rc=1
        echo
    fi
done
[ -z "$json" ] || printf '}\n'
exit $rc
