#!/usr/bin/env bash
# knod_wake_bench, 50 datagrams each way, inside a sandbox with names of its own (ctest
# bench.wake_latency). Usage: wake_bench_test.sh SOURCE_DIR BUILD_DIR BENCH [--count N]
set -uo pipefail
src=$1 build=$2 bench=$3
shift 3
[ "$(id -u)" -eq 0 ] || { echo "wake bench: needs root (the sim's veth)"; exit 77; }
n=$(($$ % 100000))
exec "$src/scripts/knod-sandbox.sh" --build "$build" --daemon-arg "--sim-netdev=knodsimw$n" \
    --daemon-arg "--sim-netns=knod-simw$n" --daemon-arg "--bpf-pin-root=/sys/fs/bpf/knodwb$n" \
    --daemon-arg --journald=false --daemon-arg --linux-audit=false -- \
    "$bench" --netdev "knodsimw$n" --netns "knod-simw$n" --count 50 "$@"
