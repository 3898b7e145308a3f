#!/usr/bin/env bash
# Configures and builds knod-policy with the given CMake preset (default: ci, warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-ci}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
