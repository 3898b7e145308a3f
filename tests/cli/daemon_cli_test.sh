#!/usr/bin/env bash
# knod-policy's daemon commands against a live knod-policyd; run inside scripts/knod-sandbox.sh.
# Usage: knod-sandbox.sh -- daemon_cli_test.sh KNOD_POLICY KNOD_TEST_CLIENT
set -u
cli=$1 client=$2
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; fi; }

"$cli" status >"$KNOD_SANDBOX/out" 2>&1
check "status shows the sim driver" 'grep -q "driver sim" "$KNOD_SANDBOX/out"'
"$cli" status --json >"$KNOD_SANDBOX/out"
check "status --json parses" 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"journal_available\"] and d[\"rules\"]==3" "$KNOD_SANDBOX/out"'

coproc HOLD { exec "$client" hold knodsim0 sim0 65536 "udp 10.99.0.1:* -> 10.99.0.2:5000"; }
read -r line <&"${HOLD[0]}"
id=$(echo "$line" | cut -d' ' -f2)
check "a holder got a binding" '[ "${line%% *}" = ok ]'
"$cli" bindings >"$KNOD_SANDBOX/out"
check "bindings shows the rule, the expiry and the flows" 'grep -q "RULE" "$KNOD_SANDBOX/out" && grep -q "    flow udp" "$KNOD_SANDBOX/out"'
"$cli" bindings --json >"$KNOD_SANDBOX/out"
check "bindings --json carries rule, flows, expiry and counters" 'python3 -c "import json,sys; b=json.load(open(sys.argv[1]))[0]; assert b[\"rule\"] and b[\"flows\"] and b[\"expires_us\"] > b[\"created_us\"] and \"rx_bytes\" in b" "$KNOD_SANDBOX/out"'
"$cli" bindings --json >"$KNOD_SANDBOX/out"
check "bindings --json lists it" 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert [b[\"id\"] for b in d]==[sys.argv[2]]" "$KNOD_SANDBOX/out" "$id"'
setpriv --reuid=65534 --regid=65534 --clear-groups "$cli" revoke "$id" --reason test >"$KNOD_SANDBOX/out" 2>&1
check "revoke as nobody is denied with exit 1" '[ $? -eq 1 ] && grep -q Error.Denied "$KNOD_SANDBOX/out"'
"$cli" revoke "$id" --reason "security test" >"$KNOD_SANDBOX/out" 2>&1
check "revoke as root works" 'grep -q "revoked $id" "$KNOD_SANDBOX/out"'
check "the revoke is journaled with its reason" '[ "$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select reason from events where kind=\"revoke\"")" = "security test" ]'
"$cli" bindings >"$KNOD_SANDBOX/out"
check "no bindings after the revoke" 'grep -q "no bindings" "$KNOD_SANDBOX/out"'
"$cli" reload >"$KNOD_SANDBOX/out" 2>&1
check "reload as root works" 'grep -q "policy reloaded: 3 rule(s)" "$KNOD_SANDBOX/out"'
kill -HUP "$KNOD_DAEMON_PID"
check "SIGHUP reloads too" 'for i in $(seq 50); do [ "$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select count(*) from events where reason=\"reloaded by SIGHUP\"")" = 1 ] && break; sleep 0.05; done; [ $i -lt 50 ]'
"$cli" status --bus-address=unix:path=/nonexistent >"$KNOD_SANDBOX/out" 2>&1
check "an unreachable bus is a clear error with exit 2" '[ $? -eq 2 ] && grep -q "cannot connect" "$KNOD_SANDBOX/out"'
kill "$HOLD_PID" 2>/dev/null
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
