#!/usr/bin/env bash
# The audit tools on journals an attacker wrote (issue #31): a real journal from journal_fill,
# edited with sqlite3 as a node's root could. No command may crash, hang or write a page from
# impossible values: int64-extreme times and negative counts are refused with exit 2 naming the
# row and the field; a view, virtual table or foreign trigger in the schema is tampering (exit
# 1) found before any query reads a table; the time budget turns a runaway read into an error.
# Usage: hostile_journal_test.sh KNOD_POLICY JOURNAL_FILL
set -u
cli=$1 fill=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
# expect WANT_RC PATTERN DESCRIPTION -- command...: the exit status and a line of its output.
expect() {
    local want=$1 pattern=$2 what=$3; shift 4
    timeout 60 "$@" >"$work/out" 2>&1; local rc=$?
    if [ "$rc" -eq "$want" ] && grep -q -- "$pattern" "$work/out"; then
        ok "$what"
    else
        not_ok "$what (exit $rc, wanted $want and /$pattern/)"; head -c 2000 "$work/out"; echo
    fi
}

"$fill" --report "$work/base.db" >/dev/null || { echo "not ok - journal_fill --report"; exit 1; }
# A copy with SQL applied past the append-only triggers (dropped, the edit made, put back).
edit() { # edit NAME SQL
    cp "$work/base.db" "$work/$1.db"
    cp "$work/base.db.anchor" "$work/$1.db.anchor"
    local triggers
    triggers=$(sqlite3 "$work/$1.db" "SELECT sql || ';' FROM sqlite_master WHERE type = 'trigger'")
    sqlite3 "$work/$1.db" "DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete; $2; $triggers" ||
        { not_ok "editing $1"; return 1; }
}

# 1. Times at the extremes of int64 (the report's span arithmetic overflowed; vbar_chart wrote
# past its vector) and a closing event's bytes at the far end.
ended=$(sqlite3 "$work/base.db" "SELECT max(seq) FROM events WHERE kind = 'session-ended'")
edit extreme "UPDATE events SET at_us = -9223372036854775808 WHERE seq = 1;
              UPDATE events SET at_us = 9223372036854775807 WHERE seq = $ended"
expect 2 "event 1: at_us" \
    "report --html on int64-extreme times is exit 2 naming the event and at_us" -- \
    "$cli" audit report --db "$work/extreme.db" --html "$work/extreme.html"
[ ! -e "$work/extreme.html" ] && ok "no page is written from impossible times" ||
    not_ok "a page was written from impossible times"
expect 2 "event 1: at_us" "report --json on int64-extreme times is exit 2" -- \
    "$cli" audit report --db "$work/extreme.db" --json
expect 2 "event 1: at_us" "events on int64-extreme times is exit 2" -- \
    "$cli" audit events --db "$work/extreme.db"
expect 2 "event 1: at_us" "export on int64-extreme times is exit 2" -- \
    "$cli" audit export --db "$work/extreme.db"
expect 1 "event 1 does not match its hash" "verify finds the edited time (exit 1)" -- \
    "$cli" audit verify --db "$work/extreme.db" --no-system-journal

# Only the far end: the first event is sane, the span is not.
edit far "UPDATE events SET at_us = 9223372036854775807 WHERE seq = $ended"
expect 2 "event $ended: at_us" "report --html on a far at_us is exit 2" -- \
    "$cli" audit report --db "$work/far.db" --html "$work/far.html"

# 2. Negative and non-integer counts.
edit negbytes "UPDATE events SET detail = json_set(detail, '\$.rx_bytes', -5) WHERE seq = $ended"
expect 2 "event $ended: detail.rx_bytes" "a negative rx_bytes in a closing event is exit 2" -- \
    "$cli" audit report --db "$work/negbytes.db" --html "$work/neg.html"
