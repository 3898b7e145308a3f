#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (the README's test command).
# Needs root: tests use real kernel parts and callers that run as other users.
# KNOD_SKIP_VM=1 leaves out the live-kernel and whole-system tests (ctest label `vm`: QEMU boots
# of Debian's 6.12 kernel and of a Debian 12 system; minutes, and a download on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --for test
bash scripts/build.sh ci
select=()
if [ -n "${KNOD_SKIP_VM:-}" ]; then
    echo "run-tests: KNOD_SKIP_VM is set: skipping the vm label" >&2
    select=(-LE '^vm$')
fi
# The log feeds the closing summary: what did not pass, the ten slowest tests, the total.
log=build/ctest-last.log
rc=0
ctest --preset ci -j "$(nproc)" "${select[@]}" 2>&1 | tee "$log" || rc=$?
bash scripts/ctest-summary.sh "$log"
exit "$rc"
