#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, then walks through a policy decision
# the way an admin would. (The daemon demo with the sim driver replaces this once the daemon and
# sim data path land.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh ci
cli=build/cli/knod-policy
policy=packaging/policy.example.toml
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}" || true; }
step "Validate the shipped example policy" $cli check $policy
step "A broken policy is rejected with file:line:col" \
    $cli check tests/data/policies/bad/inverted_ports.toml
step "uid 1000 asks for the simulated NIC and GPU: allowed, and why" \
    $cli explain --policy $policy --user 1000 --netdev knodsim0 --gpu sim0 \
    --flow 'udp 10.99.0.1:* -> 10.99.0.2:5000' --bytes 16MiB
step "The same request for a flow outside the grant: denied, and why" \
    $cli explain --policy $policy --user 1000 --netdev knodsim0 --gpu sim0 \
    --flow 'udp 10.99.0.1:* -> 10.99.0.2:7000' --bytes 16MiB
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build/tests/journal_fill "$work/journal.db" 5
step "A journal of 5 sessions verifies" $cli audit verify --db "$work/journal.db"
sqlite3 "$work/journal.db" "DROP TRIGGER events_no_update; UPDATE events SET uid = 0 WHERE seq = 3"
step "After someone edits event 3 with plain SQL, verification names it" \
    $cli audit verify --db "$work/journal.db"