edit realbytes "UPDATE events SET detail = json_set(detail, '\$.rx_bytes', 1e300) WHERE seq = $ended"
expect 2 "event $ended: detail.rx_bytes" "a real rx_bytes in a closing event is exit 2" -- \
    "$cli" audit report --db "$work/realbytes.db" --json
edit negsession "UPDATE sessions SET rx_bytes = -1 WHERE rowid = 1"
expect 2 "rx_bytes -1 is negative" "a negative session rx_bytes is exit 2 for sessions" -- \
    "$cli" audit sessions --db "$work/negsession.db"
edit neguid "UPDATE events SET uid = -7 WHERE seq = 4"
expect 2 "event 4: uid -7 is negative" "a negative uid is exit 2 for events" -- \
    "$cli" audit events --db "$work/neguid.db"
edit textat "UPDATE events SET at_us = '2026-11-29 10:00' WHERE seq = 2"
expect 2 "event 2: at_us is not an integer" "an at_us stored as text is exit 2 for export" -- \
    "$cli" audit export --db "$work/textat.db"

# 3. Sums that do not fit: two closing events of the same hour with bytes near 2^63.
second=$(sqlite3 "$work/base.db" "SELECT min(seq) FROM events WHERE kind = 'session-ended'")
edit overflow "UPDATE events SET detail = json_set(detail, '\$.rx_bytes', 9223372036854775000),
                                 at_us = (SELECT at_us FROM events WHERE seq = $ended)
               WHERE seq IN ($ended, $second)"
expect 2 "overflow" "rx_bytes whose sum overflows int64 are exit 2, never a wrapped total" -- \
    "$cli" audit report --db "$work/overflow.db" --html "$work/overflow.html"

# Sane extremes are drawn: a timeline from 1970 to 2199 makes at most 251 slots.
edit wide "UPDATE events SET at_us = 0 WHERE seq = 1;
           UPDATE events SET at_us = 7258118399000000 WHERE seq = $ended"
expect 0 "wrote" "a timeline over 230 years is drawn (exit 0)" -- \
    "$cli" audit report --db "$work/wide.db" --html "$work/wide.html"
slots=$(grep -c '<g><title>' "$work/wide.html" 2>/dev/null || echo 0)
[ "$slots" -gt 0 ] && ok "the two-century page has bars ($slots)" || not_ok "no bars on the wide page"

# 4. Hostile schema: `events` a view over an endless recursive query. Each command must refuse
# it as tampering at once, not run it.
cp "$work/base.db" "$work/view.db"
sqlite3 "$work/view.db" "DROP TABLE events;
           CREATE VIEW events AS WITH RECURSIVE n(seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM n)
           SELECT seq, 1795946460000000 AS at_us, 'request-denied' AS kind, NULL AS session_id,
                  0 AS uid, 1 AS pid, NULL AS rule, 'deny' AS decision, NULL AS reason,
                  NULL AS detail, zeroblob(32) AS prev_hash, zeroblob(32) AS hash FROM n" ||
    not_ok "making the view"
for args in "verify --no-system-journal" "export" "events --limit 5" "report --json" "sessions"; do
    start=$SECONDS
    expect 1 "the events view is not part of schema version 4 (added: tampered)" "audit $args on an endless view is exit 1 (tampered)" -- \
        "$cli" audit $args --db "$work/view.db"
    [ $((SECONDS - start)) -lt 20 ] && ok "audit $args returns at once" ||
        not_ok "audit $args took $((SECONDS - start)) s"
done
expect 1 '"tampered":true' "verify --json says tampered" -- \
    "$cli" audit verify --json --no-system-journal --db "$work/view.db"
edit extraview "CREATE VIEW v AS SELECT * FROM events"
expect 1 "the v view is not part of schema version" "an added view is tampering for events" -- \
    "$cli" audit events --db "$work/extraview.db"
edit trigger "CREATE TRIGGER spy AFTER INSERT ON sessions BEGIN SELECT 1; END"
expect 1 "the spy trigger is not part of schema version" "a foreign trigger is tampering for export" -- \
    "$cli" audit export --db "$work/trigger.db"
