#!/usr/bin/env bash
# knod-policy CLI end to end: check, explain and audit verify as a person runs them.
# Usage: cli_test.sh KNOD_POLICY JOURNAL_FILL SOURCE_DIR
set -u
cli=$(readlink -f "$1") fill=$2 src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
expect_rc() { # expect_rc WANT DESCRIPTION -- command...
    local want=$1 what=$2; shift 3
    "$@" >"$work/out" 2>&1; local rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$what"; else not_ok "$what (exit $rc, wanted $want)"; cat "$work/out"; fi
}

expect_rc 0 "knod-policy --version" -- "$cli" --version
grep -qx "knod-policy [0-9][0-9.]*" "$work/out" && ok "--version names the program and its version" ||
    not_ok "--version printed: $(cat "$work/out")"
# The daemon unreachable: usage-class exit 2, naming the address tried or the missing daemon.
expect_rc 2 "no bus at the address is exit 2" -- "$cli" status --bus-address "unix:path=$work/no-bus"
grep -qF "$work/no-bus" "$work/out" && ok "the error names the address tried" ||
    not_ok "the error does not name the address: $(cat "$work/out")"
if command -v dbus-daemon >/dev/null; then
    bus_addr=$(dbus-daemon --session --fork --print-address=1 --print-pid=3 3>"$work/bus.pid" |
        head -1)
    expect_rc 2 "a bus without the daemon is exit 2" -- "$cli" status --bus-address "$bus_addr"
    grep -q "knod-policyd is not running" "$work/out" && ok "the error says the daemon is not running" ||
        not_ok "the error does not say the daemon is missing: $(cat "$work/out")"
    kill "$(cat "$work/bus.pid")" 2>/dev/null
fi
expect_rc 0 "check accepts the shipped example policy" -- "$cli" check "$src/packaging/policy.example.toml"
expect_rc 0 "check accepts the shipped default policy" -- "$cli" check "$src/packaging/policy.toml"
expect_rc 1 "the shipped default policy denies everything" -- "$cli" explain --policy "$src/packaging/policy.toml" --user 0 --netdev knodsim0 --gpu sim0 --flow 'udp 10.99.0.1:* -> 10.99.0.2:5000' --bytes 4096
expect_rc 0 "check accepts every good test policy" -- "$cli" check "$src"/tests/data/policies/good/*.toml
for f in "$src"/tests/data/policies/bad/*.toml; do
    want=$(head -1 "$f" | sed -n 's/^# expect: \([0-9]*:[0-9]*\): .*/\1/p')
    "$cli" check "$f" >"$work/out" 2>&1; rc=$?
    if [ "$rc" -eq 1 ] && grep -qF "$f:$want: error:" "$work/out"; then
        ok "check rejects $(basename "$f") at $want"
    else
        not_ok "check on $(basename "$f"): exit $rc, wanted 1 and $f:$want"; cat "$work/out"
    fi
done
expect_rc 2 "check with a missing file is a usage error" -- "$cli" check --json /nonexistent.toml
"$cli" check --json "$src/tests/data/policies/bad/unknown_key.toml" >"$work/json" 2>&1
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["valid"] is False and d["diagnostics"][0]["line"]==5' "$work/json"; then
    ok "check --json reports the line"; else not_ok "check --json"; cat "$work/json"; fi

# explain: allowed by sim-local for uid 1000; nobody is denied by name.
ex=("$cli" explain --policy "$src/packaging/policy.example.toml" --netdev knodsim0 --gpu sim0
    --flow 'udp 10.99.0.1:* -> 10.99.0.2:5000' --bytes 16MiB)
expect_rc 0 "explain allows uid 1000 on the sim" -- "${ex[@]}" --user 1000
grep -q "rule:     sim-local" "$work/out" && ok "explain names the deciding rule" || not_ok "explain rule"; 
grep -q "ml-inference (.*): caller is in none of groups \[ml\]" "$work/out" && ok "explain says why earlier rules missed" || { not_ok "explain misses"; cat "$work/out"; }
expect_rc 1 "explain denies nobody" -- "${ex[@]}" --user nobody
expect_rc 1 "explain denies a region over max_region" -- "$cli" explain --policy "$src/packaging/policy.example.toml" --user 1000 --netdev knodsim0 --gpu sim0 --flow 'udp 10.99.0.1:* -> 10.99.0.2:5000' --bytes 65MiB
expect_rc 2 "explain rejects a bad flow" -- "${ex[@]/10.99.0.2:5000/10.99.0.2:99999}" --user 1000

# explain takes the groups a process holds, as the daemon does, and says where they came from.
cat >"$work/groups.toml" <<'EOF'
[[rule]]
name = "gid-4242"
groups = [4242]
max_region = "1MiB"
flows = ["udp * -> *:5000"]

[[rule]]
name = "user-unit"
user_units = ["inference@*.service"]
max_region = "1MiB"
flows = ["udp * -> *:5001"]
EOF
gx=("$cli" explain --policy "$work/groups.toml" --netdev eth0 --gpu sim0 --bytes 4096)
expect_rc 0 "explain --group 4242 matches a groups rule" -- "${gx[@]}" --user 65534 --group 4242 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
grep -q "groups \[4242\] from given (--group)" "$work/out" && ok "explain says the groups were given" || { not_ok "explain group source (given)"; cat "$work/out"; }
expect_rc 1 "explain for another uid without --group uses the user database, and says so" -- "${gx[@]}" --user 65534 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
grep -q "from the user database (NSS), as a stand-in" "$work/out" && ok "explain names the user database as a stand-in" || { not_ok "explain group source (NSS)"; cat "$work/out"; }
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
    install -m 0755 "$cli" "$work/knod-policy-copy" && chmod 0755 "$work" && chmod 0644 "$work/groups.toml"
    px=("$work/knod-policy-copy" "${gx[@]:1}")
    expect_rc 0 "explain as a process holding gid 4242 uses its own groups" -- setpriv --reuid=65534 --regid=65534 --groups=4242 "${px[@]}" --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
    grep -q "groups \[4242,65534\] from this process (getgroups)" "$work/out" && ok "explain says it used its own groups" || { not_ok "explain group source (process)"; cat "$work/out"; }
    expect_rc 1 "explain as a process that dropped its groups is denied" -- setpriv --reuid=65534 --regid=65534 --clear-groups "${px[@]}" --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
fi
expect_rc 0 "explain derives the user unit from --cgroup" -- "${gx[@]}" --user 65534 --cgroup /user.slice/user-65534.slice/user@65534.service/app.slice/inference@x.service --flow 'udp 10.0.0.1:* -> 10.0.0.2:5001'
grep -q "rule:     user-unit" "$work/out" && ok "explain matched user_units" || { not_ok "explain user unit"; cat "$work/out"; }

# audit verify: an intact journal passes; every kind of tampering fails and names the event.
"$fill" "$work/j.db" 20 || { not_ok "journal_fill"; exit 1; }
expect_rc 0 "audit verify passes an intact journal" -- "$cli" audit verify --db "$work/j.db"
tamper() { # tamper NAME SQL WANT_SEQ
    cp "$work/j.db" "$work/t.db"
    sqlite3 "$work/t.db" "DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete; $2"
    "$cli" audit verify --db "$work/t.db" >"$work/out" 2>&1; rc=$?
    if [ "$rc" -eq 1 ] && grep -q "first bad event $3:" "$work/out"; then ok "audit verify finds $1 at event $3"
    else not_ok "audit verify on $1: exit $rc"; cat "$work/out"; fi
}
tamper edited "UPDATE events SET reason='release' WHERE seq=7" 7
tamper deleted "DELETE FROM events WHERE seq=12" 13
tamper inserted "INSERT INTO events (seq, at_us, kind, prev_hash, hash) SELECT 41, at_us, kind, hash, hash FROM events WHERE seq=40" 41
tamper reordered "UPDATE events SET seq=-5 WHERE seq=5; UPDATE events SET seq=5 WHERE seq=6; UPDATE events SET seq=6 WHERE seq=-5" 5
expect_rc 2 "audit verify on a non-journal file is a usage error" -- "$cli" audit verify --db "$src/README.md"

