#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (the README's test command).
# Needs root: tests use real kernel parts and callers that run as other users.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh ci
ctest --preset ci -j "$(nproc)"
