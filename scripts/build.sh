#!/usr/bin/env bash
# Configures and builds knod-policy with the given CMake preset (default: ci, warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-ci}
# KNOD_CCACHE_DIR (tests/soak.sh sets it): compile through ccache with that cache, so the
# soak's clean clones after the first do not each rebuild from nothing. Off by default: CI and
# a person's build compile every object.
launcher=()
if [ -n "${KNOD_CCACHE_DIR:-}" ] && command -v ccache >/dev/null; then
    export CCACHE_DIR=$KNOD_CCACHE_DIR CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake --preset "$preset" "${launcher[@]}" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
