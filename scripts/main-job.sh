#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, then shows knod-policy at work: the
# policy checked and explained, then knod-policyd with the sim driver on a private bus serving a
# scripted client session (the article's register_buffer / wait_for_data, in C++ and in Python),
# with traffic from the wire side for an allowed flow and a forbidden one, and the journal trail
# it leaves. It stops everything and leaves nothing behind.
# It installs and builds only what it runs (install-deps.sh --for main; the `main` preset: the
# CLI, the daemon, the client library and the C++ example, warnings as errors, no test suite);
# scripts/run-tests.sh adds the test rig and builds the rest in the same build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --for main
bash scripts/build.sh main
cli=build/cli/knod-policy
policy=packaging/policy.example.toml
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}" || true; }
step "Validate the shipped example policy" $cli check $policy
step "A broken policy is rejected with file:line:col" \
    $cli check tests/data/policies/bad/inverted_ports.toml
step "Explain: uid 1000 asks for the simulated NIC and GPU" \
    $cli explain --policy $policy --user 1000 --netdev knodsim0 --gpu sim0 \
    --flow 'udp 10.99.0.1:* -> 10.99.0.2:5000' --bytes 16MiB
step "Host checks on a fixture machine (MI250X + ConnectX-6 Dx under one ACS switch)" \
    $cli doctor --host-root tests/data/hosts/mi250x-cx6 --nic eth2
step "... and on this machine (a VM: no IOMMU, no GPU, so hardware bindings would be refused)" \
    $cli doctor

printf '\n\033[1m== knod-policyd with the sim driver on a private bus\033[0m\n'
# KNOD_SIM_GUARD=tc|xdp forces where the sim's guard runs (knod-policyd --sim-guard); by default
# the daemon probes the kernel and says in `status` which it took and why.
sandbox_args=()
[ -n "${KNOD_SIM_GUARD:-}" ] && sandbox_args+=(--daemon-arg "--sim-guard=$KNOD_SIM_GUARD")
scripts/knod-sandbox.sh "${sandbox_args[@]}" -- bash -c '
set -u
cli=build/cli/knod-policy
step() { printf "\n\033[1m== %s\033[0m\n$ %s\n" "$1" "${*:2}"; "${@:2}" || true; }
step "The daemon is up; the sim NIC knodsim0 carries the flow filter" $cli status
ip -brief link show knodsim0

printf "\n\033[1m== A client registers a 4 KiB buffer for udp -> 10.99.0.2:5000 and waits\033[0m\n"
coproc RX { exec build/examples/knod-example-receive --netdev knodsim0 --gpu sim0 --bytes 4096 \
    --flow "udp 10.99.0.0/24:* -> 10.99.0.2:5000" --packets 3 --timeout-ms 5000 2>&1; }
exec {rx}<&"${RX[0]}" # bash forgets RX when the client exits; keep our own copy of its output
while read -r line <&$rx; do echo "  client: $line"; echo "$line" >>"$KNOD_SANDBOX/rx.log"
    case $line in activated*) break;; esac; done
step "Its binding, as the daemon lists it" $cli bindings
step "The wire side sends 3 datagrams on the allowed flow" \
    $cli sim-send --to 10.99.0.2:5000 --count 3 --data "tensor-chunk;"
step "... and 4 on port 5001, which no binding holds" \
    $cli sim-send --to 10.99.0.2:5001 --count 4 --data "FORBIDDEN"
while read -r line <&$rx; do echo "  client: $line"; echo "$line" >>"$KNOD_SANDBOX/rx.log"; done
step "The filter counted the forbidden flow (unmatched_passed): never delivered" $cli status

printf "\n\033[1m== The same in Python: examples/receive.py (import knod; register_buffer; wait_for_data)\033[0m\n"
coproc PY { exec env PYTHONPATH=python KNOD_CLIENT_LIBRARY=build/client/libknod-client.so.1 \
    /usr/bin/python3 examples/receive.py --netdev knodsim0 --gpu sim0 --bytes 4096 \
    --flow "udp 10.99.0.0/24:* -> 10.99.0.2:5002" --packets 2 --timeout-ms 5000 2>&1; }