py() { python3 -c "$1" "${@:2}"; }
# The chain covers the tables beside it (#16, 1): a journal as the daemon writes it (a policy
# load first, grants naming its digest; a copy after a retention prune), then sqlite3 edits of
# every table.
cp "$src/packaging/policy.example.toml" "$work/policy.toml"
"$fill" "$work/c.db" 20 --policy "$work/policy.toml" || { not_ok "journal_fill --policy"; exit 1; }
"$fill" "$work/cp.db" 20 --policy "$work/policy.toml" --prune 36 || { not_ok "journal_fill --prune"; exit 1; }
for db in c cp; do
    "$cli" audit verify --db "$work/$db.db" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 0 ] && grep -q "^sessions: $([ $db = c ] && echo 20 || echo 18) row(s) match" "$work/out" && grep -q "^policies: 1 stored" "$work/out" \
        && ok "audit verify checks every session row and stored policy of an intact journal ($db)" || { not_ok "covered tables intact $db (exit $rc)"; cat "$work/out"; }
done
digest=$(sqlite3 "$work/c.db" "SELECT digest FROM policies")
tamper_table() { # tamper_table NAME SQL TEXT [DB]: verify of a copy of DB (c) exits 1, says TEXT
    cp "$work/${4:-c}.db" "$work/t.db"; cp "$work/${4:-c}.db.anchor" "$work/t.db.anchor"
    sqlite3 "$work/t.db" "$2"
    "$cli" audit verify --db "$work/t.db" >"$work/out" 2>&1; rc=$?
    if [ "$rc" -eq 1 ] && grep -qF -- "$3" "$work/out"; then ok "audit verify finds $1"
    else not_ok "audit verify on $1: exit $rc, wanted 1 and '$3'"; cat "$work/out"; fi
}
for set in "uid=0" "pid=1" "exe='/bin/sh'" "unit='x.service'" "netdev='eth9'" "gpu='sim9'" "mode='rx-tx'" \
           "region_bytes=1" "flows='[]'" "key_id='k-x'" "rule='admin'" "started_us=1" "ended_us=2" \
           "end_reason='revoke'" "rx_bytes=999999" "rx_packets=5" "dropped_packets=5"; do
    tamper_table "an edited sessions.${set%%=*}" "UPDATE sessions SET $set WHERE id='b12'" "session b12: ${set%%=*} is "
done
tamper_table "a deleted session row" "DELETE FROM sessions WHERE id='b12'" "session b12: its grant (event "
tamper_table "an inserted session row" "INSERT INTO sessions (id, uid, pid, netdev, gpu, mode, region_bytes, flows, key_id, rule, started_us, ended_us, end_reason) SELECT 'b99', uid, pid, netdev, gpu, mode, region_bytes, flows, key_id, rule, started_us, ended_us, end_reason FROM sessions WHERE id='b12'" "session b99: a row in the sessions table with no grant event in the chain (inserted)"
tamper_table "an edited policy text" "UPDATE policies SET text = text || 'x'" "policy '$digest': its stored text does not match its digest (edited)"
tamper_table "a replaced policy digest" "UPDATE policies SET digest = lower(hex(randomblob(32)))" "its stored text does not match its digest (edited)"
tamper_table "a deleted policy row" "DELETE FROM policies" "policy '$digest': named by event 1 but its text is missing from the policies table (deleted)"
tamper_table "an edited meta.journal_id" "UPDATE meta SET value = lower(hex(randomblob(16))) WHERE key = 'journal_id'" "meta.journal_id is "
tamper_table "an edited checkpoint" "UPDATE checkpoints SET events = events + 1" "checkpoint at event " cp
"$cli" audit verify --json --db "$work/t.db" >"$work/out.json" 2>/dev/null
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and d["chain_intact"] is True and "checkpoint" in d["problem"], d' "$work/out.json" \
    && ok "audit verify --json says the chain is intact but a table is not" || { not_ok "verify --json tables"; cat "$work/out.json"; }
# The red team's tamperings (#16): values of another storage type, a sessions table rebuilt
# without its key holding a forged twin, the journal id of a pruned journal (no daemon-start
# left), rows no event made.
tamper_table "a BLOB kind" "DROP TRIGGER events_no_update; UPDATE events SET kind=CAST(kind AS BLOB) WHERE seq=7" "event 7: kind is stored as blob"
tamper_table "a BLOB session_id" "DROP TRIGGER events_no_update; UPDATE events SET session_id=CAST(session_id AS BLOB) WHERE seq=12" "event 12: session_id is stored as blob"
tamper_table "a text at_us" "DROP TRIGGER events_no_update; UPDATE events SET at_us=at_us||' UTC' WHERE seq=4" "event 4: at_us is stored as text"
tamper_table "a sessions table rebuilt with a forged twin" "CREATE TABLE s2 AS SELECT * FROM sessions; DROP TABLE sessions; ALTER TABLE s2 RENAME TO sessions; INSERT INTO sessions SELECT * FROM sessions WHERE id='b12'; UPDATE sessions SET uid=0 WHERE rowid=(SELECT max(rowid) FROM sessions); CREATE INDEX f ON sessions (id, uid)" "the sessions table is not defined as schema version 4 defines it"
[ -z "$(sqlite3 "$work/cp.db" "SELECT 1 FROM events WHERE kind='daemon-start'")" ] || not_ok "the pruned journal still has a daemon-start"
tamper_table "an edited journal id of a pruned journal" "UPDATE meta SET value='0123456789abcdef0123456789abcdef' WHERE key='journal_id'" "meta.journal_id is '0123456789abcdef0123456789abcdef' in the meta table but" cp
tamper_table "a deleted journal id of a pruned journal" "DELETE FROM meta WHERE key='journal_id'" "meta.journal_id is missing" cp
tamper_table "an edited hostname" "UPDATE meta SET value='elsewhere' WHERE key='hostname'" "meta.hostname is 'elsewhere'"
other=$(printf 'x' | sha256sum | cut -c1-64)
tamper_table "a policy no event names" "INSERT INTO policies VALUES ('$other', 'x', 5)" "policy '$other': named by no policy load in the chain (inserted)"
tamper_table "a junk checkpoint" "INSERT INTO checkpoints VALUES (-5, x'00', 0, 0)" "checkpoint at event -5"
# The second round (#16): the schema beside the tables. An index built from another definition
# whose stored text was then rewritten to the expected one answers `audit show`, `sessions
# --uid` and `report` wrongly; an added trigger would run in the daemon's next write.
tamper_table "an expression index rewritten in sqlite_master" "DROP INDEX events_session; CREATE INDEX events_session ON events (CASE WHEN seq=9 THEN 'b2' WHEN seq=7 THEN 'zz' ELSE session_id END); PRAGMA writable_schema=ON; UPDATE sqlite_master SET sql='CREATE INDEX events_session ON events (session_id)' WHERE name='events_session'" "SQLite's integrity check fails"
tamper_table "a partial index rewritten in sqlite_master" "DROP INDEX sessions_uid_started; CREATE INDEX sessions_uid_started ON sessions (uid, started_us) WHERE uid<>1002; PRAGMA writable_schema=ON; UPDATE sqlite_master SET sql='CREATE INDEX sessions_uid_started ON sessions (uid, started_us)' WHERE name='sessions_uid_started'" "SQLite's integrity check fails"
tamper_table "a partial index left as written" "DROP INDEX events_at; CREATE INDEX events_at ON events (at_us) WHERE kind <> 'revoke'" "the events_at index is not defined as schema version 4 defines it"
tamper_table "an added trigger" "CREATE TRIGGER t1 AFTER INSERT ON events BEGIN DELETE FROM sessions; END" "the t1 trigger is not part of schema version 4 (added: tampered)"
tamper_table "an added view" "CREATE VIEW v AS SELECT 1" "the v view is not part of schema version 4 (added: tampered)"
tamper_table "an added table" "CREATE TABLE extra (x)" "the extra table is not part of schema version 4 (added: tampered)"
cp "$work/c.db" "$work/t.db"; cp "$work/c.db.anchor" "$work/t.db.anchor"
sqlite3 "$work/t.db" "DROP TRIGGER events_no_update; DROP INDEX events_at; ANALYZE"
expect_rc 0 "audit verify: a dropped index or append-only trigger and ANALYZE's statistics change no answer" -- "$cli" audit verify --db "$work/t.db" --no-system-journal

# audit policy (#16, 3): the text of the policy a digest names, and every stored policy.
"$cli" audit policy --db "$work/c.db" "$digest" >"$work/out" 2>&1
{ printf '# file: %s\n' "$work/policy.toml"; cat "$work/policy.toml"; } | cmp -s - "$work/out" \
    && ok "audit policy DIGEST prints the policy as loaded" || { not_ok "audit policy DIGEST"; cat "$work/out"; }
