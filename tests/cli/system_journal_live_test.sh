#!/usr/bin/env bash
# The daemon's chain-head records through a real journald into `audit verify` (#16 items 2, 8):
# a private journald (a tmpfs over /run, and over /var/log/journal where it exists, in a mount
# namespace of its own: the host's journal is never touched), the daemon on a private bus with
# the journald sink, reloads that commit events at least a second apart (the daemon sends at
# most one head a second), a copy of the journal taken halfway; then the journald sink counts
# writes and no failure, verify compares the records, and rolling back database and anchor to
# the copy fails verify through the system journal's records.
# Usage: system_journal_live_test.sh KNOD_POLICY BUILD_DIR SOURCE_DIR
set -u
cli=$(readlink -f "$1") build=$(readlink -f "$2") src=$(readlink -f "$3")
journald=/lib/systemd/systemd-journald
if [ "$(id -u)" -ne 0 ] || [ ! -x "$journald" ] || ! unshare -m true 2>/dev/null; then
    echo "ok - # SKIP needs root, unshare -m and $journald"
    exit 0
fi
if [ -z "${KNOD_PRIVATE_JOURNALD:-}" ]; then
    KNOD_PRIVATE_JOURNALD=1 exec unshare -m --propagation private "$0" "$@"
fi

work=$(mktemp -d)
journald_pid=
cleanup() {
    [ -n "$journald_pid" ] && kill "$journald_pid" 2>/dev/null && wait "$journald_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
py() { python3 -c "$1" "${@:2}"; }

mount -t tmpfs tmpfs /run || exit 1
[ -d /var/log/journal ] && { mount -t tmpfs tmpfs /var/log/journal || exit 1; }
mkdir -p /run/systemd/journal
# Its output to a file: a pipe held open by it would keep the caller waiting.
"$journald" >"$work/journald.log" 2>&1 &
journald_pid=$!
. "$src/scripts/wait-lib.sh"
wait_until 60 "journald's socket" test -S /run/systemd/journal/socket
[ -S /run/systemd/journal/socket ] || { not_ok "journald did not start"; cat "$work/journald.log"; exit 1; }

state=$work/state
mkdir -m 0700 "$state"
# shellcheck disable=SC2016
"$src/scripts/knod-sandbox.sh" --build "$build" --keep-state "$state" --unique-sim \
    --daemon-arg --linux-audit=false -- sh -c '
    cli=$1 work=$2
    for i in 1 2 3 4; do
        "$cli" reload >/dev/null || exit 1
        # Anchor first, then the database: the anchor is never ahead of the copy (docs/audit.md).
        [ "$i" -eq 2 ] && { cp "$KNOD_STATE_DIR/journal.db.anchor" "$work/old.db.anchor" &&
            sqlite3 "$KNOD_STATE_DIR/journal.db" ".backup $work/old.db" || exit 1; }
        # The snapshot for the auditors as it is then, copied off (anchor first, too).
        [ "$i" -eq 2 ] && { mkdir -p "$work/copied" &&
            cp "$KNOD_STATE_DIR/snapshot/journal.db.anchor" "$work/copied/journal.db.anchor" &&
            sqlite3 "$KNOD_STATE_DIR/snapshot/journal.db" ".backup $work/copied/journal.db" || exit 1; }
        sleep 1.2
    done
    "$cli" status --json >"$work/status.json"' - "$cli" "$work" >"$work/sandbox.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && ok "the daemon ran with journald; four reloads" || { not_ok "sandbox (exit $rc)"; cat "$work/sandbox.log"; }
py 'import json,sys; d=json.load(open(sys.argv[1])); j=[k for k in d["sinks"]["each"] if k["name"]=="journald"][0]; assert j["written"] >= 5 and j["failed"] == 0 and not j["failing"], j' "$work/status.json" &&
    ok "with journald the journald sink counts writes and no failure" || { not_ok "journald sink status"; cat "$work/status.json"; }

id=$(sqlite3 "$state/journal.db" "SELECT value FROM meta WHERE key = 'journal_id'")
journalctl --no-pager KNOD_JOURNAL_ID="$id" -o export >"$work/records" 2>/dev/null
n=$(grep -c '^KNOD_SEQ=' "$work/records")
[ "$n" -ge 3 ] && grep -q "^KNOD_JOURNAL_PATH=$state/journal.db$" "$work/records" &&
    grep -q '^KNOD_HASH=[0-9a-f]\{64\}$' "$work/records" && ok "journald holds $n chain-head records naming this journal" ||
    { not_ok "records in journald: $n"; journalctl --no-pager -o export | grep -a '^KNOD_' | sort | uniq -c | head -30; }
[ "$(sqlite3 "$state/journal.db" "SELECT count(*) FROM events WHERE kind LIKE 'sink-%'")" = 0 ] &&
    ok "no sink-failing event while journald runs" || not_ok "sink events: $(sqlite3 "$state/journal.db" "SELECT kind, reason FROM events WHERE kind LIKE 'sink-%'")"

"$cli" audit verify --db "$state/journal.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 0 ] && grep -q "^system journal: [0-9]* chain-head record(s) in the system journal match; newest: event" "$work/out" &&
    ok "audit verify reads the local system journal by default and its records match" || { not_ok "verify intact (exit $rc)"; cat "$work/out"; }

# The auditors' snapshot (#33): the daemon's last one, where it publishes, verifies as a
# snapshot; the one copied off halfway is a whole journal that lost its tail unless the auditor
# says it is a snapshot (--as-snapshot), and then the newer heads are counted, not a failure.
"$cli" audit verify --db "$state/snapshot/journal.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 0 ] && grep -q "^snapshot: a copy of '$state/journal.db' the daemon published at" "$work/out" &&
    ok "the published snapshot verifies as one against journald's records" || { not_ok "snapshot (exit $rc)"; cat "$work/out"; }
"$cli" audit verify --db "$work/copied/journal.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "it is not where the daemon publishes one" "$work/out" &&
    ok "a snapshot copied elsewhere is read as a whole journal: its missing tail fails" || { not_ok "copied snapshot (exit $rc)"; cat "$work/out"; }
"$cli" audit verify --db "$work/copied/journal.db" --as-snapshot >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 0 ] && grep -q "came after the snapshot was taken" "$work/out" &&
    ok "with --as-snapshot the heads journald received after it are newer, not a lost tail" || { not_ok "--as-snapshot (exit $rc)"; cat "$work/out"; }