exec {py}<&"${PY[0]}"
while read -r line <&$py; do echo "  python: $line"; echo "$line" >>"$KNOD_SANDBOX/py.log"
    case $line in activated*) break;; esac; done
step "The wire side sends 2 datagrams to the Python client" \
    $cli sim-send --to 10.99.0.2:5002 --count 2 --data "py-chunk;"
while read -r line <&$py; do echo "  python: $line"; echo "$line" >>"$KNOD_SANDBOX/py.log"; done
step "uid 65534 asks too; the policy denies it by name" \
    setpriv --reuid=65534 --regid=65534 --clear-groups build/examples/knod-example-receive \
    --flow "udp 10.99.0.0/24:* -> 10.99.0.2:5000"

printf "\n\033[1m== Steering drift: foreign traffic lands on a held binding'"'"'s RX queue\033[0m\n"
coproc HOLD { exec build/examples/knod-example-receive --netdev knodsim0 --gpu sim0 --bytes 4096 \
    --flow "udp 10.99.0.0/24:* -> 10.99.0.2:5002" --packets 1 --timeout-ms 8000 2>&1; }
exec {hold}<&"${HOLD[0]}"
while read -r line <&$hold; do echo "  client: $line"; case $line in activated*) break;; esac; done
echo "  (a stray steering rule, as a misconfigured NIC would have, puts port 5003 on every offload"
echo "   queue; the guard (behind the filter at tc ingress, or inside it: status says which) drops"
echo "   it on the bound one and the daemon ends the binding within a second: steering-drift)"
for q in 1 2 3; do $cli sim-send --to 10.99.0.2:5003 --data STRAY --queue $q; done
while read -r line <&$hold; do echo "  client: $line"; done
step "The guard counted it (misrouted)" $cli status
step "No bindings left" $cli bindings
step "The journal trail" sqlite3 -column -header "$KNOD_STATE_DIR/journal.db" \
    "select seq, kind, session_id, uid, rule, decision, reason from events"
step "The session row, with its final counters" sqlite3 -column -header "$KNOD_STATE_DIR/journal.db" \
    "select id, uid, netdev, gpu, rule, end_reason, rx_bytes, rx_packets, dropped_packets from sessions"
step "The chain verifies" $cli audit verify --db "$KNOD_STATE_DIR/journal.db"
printf "\n\033[1m== What the clients printed, checked against the journal\033[0m\n"
figures_rc=0 # a figure the main job printed that the journal contradicts fails the job
scripts/check-client-figures.sh "$KNOD_SANDBOX/rx.log" "$KNOD_STATE_DIR/journal.db" "C++ client" || figures_rc=1
scripts/check-client-figures.sh "$KNOD_SANDBOX/py.log" "$KNOD_STATE_DIR/journal.db" "Python client" || figures_rc=1
drifted=$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select count(*) from sessions where end_reason = '"'"'steering-drift'"'"'")
if [ "$drifted" = 1 ]; then echo "  the held binding ended as steering-drift, as shown"
else echo "  FAILED: $drifted session(s) ended as steering-drift; the stray steering went unseen"; figures_rc=1; fi
exit $figures_rc
' </dev/null
printf '\n\033[1m== Left behind\033[0m\n'
# This session's own names exactly (other daemons on this host may have sims of their own).
left=0
[ -e /sys/class/net/knodsim0 ] && { echo "link knodsim0 is still there"; left=1; }
[ -e /run/netns/knod-sim ] && { echo "namespace knod-sim is still there"; left=1; }
[ -e /sys/fs/bpf/knod/knodsim0 ] && { echo "BPF pins under /sys/fs/bpf/knod/knodsim0 are still there"; left=1; }
[ "$left" -eq 0 ] && echo "nothing: link knodsim0, namespace knod-sim and the BPF pins are gone"
exit "$left"