"$cli" audit policy --json --db "$work/c.db" "${digest:0:12}" >"$work/out.json"
py 'import json,sys,hashlib; d=json.load(open(sys.argv[1])); assert d["digest"]==sys.argv[2] and hashlib.sha256(d["text"].encode()).hexdigest()==sys.argv[2] and d["first_loaded"], d' "$work/out.json" "$digest" \
    && ok "audit policy --json with a digest prefix: {digest, first_loaded, text}" || { not_ok "audit policy --json"; cat "$work/out.json"; }
"$cli" check --json "$work/policy.toml" >"$work/out.json"
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["digest"]==sys.argv[2], d' "$work/out.json" "$digest" \
    && ok "check --json gives the digest the journal names the policy by" || { not_ok "check --json digest"; cat "$work/out.json"; }
"$cli" audit policy --json --db "$work/c.db" >"$work/out.json"
py 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d)==1 and d[0]["digest"]==sys.argv[2] and d[0]["events"]==21, d' "$work/out.json" "$digest" \
    && ok "audit policy lists each digest with the events naming it" || { not_ok "audit policy list"; cat "$work/out.json"; }
expect_rc 2 "audit policy with an unknown digest is exit 2" -- "$cli" audit policy --db "$work/c.db" 0123456789abcdef

# audit queries: output parses back, filters select what they should.
py() { python3 -c "$1" "${@:2}"; }
"$cli" audit sessions --db "$work/j.db" --csv >"$work/s.csv"
py 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); assert len(r)==20 and r[0]["id"]=="b0" and r[0]["end_reason"]=="release", r[:1]' "$work/s.csv" \
    && ok "audit sessions --csv parses back" || not_ok "audit sessions --csv"
"$cli" audit sessions --db "$work/j.db" --json --uid 1000 >"$work/s.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==7 and all(x["uid"]==1000 for x in r), len(r)' "$work/s.json" \
    && ok "audit sessions --json --uid filters" || not_ok "audit sessions --uid"
"$cli" audit events --db "$work/j.db" --json --kind request-granted --since 1h --until now >"$work/e.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==20 and {x["kind"] for x in r}=={"request-granted"}' "$work/e.json" \
    && ok "audit events --kind --since --until" || not_ok "audit events filters"
# --last N: the newest N that match, oldest first (the Cockpit page reads recent refusals so).
"$cli" audit events --db "$work/j.db" --json --last 3 >"$work/last.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); assert [x["seq"] for x in r]==["38","39","40"] or [x["seq"] for x in r]==[38,39,40], [x["seq"] for x in r]' "$work/last.json" \
    && ok "audit events --last 3 gives the three newest, oldest first" || { not_ok "audit events --last"; cat "$work/last.json"; }
"$cli" audit events --db "$work/j.db" --json --last 2 --kind request-granted >"$work/last.json"
"$cli" audit events --db "$work/j.db" --json --kind request-granted >"$work/all.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); a=json.load(open(sys.argv[2])); assert r==a[-2:] and len(r)==2, r' "$work/last.json" "$work/all.json" \
    && ok "audit events --last with a filter: the newest that match" || not_ok "audit events --last --kind"
"$cli" audit sessions --db "$work/j.db" --json --last 1 >"$work/last.json"
"$cli" audit sessions --db "$work/j.db" --json >"$work/all.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); a=json.load(open(sys.argv[2])); assert r==a[-1:], r' "$work/last.json" "$work/all.json" \
    && ok "audit sessions --last 1 is the newest session" || not_ok "audit sessions --last"
expect_rc 2 "--last and --limit together are refused" -- "$cli" audit events --db "$work/j.db" --last 2 --limit 2
expect_rc 2 "--last 0 is refused" -- "$cli" audit events --db "$work/j.db" --last 0
"$cli" audit events --db "$work/j.db" --json --since 2000-01-01 --until 2000-01-02 >"$work/e0.json"
py 'import json,sys; assert json.load(open(sys.argv[1]))==[]' "$work/e0.json" && ok "an empty period is an empty array" || not_ok "empty period"
"$cli" audit export --db "$work/j.db" --format jsonl >"$work/e.jsonl" 2>/dev/null
py 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; assert len(r)==40 and r[0]["seq"]==1 and r[-1]["seq"]==40' "$work/e.jsonl" \
    && ok "audit export jsonl streams every event" || not_ok "export jsonl"
"$cli" audit export --db "$work/j.db" --format csv --table sessions >"$work/x.csv" 2>/dev/null
py 'import csv,sys; assert len(list(csv.DictReader(open(sys.argv[1]))))==20' "$work/x.csv" && ok "audit export csv sessions" || not_ok "export csv"
"$cli" audit report --db "$work/j.db" --json >"$work/r.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); u={x["key"]:x["sessions"] for x in r["by_user"]}; assert u=={"1000":7,"1001":7,"1002":6}, u' "$work/r.json" \
    && ok "audit report counts per user" || { not_ok "audit report"; cat "$work/r.json"; }
# audit report (#16, 7): what happened, as it was. journal_fill --report writes the scenario its
# comment lists: default denials, a deny rule, quota refusals under the allowing rule, an
# isolation violation, a flow conflict, coalesced refusals, three GPUs, hours 10, 11 and 13.
"$fill" --report "$work/rep.db" || not_ok "journal_fill --report"
"$cli" audit report --db "$work/rep.db" --json >"$work/rep.json"
py 'import json,sys; r=json.load(open(sys.argv[1])); t=r["totals"]
assert (t["denials"], t["quota_refusals"], t["other_refusals"]) == (5, 2, 6), t
assert t["other_refusals_by_decision"] == {"coalesced": 4, "flow-conflict": 1, "isolation-violation": 1}, t' "$work/rep.json" \
    && ok "audit report: denials, quota refusals and other refusals counted apart" || { not_ok "report totals"; cat "$work/rep.json"; }
py 'import json,sys; r=json.load(open(sys.argv[1])); d=r["top_denied_rules"]
assert {"rule": None, "default_deny": True, "denials": 4} in d, d
assert {"rule": "block-guests", "default_deny": False, "denials": 1} in d, d
assert all(x["rule"] != "sim-local" for x in d), d
assert r["quota_refusals_by_rule"] == [{"rule": "sim-local", "quota_refusals": 2}], r["quota_refusals_by_rule"]' "$work/rep.json" \
    && ok "audit report: default denials listed, quota refusals under their own rule list" || { not_ok "report rules"; cat "$work/rep.json"; }
py 'import json,sys; r=json.load(open(sys.argv[1])); g={x["gpu"]: (x["sessions"], x["denials"], x["rx_bytes"]) for x in r["by_gpu"]}
assert g == {"sim0": (2, 2, 4000), "sim1": (1, 3, 500), "gpu-2": (1, 0, 250)}, g
n={x["netdev"]: (x["sessions"], x["denials"], x["quota_refusals"]) for x in r["by_netdev"]}
assert n == {"knodsim0": (3, 2, 2), "knodsim1": (1, 3, 0)}, n' "$work/rep.json" \
    && ok "audit report: per-GPU and per-netdev views" || { not_ok "report per GPU"; cat "$work/rep.json"; }
py 'import json,sys; r=json.load(open(sys.argv[1])); tl=r["timeline"]
assert [h["hour"] for h in tl] == ["2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z", "2026-11-29T13:00:00Z"], tl
cols = ["grants", "denials", "quota_refusals", "other_refusals", "revocations", "rx_bytes"]
got = [[h[c] for h in tl] for c in cols]
assert got == [[3, 1, 0], [4, 0, 1], [2, 0, 0], [0, 6, 0], [0, 1, 0], [0, 1500, 3250]], got' "$work/rep.json" \
    && ok "audit report: per-hour timeline of grants, refusals, revocations and bytes" || { not_ok "report timeline"; cat "$work/rep.json"; }
if ! getent passwd 3999999 >/dev/null; then
    py 'import json,sys; r=json.load(open(sys.argv[1])); u={x["uid"]: x for x in r["by_user"]}
assert (u[0]["user"], u[0]["group"], u[0]["gid"]) == ("root", "root", 0), u[0]
assert (u[3999999]["user"], u[3999999]["group"], u[3999999]["key"]) == (None, None, "3999999"), u[3999999]
assert (u[1000]["sessions"], u[1000]["quota_refusals"], u[1000]["revocations"]) == (1, 2, 1), u[1000]' "$work/rep.json" \
        && ok "audit report: users by name and primary group, unknown uids by number" || { not_ok "report users"; cat "$work/rep.json"; }