# Database and anchor rolled back together to the copy taken halfway.
rm -f "$state/journal.db-wal" "$state/journal.db-shm"
cp "$work/old.db" "$state/journal.db" && cp "$work/old.db.anchor" "$state/journal.db.anchor"
"$cli" audit verify --db "$state/journal.db" --no-system-journal >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 0 ] && ok "the rolled-back pair passes chain and anchor alone" || { not_ok "rollback, chain alone (exit $rc)"; cat "$work/out"; }
"$cli" audit verify --db "$state/journal.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "FAILED: system journal: the system journal recorded event" "$work/out" &&
    ok "the rollback is caught through journald's records (exit 1)" || { not_ok "rollback (exit $rc)"; cat "$work/out"; }
# The same rollback with its anchor marked as a snapshot taken at the epoch: a claim, not taken
# for the live journal (or any file but the named journal's snapshot/journal.db).
for live in "$state/journal.db" /elsewhere/journal.db; do
    py 'import json, sys
a = json.load(open(sys.argv[1]))
a["snapshot"] = {"at_us": 0, "live": sys.argv[2]}
open(sys.argv[1], "w").write(json.dumps(a))' "$state/journal.db.anchor" "$live"
    "$cli" audit verify --db "$state/journal.db" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 1 ] && grep -q "FAILED: system journal: the system journal recorded event" "$work/out" &&
        ok "a forged snapshot mark naming $live does not hide the rollback" || { not_ok "forged mark $live (exit $rc)"; cat "$work/out"; }
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
