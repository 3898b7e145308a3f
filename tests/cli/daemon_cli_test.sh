#!/usr/bin/env bash
# knod-policy's daemon commands against a live knod-policyd; run inside scripts/knod-sandbox.sh.
# Usage: knod-sandbox.sh --unique-sim -- daemon_cli_test.sh KNOD_POLICY KNOD_TEST_CLIENT
set -u
cli=$1 client=$2
. "$(dirname "$0")/../../scripts/wait-lib.sh"
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; return 1; fi; }

"$cli" status >"$KNOD_SANDBOX/out" 2>&1
check "status shows the sim driver" 'grep -q "driver sim" "$KNOD_SANDBOX/out"'
"$cli" status --json >"$KNOD_SANDBOX/out"
check "status --json parses" 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"journal_available\"] and d[\"rules\"]==3" "$KNOD_SANDBOX/out"'

# bash unsets a coprocess's NAME and NAME_PID as soon as it exits: keep our own pid and fds of
# each (under set -u a late "${HOLD[0]}" or "$HOLD_PID" would be a race with the client's exit).
coproc HOLD { exec "$client" hold "$KNOD_SIM_NETDEV" sim0 65536 "udp 10.99.0.1:* -> 10.99.0.2:5000"; }
hold_pid=$HOLD_PID
exec {hold_out}<&"${HOLD[0]}" {HOLD[0]}<&-
read -r line <&"$hold_out"
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
sighup_journaled() {
    [ "$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select count(*) from events where reason='reloaded by SIGHUP'")" = 1 ]
}
check "SIGHUP reloads too" 'wait_until 60 "the SIGHUP reload in the journal" sighup_journaled'
"$cli" status --bus-address=unix:path=/nonexistent >"$KNOD_SANDBOX/out" 2>&1
check "an unreachable bus is a clear error with exit 2" '[ $? -eq 2 ] && grep -q "cannot connect" "$KNOD_SANDBOX/out"'
kill "$hold_pid" 2>/dev/null
wait "$hold_pid" 2>/dev/null
exec {hold_out}<&-
"$cli" revoke b0000000000000000 --reason test >"$KNOD_SANDBOX/out" 2>&1
check "revoking a binding that does not exist is refused with exit 1" '[ $? -eq 1 ]'

# bindings as an admin follows them (issue 22): every column, and --watch with rates.
coproc ACTIVE { exec "$client" hold-active "$KNOD_SIM_NETDEV" sim0 65536 "udp 10.99.0.1:* -> 10.99.0.2:5000"; }
active_pid=$ACTIVE_PID
exec {active_out}<&"${ACTIVE[0]}" {active_in}>&"${ACTIVE[1]}" {ACTIVE[0]}<&- {ACTIVE[1]}>&-
read -r line <&"$active_out"
id=$(echo "$line" | cut -d' ' -f2)
check "an active holder got a binding" '[ "${line%% *}" = ok ]'
"$cli" bindings >"$KNOD_SANDBOX/out"
check "the bindings table has state, rule, job (- untagged), created, expires, RX bytes and packets, and the flows" \
    'head -1 "$KNOD_SANDBOX/out" | grep -q "^ID  *STATE  *UID  *PID  *NETDEV  *GPU  *REGION  *RULE  *JOB  *CREATED  *EXPIRES  *RX BYTES  *RX PACKETS$" &&
     grep -q "^$id  *active  *0  .* $KNOD_SIM_NETDEV  *sim0  *64.0KiB  *sim-local  *-  *20[0-9-]* [0-9:]*Z  *[0-9]*m[0-9]*s  *0  *0$" "$KNOD_SANDBOX/out" &&
     grep -q "^    flow udp 10.99.0.1:\* -> 10.99.0.2:5000$" "$KNOD_SANDBOX/out"'