fi
"$cli" audit report --db "$work/rep.db" --json --gpu sim1 >"$work/rep1.json"
"$cli" audit report --db "$work/rep.db" --json --uid root --since 2026-11-29T11:00 --until 2026-11-29T14:00 >"$work/rep2.json"
py 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
assert [g["gpu"] for g in a["by_gpu"]] == ["sim1"] and (a["totals"]["sessions"], a["totals"]["denials"], a["totals"]["revocations"]) == (1, 3, 1), a["totals"]
assert [u["uid"] for u in b["by_user"]] == [0] and (b["totals"]["sessions"], b["totals"]["rx_bytes"], b["totals"]["denials"]) == (0, 4000, 1), b["totals"]
assert b["filter"]["uid"] == 0 and [h["hour"] for h in b["timeline"]] == ["2026-11-29T11:00:00Z", "2026-11-29T13:00:00Z"], b' "$work/rep1.json" "$work/rep2.json" \
    && ok "audit report --gpu, --uid NAME, --since/--until narrow every view" || { not_ok "report filters"; cat "$work/rep1.json" "$work/rep2.json"; }
"$cli" audit report --db "$work/rep.db" >"$work/rep.txt"
grep -q "(default deny) *4$" "$work/rep.txt" && grep -q "^quota refusals by rule" "$work/rep.txt" && grep -q "^  root *root *0 " "$work/rep.txt" \
    && grep -q "^  2026-11-29T13:00:00Z *0 *1 *0 *0 *0 *3250$" "$work/rep.txt" && grep -q "^  gpu-2 " "$work/rep.txt" \
    && ok "audit report tables: default deny, quota refusals, names, GPUs, timeline" || { not_ok "report tables"; cat "$work/rep.txt"; }
# --html: one self-contained page; strings from the journal (a rule, a netdev and a GPU that
# are markup, quotes, control characters, invalid UTF-8) are text in it, never markup.
"$fill" --report "$work/evil-rep.db" --hostile || not_ok "journal_fill --report --hostile"
"$cli" audit report --db "$work/evil-rep.db" --html "$work/evil.html" 2>/dev/null; rc=$?
if [ "$rc" -eq 0 ] && ! grep -qi "<script\|<img\|http:\|https:" "$work/evil.html" \
    && ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$work/evil.html" && iconv -f UTF-8 -t UTF-8 "$work/evil.html" >/dev/null 2>&1 \
    && grep -qF '&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;\x1b[31m\xff' "$work/evil.html" \
    && grep -qF '&quot;&gt;&lt;img src=x onerror=alert(1)&gt;' "$work/evil.html" \
    && grep -qF '&lt;/svg&gt;&lt;script&gt;alert(2)&lt;/script&gt;\x07' "$work/evil.html" \
    && grep -qF "content=\"default-src 'none'; style-src 'unsafe-inline'\"" "$work/evil.html"; then
    ok "audit report --html escapes every journal string and loads nothing"
else not_ok "audit report --html hostile strings (exit $rc)"; grep -n -i "script\|img" "$work/evil.html" | head; fi
py 'import sys,html.parser
class P(html.parser.HTMLParser):
    tags, handlers = set(), []
    def handle_starttag(self, tag, attrs):
        self.tags.add(tag); self.handlers += [a for a, _ in attrs if a.startswith("on")]
p = P(); p.feed(open(sys.argv[1], encoding="utf-8").read())
assert not p.handlers, p.handlers
assert p.tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "section", "table", "caption", "tr", "th", "td", "div", "figure", "figcaption", "svg", "desc", "g", "rect", "text", "details", "summary", "i"}, p.tags' "$work/evil.html" \
    && ok "audit report --html holds only the page's own elements, no event handlers" || not_ok "report --html elements"
"$cli" audit report --db "$work/evil-rep.db" >"$work/evil-rep.txt" 2>&1
! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$work/evil-rep.txt" && iconv -f UTF-8 -t UTF-8 "$work/evil-rep.txt" >/dev/null 2>&1 \
    && grep -qF '<script>alert(1)</script>"'"'"'&\x1b[31m\xff' "$work/evil-rep.txt" \
    && ok "audit report tables escape control bytes and invalid UTF-8" || { not_ok "audit report tables hostile"; od -c "$work/evil-rep.txt" | head; }
expect_rc 2 "audit report --html into a missing folder is exit 2" -- "$cli" audit report --db "$work/rep.db" --html "$work/no/such/dir/r.html"
expect_rc 0 "audit show names a session" -- "$cli" audit show b3 --db "$work/j.db"
expect_rc 2 "audit show on an unknown session" -- "$cli" audit show nope --db "$work/j.db"
expect_rc 2 "a bad --since is a usage error" -- "$cli" audit sessions --db "$work/j.db" --since yesterday-ish