if sqlite3 :memory: "CREATE VIRTUAL TABLE t USING fts5(x)" 2>/dev/null; then
    edit virtual "CREATE VIRTUAL TABLE notes USING fts5(x)"
    expect 1 "virtual table" "a virtual table is tampering" -- \
        "$cli" audit events --db "$work/virtual.db"
fi
edit table "CREATE TABLE extra (x)"
expect 1 "the extra table is not part of schema version" "an unknown table is tampering for verify" -- \
    "$cli" audit verify --no-system-journal --db "$work/table.db"
sqlite3 "$work/notj.db" "CREATE TABLE other (x)"
expect 2 "is not a knod journal" "a database without the tables is no journal (exit 2)" -- \
    "$cli" audit events --db "$work/notj.db"
expect 0 "^ok:" "the unedited journal still verifies" -- \
    "$cli" audit verify --db "$work/base.db" --no-system-journal

# 5. The time budget: with none left, a read stops with a clear error instead of running.
"$fill" "$work/big.db" 2000 >/dev/null || not_ok "journal_fill big.db"
expect 2 "time budget" "KNOD_AUDIT_TIME_BUDGET=0 stops the read with a clear error (exit 2)" -- \
    env KNOD_AUDIT_TIME_BUDGET=0 "$cli" audit verify --db "$work/big.db" --no-system-journal
expect 0 "^ok:" "the same journal verifies within the default budget" -- \
    "$cli" audit verify --db "$work/big.db" --no-system-journal

# 6. Pruning cannot hide a rewrite: an anchor kept off the host that names a pruned event is
# compared with the retention checkpoint at its seq (another hash: forged), and fails unless the
# auditor expects the prune (--allow-pruned-anchor), since heads are public.
"$fill" "$work/p.db" 20 --prune 36 >/dev/null || not_ok "journal_fill --prune"
cp_seq=$(sqlite3 "$work/p.db" "SELECT seq FROM checkpoints")
cp_hash=$(sqlite3 "$work/p.db" "SELECT lower(hex(hash)) FROM checkpoints")
other=$(sqlite3 "$work/p.db" "SELECT lower(hex(hash)) FROM events WHERE seq = 7")
anchor() { printf '{"seq":%s,"hash":"%s"}' "$2" "$3" >"$work/$1.anchor"; }
anchor at-cp "$cp_seq" "$cp_hash"
expect 1 "heads are public" \
    "an anchor at the checkpoint's seq with its hash is still a pruned one (a wipe can copy it; exit 1)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --anchor "$work/at-cp.anchor"
expect 0 "was pruned (accepted: --allow-pruned-anchor)" "--allow-pruned-anchor accepts it (exit 0)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --anchor "$work/at-cp.anchor" \
    --allow-pruned-anchor
anchor forged-cp "$cp_seq" "$other"
expect 1 "the retention checkpoint at event $cp_seq differs from the anchor" \
    "a checkpoint contradicting the anchor at its seq is forged (exit 1)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --anchor "$work/forged-cp.anchor"
anchor below $((cp_seq - 1)) "$other"
expect 1 "is no longer in the journal" "an anchor of a pruned event no checkpoint records fails (exit 1)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --anchor "$work/below.anchor"
expect 0 "was pruned (accepted: --allow-pruned-anchor)" "--allow-pruned-anchor accepts it, and says so" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --anchor "$work/below.anchor" \
    --allow-pruned-anchor

# 7. Retention: each prune records the retention in force and when its newest pruned event was
# written; --retention AGE checks every prune against the auditor's word and accepts a pruned
# anchor when the prune that removed it passed. journal_fill's prune keeps the newest 36 events
# (recorded as such): honest under its own setting.
expect 0 "^ok:" "an honest prune by count verifies (its recorded retention holds)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal
detail=$(sqlite3 "$work/p.db" "SELECT detail FROM events WHERE kind = 'retention-prune'")
case $detail in
*'"retention":{"age_us":null,"events":36}'*'"through_at_us":'* | *'"through_at_us":'*'"retention":{"age_us":null,"events":36}'*)
    ok "the prune event records its retention and the newest pruned event's time" ;;
