#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, then shows knod-policy at work:
# the policy checked and explained, then knod-policyd with the sim driver on a private bus
# serving a scripted client session, and the journal trail it leaves. It stops everything and
# leaves nothing behind. (The sim data path, with packets landing in the client's buffer, joins
# this session when it lands.)
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

printf '\n\033[1m== knod-policyd with the sim driver on a private bus\033[0m\n'
scripts/knod-sandbox.sh -- bash -c '
set -u
cli=build/cli/knod-policy client=build/tests/knod_test_client
step() { printf "\n\033[1m== %s\033[0m\n$ %s\n" "$1" "${*:2}"; "${@:2}" || true; }
step "The daemon is up" $cli status
printf "\n\033[1m== A client (this shell'"'"'s child) asks for a 64 KiB region on knodsim0\033[0m\n"
coproc HOLD { exec $client hold knodsim0 sim0 65536 "udp 10.99.0.1:* -> 10.99.0.2:5000"; }
read -r line <&"${HOLD[0]}"
id=$(echo "$line" | cut -d" " -f2)
echo "granted: binding $id, key (shown once, to its holder only): $(echo "$line" | cut -d" " -f3 | cut -c1-16)..."
step "The binding, as the daemon lists it" $cli bindings
step "Another process presenting the same key is refused" $client activate "$id" "$(echo "$line" | cut -d" " -f3)"
step "uid 65534 asks too; an explicit deny rule names it" \
    setpriv --reuid=65534 --regid=65534 --clear-groups $client hold knodsim0 sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5000"
printf "\n\033[1m== The client exits; the daemon releases its binding within a second\033[0m\n"
kill $HOLD_PID; sleep 0.5
step "No bindings left" $cli bindings
step "The journal trail" sqlite3 -column -header "$KNOD_STATE_DIR/journal.db" \
    "select seq, kind, session_id, uid, rule, decision, reason from events"
step "The chain verifies" $cli audit verify --db "$KNOD_STATE_DIR/journal.db"
' </dev/null
printf '\nEverything the demo started is stopped and its temporary files are removed.\n'