# Exports a SIEM can ingest and re-verify (#16, 6).
"$cli" audit export --db "$work/j.db" >"$work/x.jsonl" 2>/dev/null
expect_rc 0 "audit verify --export passes an untouched export" -- "$cli" audit verify --export "$work/x.jsonl"
py 'import json,re,sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 40
jid = r[0]["journal_id"]; assert re.fullmatch("[0-9a-f]{32}", jid), jid
for x in r:
    assert x["event_id"] == "%s-%d" % (jid, x["seq"]), x["event_id"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", x["time"]), x["time"]
    assert x["time"].endswith(".%06dZ" % (x["at_us"] % 1000000)), (x["time"], x["at_us"])
    assert x["host"] and re.fullmatch("[0-9a-f]{32}", x["machine_id"] or "0"*32), x
    assert x["netdev"] == "knodsim0" and x["gpu"] == "sim0", x
    assert x["flows"] == ["udp * -> *:5000"], x["flows"]
    assert re.fullmatch("[0-9a-f]{64}", x["prev_hash"]) and re.fullmatch("[0-9a-f]{64}", x["hash"])
grants = [x for x in r if x["kind"] == "request-granted"]
assert all(isinstance(x["detail"], dict) for x in grants)
assert all(a["hash"] == b["prev_hash"] for a, b in zip(r, r[1:]))
assert len({x["event_id"] for x in r}) == 40' "$work/x.jsonl" \
    && ok "export records: event_id, microsecond RFC 3339 times, host, machine_id, flat netdev/gpu, flows as an array, prev_hash" \
    || { not_ok "export record shape"; head -3 "$work/x.jsonl"; }
edit_line() { # edit_line IN OUT LINE PYTHON-EXPR-ON-r
    py 'import json,sys
lines = open(sys.argv[1]).read().splitlines(); n = int(sys.argv[3]) - 1
r = json.loads(lines[n]); exec(sys.argv[4]); lines[n] = json.dumps(r)
open(sys.argv[2], "w").write("\n".join(lines) + "\n")' "$@"; }
for edit in 'r["reason"] = "revoke"' 'r["uid"] = 0' 'r["detail"]["region_bytes"] = 1' 'r["at_us"] += 1; r["time"] = r["time"]' \
            'r["flows"] = ["udp * -> *:22"]' 'r["time"] = r["time"].replace(".", ",")'; do
    edit_line "$work/x.jsonl" "$work/edited.jsonl" 5 "$edit"
    id=$(sed -n 5p "$work/x.jsonl" | py 'import json,sys; print(json.load(sys.stdin)["event_id"])')
    "$cli" audit verify --export "$work/edited.jsonl" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 1 ] && grep -q "line 5 (event $id)" "$work/out" && ok "verify --export finds an edited line ($edit) and names it" || { not_ok "edited export line ($edit): exit $rc"; cat "$work/out"; }
done
sed 7d "$work/x.jsonl" >"$work/gap.jsonl"
"$cli" audit verify --export "$work/gap.jsonl" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "event 7 (between lines 6 and 7)" "$work/out" && ok "verify --export finds a deleted line as a gap" || { not_ok "deleted export line: exit $rc"; cat "$work/out"; }
expect_rc 0 "verify --export --allow-gaps accepts a filtered export" -- "$cli" audit verify --export "$work/gap.jsonl" --allow-gaps
"$cli" audit export --db "$work/j.db" --kind session-ended >"$work/ended.jsonl" 2>/dev/null
expect_rc 0 "verify --export --allow-gaps checks each line of a --kind export" -- "$cli" audit verify --export "$work/ended.jsonl" --allow-gaps
awk 'NR == 5 { held = $0; next } { print } NR == 6 { print held }' "$work/x.jsonl" >"$work/swap.jsonl"
expect_rc 1 "verify --export finds swapped lines" -- "$cli" audit verify --export "$work/swap.jsonl"
sed '8{p;}' "$work/x.jsonl" >"$work/dup.jsonl"
expect_rc 1 "verify --export finds a repeated line" -- "$cli" audit verify --export "$work/dup.jsonl"
expect_rc 0 "verify --export - reads stdin" -- sh -c '"$1" audit verify --export - <"$2"' - "$cli" "$work/x.jsonl"
{ head -3 "$work/x.jsonl"; echo '{"not": "an export"'; } >"$work/bad.jsonl"
"$cli" audit verify --export "$work/bad.jsonl" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "line 4: not a JSON object" "$work/out" && ok "verify --export on a malformed line is exit 2 naming it" || { not_ok "malformed export: exit $rc"; cat "$work/out"; }
expect_rc 2 "verify --export on a missing file is exit 2" -- "$cli" audit verify --export "$work/none.jsonl"
"$cli" audit verify --export "$work/none.jsonl" --json >"$work/out.json" 2>/dev/null; jerr_ok=$?
py 'import json,sys; assert json.load(open(sys.argv[1]))["error"]' "$work/out.json" && ok "verify --export --json error is JSON" || { not_ok "verify --export --json error"; cat "$work/out.json"; }
# Incremental: --after the last exported event_id gives exactly the later events, chaining on.
"$cli" audit export --db "$work/j.db" --limit 15 >"$work/first.jsonl" 2>/dev/null
last=$(tail -1 "$work/first.jsonl" | py 'import json,sys; print(json.load(sys.stdin)["event_id"])')
"$cli" audit export --db "$work/j.db" --after "$last" >"$work/rest.jsonl" 2>/dev/null
py 'import json,sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
assert [x["seq"] for x in a] == list(range(1, 16)), [x["seq"] for x in a]
assert [x["seq"] for x in b] == list(range(16, 41)), [x["seq"] for x in b]
assert b[0]["prev_hash"] == a[-1]["hash"]' "$work/first.jsonl" "$work/rest.jsonl" \
    && ok "export --after gives exactly the later events, chained to the previous export" || { not_ok "export --after"; }
expect_rc 0 "verify --export on a later export alone (it starts mid-chain)" -- "$cli" audit verify --export "$work/rest.jsonl"
cat "$work/first.jsonl" "$work/rest.jsonl" >"$work/both.jsonl"
expect_rc 0 "verify --export on two incremental exports, one after the other" -- "$cli" audit verify --export "$work/both.jsonl"
cmp -s "$work/both.jsonl" "$work/x.jsonl" && ok "the two incremental exports are the whole export" || not_ok "incremental exports differ from the whole"
jid=${last%-*}
"$cli" audit export --db "$work/j.db" --after "$jid-40" >"$work/out" 2>/dev/null; rc=$?
[ "$rc" -eq 0 ] && [ ! -s "$work/out" ] && ok "export --after the head exports nothing" || { not_ok "--after the head: exit $rc"; cat "$work/out"; }
"$cli" audit export --db "$work/j.db" --after "0123456789abcdef0123456789abcdef-3" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "journal 0123456789abcdef0123456789abcdef" "$work/out" && grep -q "journal $jid" "$work/out" \
    && ok "export --after an event of another journal is exit 2 naming both" || { not_ok "--after another journal: exit $rc"; cat "$work/out"; }
expect_rc 2 "export --after a malformed id is exit 2" -- "$cli" audit export --db "$work/j.db" --after "yesterday"
# Filters refuse values no event has, listing the accepted ones.
"$cli" audit events --db "$work/j.db" --kind request-deny >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "unknown kind 'request-deny'" "$work/out" && grep -q "one of: .*request-denied" "$work/out" \
    && ok "--kind request-deny is exit 2 listing the kinds" || { not_ok "--kind typo: exit $rc"; cat "$work/out"; }
expect_rc 2 "export --kind typo is exit 2" -- "$cli" audit export --db "$work/j.db" --kind revoked
expect_rc 2 "--decision typo is exit 2" -- "$cli" audit events --db "$work/j.db" --decision denied
expect_rc 2 "sessions --reason typo is exit 2" -- "$cli" audit sessions --db "$work/j.db" --reason released
expect_rc 0 "a known --decision is accepted" -- "$cli" audit events --db "$work/j.db" --decision not-authorized
# CSV: real columns for netdev, gpu, flows, prev_hash and hash.
"$cli" audit export --db "$work/j.db" --format csv >"$work/x.csv" 2>/dev/null
py 'import csv,sys
r = list(csv.DictReader(open(sys.argv[1], newline="")))
assert len(r) == 40
for x in r:
    assert x["netdev"] == "knodsim0" and x["gpu"] == "sim0" and x["flows"] == "udp * -> *:5000", x
    assert x["event_id"].endswith("-" + x["seq"]) and len(x["time"]) == 27, x
assert all(a["hash"] == b["prev_hash"] for a, b in zip(r, r[1:]))' "$work/x.csv" \
    && ok "export --format csv has netdev, gpu, flows, prev_hash and hash columns" || { not_ok "export csv columns"; head -3 "$work/x.csv"; }
"$cli" audit events --db "$work/j.db" --csv --limit 2 >"$work/e.csv"
py 'import csv,sys; r = list(csv.DictReader(open(sys.argv[1], newline=""))); assert r[0]["flows"] and r[0]["at_us"] and r[1]["prev_hash"] == r[0]["hash"], r' "$work/e.csv" \
    && ok "audit events --csv has the export columns" || { not_ok "events csv"; cat "$work/e.csv"; }
# A journal from before schema 4 has no id: export still works, and says what ids it uses.
cp "$work/j.db" "$work/old.db"; sqlite3 "$work/old.db" "DROP TABLE meta"
"$cli" audit export --db "$work/old.db" >"$work/old.jsonl" 2>"$work/err"; rc=$?
[ "$rc" -eq 0 ] && grep -q "has no journal id" "$work/err" && py 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; assert len(r)==40 and r[4]["event_id"]=="5" and r[4]["journal_id"] is None and r[4]["host"] is None' "$work/old.jsonl" \
    && ok "an old journal exports with bare seq event ids and says why" || { not_ok "old journal export: exit $rc"; cat "$work/err"; }
expect_rc 0 "verify --export passes an old journal's export" -- "$cli" audit verify --export "$work/old.jsonl"
expect_rc 0 "export --after a bare seq on an old journal" -- "$cli" audit export --db "$work/old.db" --after 38
expect_rc 2 "export --after a bare seq on a journal with an id" -- "$cli" audit export --db "$work/j.db" --after 38

# A truncated tail: the chain alone looks whole, the anchor beside the database does not.
cp "$work/j.db" "$work/t.db"; cp "$work/j.db.anchor" "$work/t.db.anchor"
sqlite3 "$work/t.db" "DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq > 37"
"$cli" audit verify --db "$work/t.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "truncated" "$work/out" && ok "audit verify finds a truncated tail" || { not_ok "truncated tail: exit $rc"; cat "$work/out"; }

# A copy in a read-only folder: every command works and nothing is written beside it.
mkdir "$work/ro"; cp "$work/j.db" "$work/ro/journal.db"; cp "$work/j.db.anchor" "$work/ro/journal.db.anchor"; chmod 555 "$work/ro"
for sub in "sessions" "events --csv" "report" "verify"; do
    "$cli" audit $sub --db "$work/ro/journal.db" >/dev/null 2>&1 || not_ok "audit $sub on a read-only copy"
done
[ "$(ls -A "$work/ro" | tr '\n' ' ')" = "journal.db journal.db.anchor " ] && ok "a read-only copy stays untouched" || { not_ok "files appeared: $(ls -A "$work/ro")"; }
chmod 755 "$work/ro"

# Exit codes (#16, 4): 0 intact, 1 tampered, 2 unreadable or bad input with the reason; with
# --json a JSON object with "error" even then.
jerr() { py 'import json,sys; d=json.load(open(sys.argv[1])); assert isinstance(d, dict) and d["error"], d' "$1"; }
for sub in "verify" "sessions" "events" "report" "show b1"; do
    # shellcheck disable=SC2086
    "$cli" audit $sub --json --db "$work/nonexistent.db" >"$work/out.json" 2>"$work/err"; rc=$?
    [ "$rc" -eq 2 ] && jerr "$work/out.json" && grep -q "no journal at" "$work/err" \
        && ok "audit $sub --json on a missing journal: exit 2 and {\"error\"}" || { not_ok "audit $sub --json missing (exit $rc)"; cat "$work/out.json" "$work/err"; }
done
"$cli" audit events --json --db "$work/j.db" --limit many >"$work/out.json" 2>/dev/null; rc=$?
[ "$rc" -eq 2 ] && jerr "$work/out.json" && ok "audit events --json with a bad option: exit 2 and {\"error\"}" || { not_ok "bad option --json (exit $rc)"; cat "$work/out.json"; }
"$cli" audit verify --json --db "$src/README.md" >"$work/out.json" 2>/dev/null; rc=$?
[ "$rc" -eq 2 ] && jerr "$work/out.json" && ok "audit verify --json on a non-journal: exit 2 and {\"error\"}" || { not_ok "verify --json non-journal (exit $rc)"; cat "$work/out.json"; }
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
    # An auditor who may not read the journal (a 0700 state dir, a 0600 file) is told so: exit 2
    # with the system's reason, never "no journal" or the tampered code.
    install -m 0755 "$cli" "$work/knod-policy-audit" && chmod 0755 "$work"
    mkdir -m 0700 "$work/state"; cp "$work/j.db" "$work/state/journal.db"
    mkdir -m 0755 "$work/open"; install -m 0600 "$work/j.db" "$work/open/journal.db"
    for db in "$work/state/journal.db" "$work/open/journal.db"; do
        for sub in "verify" "sessions"; do
            setpriv --reuid=65534 --regid=65534 --clear-groups "$work/knod-policy-audit" audit $sub --json --db "$db" >"$work/out.json" 2>"$work/err"; rc=$?
            [ "$rc" -eq 2 ] && jerr "$work/out.json" && grep -q "Permission denied" "$work/err" && ! grep -q "no journal" "$work/err" \
                && ok "audit $sub on an unreadable ${db#"$work"/}: exit 2, says permission denied" || { not_ok "audit $sub unreadable ${db#"$work"/} (exit $rc)"; cat "$work/out.json" "$work/err"; }
        done
    done
fi

# Paths are file names, never URIs (#16, 4): '%41', '#' and '?' in --db name exactly that file.
# Each tampered journal has an intact neighbour that the URI reading would have opened instead.
mkdir "$work/paths"
sqlite3_tampered() { cp "$work/j.db" "$1"; cp "$work/j.db.anchor" "$1.anchor"
    sqlite3 "$1" "DROP TRIGGER events_no_update; UPDATE events SET reason='release' WHERE seq=7"; }
for pair in "a%41b.db:aAb.db" "j#x.db:j" "q?x.db:q" "sp ace%2F.db:sp ace/.db"; do
    name=${pair%%:*} neighbour=${pair#*:}
    mkdir -p "$(dirname "$work/paths/$neighbour")"
    cp "$work/j.db" "$work/paths/$neighbour"; cp "$work/j.db.anchor" "$work/paths/$neighbour.anchor"
    sqlite3_tampered "$work/paths/$name"
    "$cli" audit verify --db "$work/paths/$name" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 1 ] && grep -q "first bad event 7:" "$work/out" && ok "audit verify --db '$name' reads that file" || { not_ok "audit verify --db '$name' (exit $rc)"; cat "$work/out"; }
    n=$("$cli" audit events --json --db "$work/paths/$name" --kind request-granted | py 'import json,sys; print(len(json.load(sys.stdin)))')
    [ "$n" = 20 ] && ok "audit events --db '$name' reads that file" || not_ok "audit events --db '$name': $n"
done
(cd "$work/paths" && "$cli" audit verify --db "a%41b.db" >/dev/null 2>&1); rc=$?
[ "$rc" -eq 1 ] && ok "a relative --db with '%41' names that file" || not_ok "relative '%41' path (exit $rc)"

# A copy with a -wal but no -shm (cp of a live journal's two files): the -wal is read (a change
# that is only there counts), and nothing is created beside it, on read-only media too.
wal_copy() { # wal_copy DIR SQL: DIR/journal.db + -wal holding SQL's change, no -shm
    mkdir -p "$1"; cp "$work/j.db" "$work/wal-src.db"; cp "$work/j.db.anchor" "$1/journal.db.anchor"
    py 'import sqlite3,shutil,sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA wal_autocheckpoint=0")
c.executescript(sys.argv[3])
shutil.copy(sys.argv[1], sys.argv[2] + "/journal.db"); shutil.copy(sys.argv[1] + "-wal", sys.argv[2] + "/journal.db-wal")
c.close()' "$work/wal-src.db" "$1" "$2"
    rm -f "$work/wal-src.db" "$work/wal-src.db-wal" "$work/wal-src.db-shm"; }
wal_copy "$work/wal-ok" "ANALYZE;" # a change only in the -wal that alters no answer
wal_copy "$work/wal-bad" "DROP TRIGGER events_no_update; UPDATE events SET reason='release' WHERE seq=9;"
[ -s "$work/wal-ok/journal.db-wal" ] && [ ! -e "$work/wal-ok/journal.db-shm" ] || not_ok "the -wal copy fixture has no -wal or has a -shm"
expect_rc 0 "audit verify passes a -wal copy with no -shm" -- "$cli" audit verify --db "$work/wal-ok/journal.db"
"$cli" audit verify --db "$work/wal-bad/journal.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "first bad event 9:" "$work/out" && ok "audit verify reads the -wal of a copy (an edit only there is found)" || { not_ok "-wal edit (exit $rc)"; cat "$work/out"; }
for d in wal-ok wal-bad; do
    [ "$(ls -A "$work/$d" | tr '\n' ' ')" = "journal.db journal.db-wal journal.db.anchor " ] && ok "nothing created beside $d" || not_ok "files appeared beside $d: $(ls -A "$work/$d")"
done
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
    wal_copy "$work/wal-ro" "ANALYZE;"
    unshare -m sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$2" audit verify --db "$1/journal.db"' - "$work/wal-ro" "$cli" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 0 ] && ok "audit verify passes a -wal copy on a read-only bind mount" || { not_ok "-wal copy on a read-only mount (exit $rc)"; cat "$work/out"; }
fi

# The anchor (#16, 2): without it a truncated tail looks whole, so a missing one is a failure
# unless --no-anchor; a malformed one is a clear error (exit 2), never an abort.
mkdir "$work/anc"; cp "$work/j.db" "$work/anc/t.db"
# The truncation removes the tail's session rows too: their events are gone, and the sessions
# table (checked against the chain) would show it otherwise.
sqlite3 "$work/anc/t.db" "DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq > 36; DELETE FROM sessions WHERE id IN ('b18', 'b19')"
"$cli" audit verify --db "$work/anc/t.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "no anchor file" "$work/out" && ok "audit verify fails a truncated journal whose anchor was deleted" || { not_ok "deleted anchor (exit $rc)"; cat "$work/out"; }
"$cli" audit verify --json --db "$work/anc/t.db" >"$work/out.json" 2>/dev/null; rc=$?
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and "anchor" in d["problem"], d' "$work/out.json" && [ "$rc" -eq 1 ] \
    && ok "audit verify --json says the anchor is missing" || { not_ok "deleted anchor --json (exit $rc)"; cat "$work/out.json"; }
"$cli" audit verify --no-anchor --db "$work/anc/t.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 0 ] && grep -q "not checked (--no-anchor)" "$work/out" && ok "audit verify --no-anchor checks the chain alone, and says what it skipped" || { not_ok "--no-anchor (exit $rc)"; cat "$work/out"; }
cp "$work/j.db" "$work/anc/m.db"
for bad in 'garbage' '{"seq": "x", "hash": 1}' '{"seq": 40}' '{"seq": 40, "hash": "zz"}' '[]' ''; do
    printf '%s' "$bad" >"$work/anc/m.db.anchor"
    "$cli" audit verify --db "$work/anc/m.db" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 2 ] && grep -q "anchor file .* is malformed" "$work/out" && ok "a malformed anchor '$bad' is exit 2 with the reason" || { not_ok "malformed anchor '$bad' (exit $rc)"; cat "$work/out"; }
