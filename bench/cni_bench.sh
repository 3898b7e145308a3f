#!/usr/bin/env bash
# knod-cni's ADD and DEL against a live daemon (sim, private bus), with VERSION as the baseline
# of the same run: bench/cni_bench.py in scripts/knod-sandbox.sh. docs/performance.md has figures.
#   bench/cni_bench.sh [--build DIR] [--rounds N] [--json]
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "cni bench: needs root (a network namespace)"; exit 77; }
exec "$repo/scripts/knod-sandbox.sh" --build "$build" --unique-sim --policy "$repo/tests/cni/policy.toml" -- \
    /usr/bin/python3 "$repo/bench/cni_bench.py" --cni "$build/cni/knod-cni" "${args[@]}"