# --watch --json: one snapshot per line; rates from the second frame on. Traffic is sent once
# the first frame is out, so a later frame counts it and shows a rate above zero.
"$cli" bindings --watch --json --interval 0.3 --count 8 >"$KNOD_SANDBOX/watch.jsonl" 2>&1 &
watch_pid=$!
wait_until 60 "the first --watch frame" test -s "$KNOD_SANDBOX/watch.jsonl"
"$cli" sim-send --netns "$KNOD_SIM_NETNS" --to 10.99.0.2:5000 --count 5 --data abcd >/dev/null 2>&1
wait "$watch_pid"; watch_rc=$?
check "bindings --watch --json streams one JSON snapshot per line, with rates after the first" \
    '[ $watch_rc -eq 0 ] && python3 -c "
import json, sys
frames = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(frames) == 8, len(frames)
b0 = [b for b in frames[0][\"bindings\"] if b[\"id\"] == sys.argv[2]][0]
assert b0[\"rx_bytes_per_s\"] is None and b0[\"rx_packets_per_s\"] is None and b0[\"rx_packets\"] == 0, b0
last = [b for b in frames[-1][\"bindings\"] if b[\"id\"] == sys.argv[2]][0]
assert last[\"rx_packets\"] == 5 and last[\"rx_bytes\"] == 20 and last[\"state\"] == \"active\", last
rates = [b[\"rx_packets_per_s\"] for f in frames[1:] for b in f[\"bindings\"] if b[\"id\"] == sys.argv[2]]
assert all(r is not None and r >= 0 for r in rates) and any(r > 0 for r in rates), rates
assert all(f[\"at_us\"] > p[\"at_us\"] for p, f in zip(frames, frames[1:]))
" "$KNOD_SANDBOX/watch.jsonl" "$id"'

# Under a pseudo-terminal: each frame clears the screen and redraws in place, like top.
script -qec "$cli bindings --watch --interval 0.2 --count 2" /dev/null >"$KNOD_SANDBOX/tty.out" 2>&1
check "bindings --watch on a terminal redraws: two frames, each after a clear-screen, with the rate columns" \
    'python3 -c "
import sys
t = open(sys.argv[1], \"rb\").read().decode()
frames = t.split(\"\\x1b[H\\x1b[2J\")
assert frames[0] == \"\" and len(frames) == 3, repr(t[:200])
for f in frames[1:]:
    assert f.startswith(\"knod-policy bindings  \") and \"(Ctrl-C quits)\" in f, repr(f[:200])
    assert \"RX/S\" in f and \"PKT/S\" in f and sys.argv[2] in f, repr(f)
" "$KNOD_SANDBOX/tty.out" "$id"'
"$cli" bindings --watch --interval 0.2 --count 2 >"$KNOD_SANDBOX/plain.out" 2>&1
check "bindings --watch into a pipe prints plain snapshots, no terminal codes" \
    '[ "$(grep -c "^knod-policy bindings  " "$KNOD_SANDBOX/plain.out")" -eq 2 ] && ! grep -q $'"'"'\x1b'"'"' "$KNOD_SANDBOX/plain.out" &&
     [ "$(grep -c "^$id  *active" "$KNOD_SANDBOX/plain.out")" -eq 2 ]'

# Job tags (issue #53): two ranks of one job, tagged by their holders (SetJob), listed together
# before the untagged binding, sorted by rank; --job keeps only them; --json carries the tag.
coproc RANK1 { KNOD_TEST_JOB=10.0.0.9:29500 KNOD_TEST_JOB_GROUP=0 KNOD_TEST_JOB_RANK=1 \
    exec "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5001"; }
rank1_pid=$RANK1_PID
exec {rank1_out}<&"${RANK1[0]}" {rank1_in}>&"${RANK1[1]}" {RANK1[0]}<&- {RANK1[1]}>&-
read -r line <&"$rank1_out"
rank1=$(echo "$line" | cut -d' ' -f2)
coproc RANK0 { KNOD_TEST_JOB=10.0.0.9:29500 KNOD_TEST_JOB_GROUP=0 KNOD_TEST_JOB_RANK=0 \
    exec "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5002"; }
rank0_pid=$RANK0_PID
exec {rank0_out}<&"${RANK0[0]}" {rank0_in}>&"${RANK0[1]}" {RANK0[0]}<&- {RANK0[1]}>&-
read -r line2 <&"$rank0_out"
rank0=$(echo "$line2" | cut -d' ' -f2)
check "two ranks of a job got and tagged their bindings" '[ "${line%% *}" = ok ] && [ "${line2%% *}" = ok ]'
ids_in_order() { awk '$1 ~ /^b[0-9a-f]+$/ {printf "%s ", $1}' "$KNOD_SANDBOX/out"; }
"$cli" bindings >"$KNOD_SANDBOX/out"
check "bindings lists the job's ranks together, in rank order, before the untagged one" \
    '[ "$(ids_in_order)" = "$rank0 $rank1 $id " ] &&
     grep -q "^$rank0 .*  10\.0\.0\.9:29500\[0\]#0  " "$KNOD_SANDBOX/out" &&
     grep -q "^$rank1 .*  10\.0\.0\.9:29500\[0\]#1  " "$KNOD_SANDBOX/out"'
"$cli" bindings --json --job 10.0.0.9:29500 >"$KNOD_SANDBOX/out"
check "bindings --json --job lists exactly the job's ranks with their tags" 'python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert [(b[\"id\"], b[\"job\"], b[\"group\"], b[\"rank\"]) for b in d] == [
    (sys.argv[2], \"10.0.0.9:29500\", \"0\", 0), (sys.argv[3], \"10.0.0.9:29500\", \"0\", 1)], d
" "$KNOD_SANDBOX/out" "$rank0" "$rank1"'
"$cli" bindings --json >"$KNOD_SANDBOX/out"
check "bindings --json gives an untagged binding null job, group and rank" 'python3 -c "
import json, sys
b = [b for b in json.load(open(sys.argv[1])) if b[\"id\"] == sys.argv[2]][0]
assert b[\"job\"] is None and b[\"group\"] is None and b[\"rank\"] is None, b
" "$KNOD_SANDBOX/out" "$id"'
"$cli" bindings --job no-such-job >"$KNOD_SANDBOX/out"
check "bindings --job of no binding says so" 'grep -q "^no bindings$" "$KNOD_SANDBOX/out"'
exec {rank1_in}>&- {rank1_out}<&- {rank0_in}>&- {rank0_out}<&-
wait "$rank1_pid" "$rank0_pid" 2>/dev/null
echo >&"$active_in" 2>/dev/null
exec {active_in}>&- {active_out}<&-
wait "$active_pid" 2>/dev/null

check "the sandbox's dbus-daemon does not name an account this host lacks" \
    '! grep -q "Unknown username\|Unknown group" "$KNOD_SANDBOX/bus.log"'

# The daemon gone, the bus still there: exit 2, saying so and naming the bus.
kill -TERM "$KNOD_DAEMON_PID"
# Gone, or a zombie: the sandbox, its parent, is busy running this test and reaps it later.
daemon_gone() {
    ! kill -0 "$KNOD_DAEMON_PID" 2>/dev/null ||
        [ "$(cut -d' ' -f3 "/proc/$KNOD_DAEMON_PID/stat" 2>/dev/null)" = Z ]
}
wait_until 60 "knod-policyd to exit after SIGTERM" daemon_gone
"$cli" bindings --watch --count 2 >"$KNOD_SANDBOX/out" 2>&1
check "bindings without the daemon: exit 2, names the bus and the missing daemon" \
    '[ $? -eq 2 ] && grep -q "knod-policyd is not running" "$KNOD_SANDBOX/out" && grep -qF "$DBUS_SYSTEM_BUS_ADDRESS" "$KNOD_SANDBOX/out"'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