done
"$cli" audit verify --json --db "$work/anc/m.db" >"$work/out.json" 2>/dev/null; rc=$?
[ "$rc" -eq 2 ] && jerr "$work/out.json" && ok "a malformed anchor with --json is {\"error\"}" || { not_ok "malformed anchor --json (exit $rc)"; cat "$work/out.json"; }
expect_rc 2 "--anchor naming a missing file is exit 2" -- "$cli" audit verify --db "$work/j.db" --anchor "$work/anc/none"

# Output injection: other users' bytes in the journal (a unit named like a spreadsheet formula,
# an executable path with terminal escapes, one that is not UTF-8) reach no terminal raw, CSV
# cells cannot start a formula, and JSON stays JSON.
"$fill" "$work/evil.db" 3 >/dev/null || not_ok "journal_fill evil"
sqlite3 "$work/evil.db" "UPDATE sessions SET unit='=cmd|'' /C calc''!A0', exe='/tmp/'||char(27)||']0;pwned'||char(7)||'/x' WHERE id='b1';
    UPDATE sessions SET exe=CAST(x'2f746d702fff2f78' AS TEXT), gpu='+1', netdev='@SUM(A1)' WHERE id='b2';
    DROP TRIGGER events_no_update; UPDATE events SET reason='-2+3'||char(27)||'[2J'||char(13) WHERE seq=2;"
