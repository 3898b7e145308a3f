#!/usr/bin/env bash
# knod-policy CLI end to end: check, explain and audit verify as a person runs them.
# Usage: cli_test.sh KNOD_POLICY JOURNAL_FILL SOURCE_DIR
set -u
cli=$1 fill=$2 src=$3
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

expect_rc 0 "check accepts the shipped example policy" -- "$cli" check "$src/packaging/policy.example.toml"
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

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