*) not_ok "the prune event records its retention and the newest pruned event's time: $detail" ;;
esac
expect 1 "younger than --retention 1d" \
    "--retention 1d on a prune of events written moments before it is not ok, naming it (exit 1)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --retention 1d
# The same journal written 200 days ago: its prune removed events older than 180 days.
"$fill" "$work/old.db" 20 --prune 36 --days-ago 200 >/dev/null || not_ok "journal_fill --days-ago"
old_cp=$(sqlite3 "$work/old.db" "SELECT seq FROM checkpoints")
anchor old-below $((old_cp - 1)) "$other"
# Its prune's times are the chain writer's word; the anchor file's own time (its mtime) is not:
# copied just now, it is younger than 180 days, so no such retention pruned its event.
expect 1 "younger than --retention 180d: a retention that keeps that long cannot have pruned" \
    "--retention 180d does not accept a pruned anchor younger than that, whatever the prune says (exit 1)" -- \
    "$cli" audit verify --db "$work/old.db" --no-system-journal --anchor "$work/old-below.anchor" \
    --retention 180d
touch -d "@$(($(date +%s) - 199 * 86400))" "$work/old-below.anchor"
expect 0 "was pruned by a prune that keeps --retention 180d (accepted)" \
    "--retention 180d accepts it once the anchor file is 199 days old (copied with cp -p)" -- \
    "$cli" audit verify --db "$work/old.db" --no-system-journal --anchor "$work/old-below.anchor" \
    --retention 180d
expect 1 "younger than --retention 365d" \
    "--retention longer than the pruned events' age is not ok, naming the prune (exit 1)" -- \
    "$cli" audit verify --db "$work/old.db" --no-system-journal --retention 365d
expect 2 "cannot read the age" "an unreadable --retention is exit 2" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --retention soon
expect 2 "excludes" "--retention and --allow-pruned-anchor exclude each other (exit 2)" -- \
    "$cli" audit verify --db "$work/p.db" --no-system-journal --retention 1d --allow-pruned-anchor

# 8. Terminal controls in journal strings (DEL, C1, a bidi override) stay out of every JSON
# output, \u-escaped, and each output stays JSON: the terminal filter's "\xNN" inside a JSON
# string made it invalid.
session=$(sqlite3 "$work/base.db" "SELECT session_id FROM events WHERE kind = 'request-granted' LIMIT 1")
edit controls "UPDATE sessions SET exe = '/tmp/a' || char(127) || 'b' || char(133),
                   netdev = 'eth' || char(8238) || '0', unit = 'u' || char(8233) || char(8294)
               WHERE id = '$session';
               UPDATE events SET reason = 'r' || char(127) || char(155) || char(8207) WHERE seq = 1"
# json_clean FILE lines|doc: parses as JSON (one document, or one per line) and holds no raw DEL,
# C1, U+2028/2029 or bidi control.
json_clean() {
    python3 -c '
import json, re, sys
text = open(sys.argv[1], "rb").read().decode()
docs = [l for l in text.splitlines() if l.strip()] if sys.argv[2] == "lines" else [text]
for d in docs: json.loads(d)
raw = re.findall("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]", text)
assert not raw, "raw controls: %r" % raw
assert "\\x" not in text, "a \\xNN escape"
' "$1" "$2"
}
for args in "sessions --json" "show $session --json" "report --json" "events --json" \
    "export --table sessions" "export" "verify --json --no-system-journal"; do
    mode=doc
    case $args in export*) mode=lines ;; esac
    timeout 60 "$cli" audit $args --db "$work/controls.db" >"$work/controls.out" 2>"$work/controls.err"
    if json_clean "$work/controls.out" "$mode" 2>"$work/why"; then
        ok "audit $args on control characters is valid JSON without a raw control"
    else
        not_ok "audit $args on control characters: $(tail -1 "$work/why")"
        head -c 600 "$work/controls.out"; echo
    fi