for cmd in "audit sessions" "audit sessions --csv" "audit events" "audit events --csv" "audit show b1" "audit show b2" \
           "audit export --format csv --table sessions" "audit export --format csv --table events" "audit export" \
           "audit sessions --json" "audit show b2 --json"; do
    # shellcheck disable=SC2086
    "$cli" $cmd --db "$work/evil.db" >"$work/evil.out" 2>&1
    if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$work/evil.out"; then
        not_ok "$cmd prints a raw control byte"; od -c "$work/evil.out" | head -20
    elif ! iconv -f UTF-8 -t UTF-8 "$work/evil.out" >/dev/null 2>&1; then
        not_ok "$cmd prints bytes that are not UTF-8"
    else ok "$cmd prints no raw control byte and valid UTF-8"; fi
done
"$cli" audit sessions --csv --db "$work/evil.db" >"$work/evil.csv"
py 'import csv,sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    for k, v in r.items():
        assert not v or v[0] not in "=+-@\t\r", (k, v)
b1 = [r for r in rows if r["id"] == "b1"][0]
assert b1["unit"] == "'"'"'=cmd|'"'"' /C calc'"'"'!A0", b1["unit"]
assert "\\x1b]0;pwned\\x07" in b1["exe"], b1["exe"]' "$work/evil.csv" \
    && ok "audit --csv neutralises formula cells and escapes ESC" || { not_ok "audit --csv injection"; cat "$work/evil.csv"; }
"$cli" audit sessions --json --db "$work/evil.db" >"$work/evil.json"
py 'import json,sys; d=json.load(open(sys.argv[1])); assert any("pwned" in s["exe"] for s in d)' "$work/evil.json" \
    && ok "audit --json stays valid JSON with hostile values" || { not_ok "audit --json hostile"; cat "$work/evil.json"; }

# Hostile journal content (#16 red team): nothing in a journal or an export may crash the
# CLI (an uncaught JSON exception was exit 134, deep nesting exit 139) or forge output.
"$fill" "$work/h0.db" 5 --policy "$work/policy.toml" || not_ok "journal_fill h0"
hdb() { # hdb NAME SQL [PYTHON-EXPR]: a copy of h0.db with SQL (;-separated) applied, ? bound to the value
    cp "$work/h0.db" "$work/$1.db" && py 'import sqlite3,sys
c = sqlite3.connect(sys.argv[1]); c.execute("DROP TRIGGER events_no_update")
for st in sys.argv[2].split(";"): c.execute(st, (eval(sys.argv[3]),) if "?" in st else ())
c.commit()' "$work/$1.db" "${@:2}"; }
hdb hflows "UPDATE sessions SET flows='[1,{\"a\":2}]' WHERE id='b1'"
hdb hflows2 "UPDATE sessions SET flows='{\"not\":\"an array\"}' WHERE id='b1'"
hdb hdetail "UPDATE events SET detail='{\"netdev\":5,\"gpu\":[1],\"flows\":[1,[\"x\"],null]}' WHERE seq=4"
for db in hflows hflows2 hdetail; do
    for args in "sessions" "sessions --json" "sessions --csv" "show b1" "show b1 --json" "events" "events --json" \
                "export" "export --format csv" "export --table sessions" "export --table sessions --format csv" "report --json"; do
        # shellcheck disable=SC2086
        expect_rc 0 "audit $args on a journal with malformed JSON ($db)" -- "$cli" audit $args --db "$work/$db.db"
    done
done
"$cli" audit show b1 --db "$work/hflows.db" >"$work/out" 2>&1
grep -q '^flows: *1; {"a":2}$' "$work/out" && ok "malformed session flows are shown as what they are" || { not_ok "malformed flows shown"; cat "$work/out"; }
"$cli" audit show b1 --db "$work/hflows2.db" >"$work/out" 2>&1
grep -q '^flows: *{"not":"an array"}$' "$work/out" && ok "a flows column that is no array is shown as its text" || { not_ok "non-array flows shown"; cat "$work/out"; }
hdb hdeep "UPDATE events SET detail=? WHERE seq=4" '"{\"x\":" + "["*100000 + "]"*100000 + "}"'
for args in "export" "export --netdev knodsim0" "events" "events --json" "events --gpu sim0" "show b1" "show b1 --json" "report --json" "sessions --json"; do
    # shellcheck disable=SC2086
    expect_rc 0 "audit $args with a detail nested 100,000 deep" -- "$cli" audit $args --db "$work/hdeep.db"
done
"$cli" audit export --db "$work/hdeep.db" >"$work/deep.jsonl" 2>/dev/null
py 'import json,sys
r = [json.loads(l) for l in open(sys.argv[1])][3]
assert isinstance(r["detail"], str) and r["detail_text"] == r["detail"] and r["detail"].startswith("{\"x\":[[[")' "$work/deep.jsonl" \
    && ok "a too-deep detail is exported as its text" || not_ok "too-deep detail export"
expect_rc 1 "verify --export of the edited deep detail is exit 1, not a crash" -- "$cli" audit verify --export "$work/deep.jsonl"
{ head -3 "$work/x.jsonl"; sed -n 4p "$work/x.jsonl" | py 'import sys; print(sys.stdin.read().strip().replace("\"detail\":{", "\"detail\":{\"x\":" + "["*100000 + "]"*100000 + ",", 1))'; } >"$work/deepline.jsonl"
"$cli" audit verify --export "$work/deepline.jsonl" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "line 4: not a JSON object (nested deeper than" "$work/out" && ok "verify --export on a line nested 100,000 deep is exit 2" || { not_ok "deep export line: exit $rc"; head -c 300 "$work/out"; }
# verify --export: repeated keys (nlohmann keeps the last value), unknown fields, an empty file,
# and a session-ended line whose flat fields its grant line contradicts.
"$cli" audit export --db "$work/h0.db" >"$work/h0.jsonl" 2>/dev/null
expect_rc 0 "verify --export passes the untouched h0 export" -- "$cli" audit verify --export "$work/h0.jsonl"
rewrite() { # rewrite OUT LINE PYTHON-EXPR-ON-TEXT-t
    py 'import sys
lines = open(sys.argv[1]).read().splitlines(); n = int(sys.argv[3]) - 1
t = lines[n]; t2 = eval(sys.argv[4]); assert t2 != t, "no change"; lines[n] = t2
open(sys.argv[2], "w").write("\n".join(lines) + "\n")' "$work/h0.jsonl" "$@"; }
for edit in 't.replace("\"netdev\":\"knodsim0\",\"policy\"", "\"netdev\":\"eth-evil\",\"netdev\":\"knodsim0\",\"policy\"")' \
            't.replace(",\"netdev\":\"knodsim0\",\"gpu\":\"sim0\",\"flows\":[", ",\"netdev\":\"eth-evil\",\"netdev\":\"knodsim0\",\"gpu\":\"sim0\",\"flows\":[", 1)'; do
    rewrite "$work/dupkey.jsonl" 2 "$edit" || not_ok "rewrite $edit"
    "$cli" audit verify --export "$work/dupkey.jsonl" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 1 ] && grep -q "line 2 .*repeats a key" "$work/out" && ok "verify --export refuses a repeated key ($edit)" || { not_ok "repeated key: exit $rc ($edit)"; cat "$work/out"; }
done
rewrite "$work/unknown.jsonl" 2 't.replace("{\"event_id\"", "{\"comment\":\"x\",\"event_id\"", 1)'
"$cli" audit verify --export "$work/unknown.jsonl" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "line 2: unknown field 'comment'" "$work/out" && ok "verify --export refuses an unknown field" || { not_ok "unknown field: exit $rc"; cat "$work/out"; }
for field in netdev gpu flows; do
    case $field in
        netdev) edit='t.replace("\"netdev\":\"knodsim0\"", "\"netdev\":\"eth-evil\"", 1)' ;;
        gpu) edit='t.replace("\"gpu\":\"sim0\"", "\"gpu\":\"gpu-evil\"", 1)' ;;
        flows) edit='t.replace("\"flows\":[\"udp * -> *:5000\"]", "\"flows\":[\"udp * -> *:22\"]", 1)' ;;
    esac
    rewrite "$work/ended.jsonl" 3 "$edit"
    "$cli" audit verify --export "$work/ended.jsonl" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 1 ] && grep -q "line 3 .*$field differs from the session its grant line records" "$work/out" \
        && ok "verify --export checks a session-ended line's $field against its grant line" || { not_ok "session-ended $field: exit $rc"; cat "$work/out"; }