done
"$cli" audit export --db "$work/controls.db" >"$work/controls.jsonl" 2>/dev/null
"$cli" audit verify --export "$work/controls.jsonl" --json >"$work/controls.out" 2>&1
if json_clean "$work/controls.out" doc 2>"$work/why"; then
    ok "verify --export --json on an export with control characters is valid JSON"
else
    not_ok "verify --export --json on control characters: $(tail -1 "$work/why")"
fi
# 9. A detail of many keys: nlohmann::ordered_json (and the export's duplicate-key check) took
# N^2 to read an object of N keys, hours for a 64 MiB value. Readers refuse a detail with an
# object of more than 1024 keys, or longer than 1 MiB, as an impossible value (exit 2, the event
# and field named), and verify --export such a line.
keys() { python3 -c 'import sys; n = int(sys.argv[1]); print("{" + ",".join("\"k%d\":0" % i for i in range(n)) + "}")' "$1"; }
keys 2000 >"$work/keys.json"
keys 200000 >"$work/bigkeys.json"
edit manykeys "UPDATE events SET detail = readfile('$work/keys.json') WHERE seq = 3"
edit bigdetail "UPDATE events SET detail = readfile('$work/bigkeys.json') WHERE seq = 3"
edit nestedkeys "UPDATE events SET detail = json_object('outer', json(readfile('$work/keys.json'))) WHERE seq = 3"
for args in "events" "export" "events --json"; do
    expect 2 "event 3: detail holds an object of more than 1024 keys" \
        "audit $args on a detail of 2000 keys is exit 2 naming the event and field" -- \
        "$cli" audit $args --db "$work/manykeys.db"
done
expect 2 "event 3: detail.outer holds an object of more than 1024 keys" \
    "a nested object of 2000 keys is named by its member" -- \
    "$cli" audit export --db "$work/nestedkeys.db"
expect 2 "event 3: detail is [0-9]* bytes, above 1048576" \
    "a detail of 200,000 keys (over 1 MiB) is exit 2 naming the event and field" -- \
    "$cli" audit export --db "$work/bigdetail.db"
"$cli" audit export --db "$work/base.db" >"$work/base.jsonl" 2>/dev/null
python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
r = json.loads(lines[2]); r["detail"] = {"k%d" % i: 0 for i in range(200000)}
lines[2] = json.dumps(r, separators=(",", ":"))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")' "$work/base.jsonl" "$work/keys.jsonl"
expect 2 "line 3: 'detail' holds an object of more than 1024 keys" \
    "verify --export on a line whose detail has 200,000 keys is exit 2 naming line and field" -- \
    "$cli" audit verify --export "$work/keys.jsonl"

# 10. Names from the file are escaped in verify's text output: a newline in an object's name
# or an export's event_id cannot forge a line of its own.
edit forgedname "CREATE INDEX \"i
ok: forged\" ON sessions (uid)"
expect 1 'the i\\x0aok: forged index is not part' "an object name's newline is escaped (exit 1)" -- \
    "$cli" audit verify --db "$work/forgedname.db" --no-system-journal
grep -q '^ok: forged' "$work/out" && not_ok "an object name forged a line" || ok "no forged line"
python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
r = json.loads(lines[1]); r["event_id"] = "x\nok: forged"
lines[1] = json.dumps(r)
open(sys.argv[2], "w").write("\n".join(lines) + "\n")' "$work/base.jsonl" "$work/forgedid.jsonl"
expect 1 '(event x\\x0aok: forged)' "an event_id's newline is escaped in FAILED (exit 1)" -- \
    "$cli" audit verify --export "$work/forgedid.jsonl"
grep -q '^ok: forged' "$work/out" && not_ok "an event_id forged a line" || ok "no forged line"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