done
: >"$work/empty.jsonl"
"$cli" audit verify --export "$work/empty.jsonl" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "no events" "$work/out" && ok "verify --export of an empty file is exit 2" || { not_ok "empty export: exit $rc"; cat "$work/out"; }
# A stored newline or tab must not forge a table row or shift a column.
hdb hnl "UPDATE sessions SET rule='r'||char(10)||'b9 0 forged', unit='u'||char(9)||'x' WHERE id='b1';UPDATE events SET reason=? WHERE seq=5" '"release\nforged"'
for args in "sessions" "events" "show b1"; do
    # shellcheck disable=SC2086
    "$cli" audit $args --db "$work/hnl.db" >"$work/out" 2>&1; rc=$?
    [ "$rc" -eq 0 ] && ! grep -q '^forged\|^b9 0 forged' "$work/out" && ! grep -q "$(printf '\t')" "$work/out" && grep -q 'r\\x0ab9 0 forged\|release\\x0aforged' "$work/out" \
        && ok "audit $args escapes a stored newline and tab in its table" || { not_ok "audit $args newline: exit $rc"; cat "$work/out"; }
done
expect_rc 2 "a --uid past any uid is exit 2 (stoll threw: exit 134)" -- "$cli" audit events --db "$work/h0.db" --uid 99999999999999999999
expect_rc 2 "--limit -1 is exit 2" -- "$cli" audit events --db "$work/h0.db" --limit -1
expect_rc 2 "--limit 0 is exit 2" -- "$cli" audit sessions --db "$work/h0.db" --limit 0
"$cli" audit events --db "$work/h0.db" --limit 2 --json >"$work/out.json" 2>/dev/null
py 'import json,sys; assert len(json.load(open(sys.argv[1]))) == 2' "$work/out.json" && ok "--limit 2 gives two rows" || not_ok "--limit 2"
# report --html: a private mode, and a symlink at the path is refused, never followed.
rm -f "$work/r.html"; "$cli" audit report --db "$work/h0.db" --html "$work/r.html" >/dev/null 2>&1
[ "$(stat -c %a "$work/r.html")" = 640 ] && ok "report --html writes the page 0640" || not_ok "report --html mode $(stat -c %a "$work/r.html")"
echo keep >"$work/victim"; ln -sf "$work/victim" "$work/link.html"
"$cli" audit report --db "$work/h0.db" --html "$work/link.html" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "symbolic link" "$work/out" && [ "$(cat "$work/victim")" = keep ] && ok "report --html refuses a symlink" || { not_ok "report --html symlink: exit $rc"; cat "$work/out"; }
"$cli" audit show b1 --db "$work/h0.db" --json >"$work/out.json" 2>/dev/null
py 'import json,sys; e=json.load(open(sys.argv[1]))["events"]; assert [x["seq"] for x in e] == [4, 5] and all(x["session"] == "b1" for x in e), e' "$work/out.json" \
    && ok "audit show lists exactly its session's events" || not_ok "audit show events"

# Policy files that crashed toml++ (a 50,000-part dotted key overflowed its stack: exit 139)
# or nested without bound are refused with file:line:col.
py 'import sys; open(sys.argv[1],"w").write("[settings]\na" + ".a"*50000 + " = 1\n")' "$work/dotted.toml"
expect_rc 1 "check refuses a key with 50,000 dotted parts" -- "$cli" check "$work/dotted.toml"
grep -q "dotted.toml:2:64: error: key has more than 32 dotted parts" "$work/out" && ok "and says where" || { not_ok "dotted position"; cat "$work/out"; }
py 'import sys; open(sys.argv[1],"w").write("x = " + "["*100000 + "]"*100000 + "\n")' "$work/deep.toml"
expect_rc 1 "check refuses arrays nested 100,000 deep" -- "$cli" check "$work/deep.toml"
py 'import sys; open(sys.argv[1],"w").write(("# " + "x"*1022 + "\n") * 2048)' "$work/big.toml"
expect_rc 1 "check refuses a policy file over 1 MiB" -- "$cli" check "$work/big.toml"

# doctor on the fixture machines of tests/data/hosts (make_hosts.py says what each one is).
hosts="$src/tests/data/hosts"
"$cli" doctor --host-root "$hosts/mi250x-cx6" --json >"$work/d.json"; rc=$?
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["result"]=="pass" and d["gpus"][0]["family"]=="CDNA2" and any(c["id"]=="pair.acs" and c["status"]=="pass" for c in d["checks"]), d' "$work/d.json" \
    && [ "$rc" -eq 0 ] && ok "doctor passes MI250X + CX6 under one ACS switch" || { not_ok "doctor mi250x-cx6 (exit $rc)"; cat "$work/d.json"; }
"$cli" doctor --host-root "$hosts/shared-group" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 1 ] && grep -q "^fail  pair.iommu.translated .*shares its group with" "$work/out" \
    && grep -q "^fail  pair.acs .*0000:02:01.0 (ACS present, all controls off)" "$work/out" \
    && grep -q "packets land in CPU memory, not VRAM" "$work/out" \
    && grep -q "^      fix: " "$work/out" && ok "doctor fails a shared group without ACS, with fixes" || { not_ok "doctor shared-group (exit $rc)"; cat "$work/out"; }
"$cli" doctor --host-root "$hosts/identity" --json >"$work/d.json"; rc=$?
py 'import json,sys; c={x["id"]:x["status"] for x in json.load(open(sys.argv[1]))["checks"]}; assert c["pair.iommu.translated"]=="fail" and c["pair.iommu.passthrough-ok"]=="pass" and c["kernel.iommu_pt"]=="warn", c' "$work/d.json" \
    && [ "$rc" -eq 1 ] && ok "doctor: identity domains fail translated, pass passthrough-ok" || { not_ok "doctor identity (exit $rc)"; cat "$work/d.json"; }
"$cli" doctor --host-root "$hosts/mi250x-cx6" --nic eth9 >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "no netdev or PCI NIC named eth9" "$work/out" && ok "doctor: an unknown NIC is bad input" || { not_ok "doctor unknown nic (exit $rc)"; cat "$work/out"; }
"$cli" doctor >"$work/out" 2>&1; rc=$?
[ "$rc" -le 1 ] && grep -q "^Netdevs:" "$work/out" && grep -q "kernel.pci_p2pdma\|kernel.config" "$work/out" && ok "doctor runs on this machine" || { not_ok "doctor live (exit $rc)"; cat "$work/out"; }

# sim-send: a bad --to port is a usage error (exit 2) before anything is sent, not an abort or a
# port wrapped into another one.
for to in 10.99.0.2:abc 10.99.0.2:99999999999 10.99.0.2:70000 10.99.0.2: 10.99.0.2:0; do
    expect_rc 2 "sim-send --to $to is bad usage" -- "$cli" sim-send --netns knod-no-such-ns --to "$to"
    grep -q -- "--to must be IPV4:PORT" "$work/out" || not_ok "sim-send --to $to: $(cat "$work/out")"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
