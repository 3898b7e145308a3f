#!/usr/bin/env bash
# knod-policy audit verify against the chain-head copies in the system journal (#16 item 2), and
# a journal on read-only media (#16 item 4). Journal files are written from journal export format
# by systemd-journal-remote, as journald would have written them on the host.
# Usage: audit_trail_test.sh KNOD_POLICY JOURNAL_FILL
set -u
cli=$(readlink -f "$1") fill=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
skip() { echo "ok - # SKIP $*"; }
py() { python3 -c "$1" "${@:2}"; }
run() { "$@" >"$work/out" 2>&1; rc=$?; } # sets rc; output in $work/out
remote=$(command -v systemd-journal-remote || echo /lib/systemd/systemd-journal-remote)

"$fill" "$work/j.db" 20 >/dev/null || { not_ok "journal_fill"; exit 1; }
id=$(sqlite3 "$work/j.db" "SELECT value FROM meta WHERE key = 'journal_id'")
hash_of() { sqlite3 "$1" "SELECT lower(hex(hash)) FROM events WHERE seq = $2"; }
[ ${#id} -eq 32 ] || not_ok "the journal has no id: '$id'"

# anchors FILE "JOURNAL_ID SEQ HASH UID [SECONDS_AGO [PATH [MACHINE]]]" ...: a journal file
# holding those anchor records, each as the daemon sends it (KNOD_EVENT=journal-anchor), with
# journald's trusted _UID; received SECONDS_AGO (- for the default), or 1000 s ago and a second
# apart; from a journal at PATH (- for /var/lib/knod-policy/journal.db) on host MACHINE
# (_MACHINE_ID; default 1111...; "none" leaves it out).
anchors() {
    local out=$1; shift
    py 'import sys, time
now = int(time.time() * 1e6)
for i, spec in enumerate(sys.argv[1:]):
    jid, seq, h, uid, *more = spec.split()
    ago = more[0] if more and more[0] != "-" else None
    path = more[1] if len(more) > 1 and more[1] != "-" else "/var/lib/knod-policy/journal.db"
    machine = more[2] if len(more) > 2 else "1" * 32
    machine = "" if machine == "none" else f"_MACHINE_ID={machine}\n"
    t = now - int(ago) * 10**6 if ago else now - 10**9 + i * 10**6
    print(f"__REALTIME_TIMESTAMP={t}\n__MONOTONIC_TIMESTAMP={1000 + i}\n"
          f"_BOOT_ID=0123456789abcdef0123456789abcdef\n{machine}_UID={uid}\n_COMM=knod-policyd\n"
          f"SYSLOG_IDENTIFIER=knod-policyd\nMESSAGE=knod-policy journal-anchor\n"
          f"KNOD_EVENT=journal-anchor\nKNOD_JOURNAL_ID={jid}\nKNOD_JOURNAL_PATH={path}\n"
          f"KNOD_SEQ={seq}\nKNOD_HASH={h}\n")' "$@" | "$remote" -o "$out" - 2>/dev/null
}

# --- without a system journal: reported, not a failure; asked for by name, exit 2 ----------
run "$cli" audit verify --db "$work/j.db"
[ "$rc" -eq 0 ] && grep -q "^system journal: " "$work/out" && ok "verify says what it did with the system journal" ||
    { not_ok "verify default (exit $rc)"; cat "$work/out"; }
if [ -z "$(find /var/log/journal /run/log/journal -name '*.journal' 2>/dev/null | head -1)" ]; then
    grep -q "^system journal: not checked: cannot read the system journal" "$work/out" &&
        ok "no system journal here: verify says it was not checked, and why" || { not_ok "no system journal note"; cat "$work/out"; }
    run "$cli" audit verify --system-journal --db "$work/j.db"
    [ "$rc" -eq 2 ] && grep -q "cannot read the system journal" "$work/out" &&
        ok "--system-journal with none readable: exit 2 with the reason" || { not_ok "--system-journal unreadable (exit $rc)"; cat "$work/out"; }
else
    skip "this host has journal files: the unreadable case is not tested"
fi
run "$cli" audit verify --no-system-journal --db "$work/j.db"
[ "$rc" -eq 0 ] && grep -q "^system journal: not checked (--no-system-journal)" "$work/out" &&
    ok "--no-system-journal skips it and says so" || { not_ok "--no-system-journal (exit $rc)"; cat "$work/out"; }
run "$cli" audit verify --system-journal-file "$work/none.journal" --db "$work/j.db"
[ "$rc" -eq 2 ] && grep -q "none.journal" "$work/out" && ok "a missing --system-journal-file: exit 2 naming it" ||
    { not_ok "missing journal file (exit $rc)"; cat "$work/out"; }
mkdir "$work/empty"
run "$cli" audit verify --system-journal-dir "$work/empty" --db "$work/j.db"
[ "$rc" -eq 2 ] && grep -q "cannot read the journal files in $work/empty" "$work/out" &&
    ok "an empty --system-journal-dir: exit 2 with the reason" || { not_ok "empty journal dir (exit $rc)"; cat "$work/out"; }
run "$cli" audit verify --system-journal --no-system-journal --db "$work/j.db"
[ "$rc" -eq 2 ] && ok "--system-journal and --no-system-journal exclude each other" || not_ok "both flags (exit $rc)"

if [ ! -x "$remote" ]; then
    skip "systemd-journal-remote is not installed (scripts/install-deps.sh installs it)"
else
    other=0123456789abcdef0123456789abcdef
    # An intact journal: its records match; another host's journal's records (far ahead) are
    # not compared.
    mkdir "$work/sys"
    anchors "$work/sys/system.journal" "$id 10 $(hash_of "$work/j.db" 10) 0" \
        "$id 25 $(hash_of "$work/j.db" 25) 0" "$other 9999 $(hash_of "$work/j.db" 1) 0 - - 22222222222222222222222222222222" \
        "$id 40 $(hash_of "$work/j.db" 40) 0"
    [ -s "$work/sys/system.journal" ] || not_ok "systemd-journal-remote wrote no journal file"
    run "$cli" audit verify --db "$work/j.db" --system-journal-file "$work/sys/system.journal"
    [ "$rc" -eq 0 ] && grep -q "^system journal: 3 chain-head record(s) in the journal file .* match; newest: event 40 of [0-9]* at " "$work/out" &&
        ok "an intact journal: its 3 records match, the newest named; another journal's are ignored" || { not_ok "intact (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/j.db" --system-journal-dir "$work/sys" --json
    py 'import json,sys; d=json.load(open(sys.argv[1])); s=d["system_journal"]; assert d["ok"] and s["checked"] and s["compared"]==3 and s["records"]==3 and s["newest_seq"]==40, d' "$work/out" &&
        [ "$rc" -eq 0 ] && ok "--system-journal-dir and --json: compared 3, newest 40" || { not_ok "dir --json (exit $rc)"; cat "$work/out"; }

    # A rollback of the database and its anchor together: the chain and the anchor agree, the
    # system journal's copy of a later head does not.
    cp "$work/j.db" "$work/rb.db"
    h30=$(hash_of "$work/rb.db" 30)
    sqlite3 "$work/rb.db" "DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq > 30;
        DELETE FROM sessions WHERE id NOT IN (SELECT session_id FROM events WHERE session_id IS NOT NULL)"
    printf '{"hash":"%s","seq":30}\n' "$h30" >"$work/rb.db.anchor"
    run "$cli" audit verify --db "$work/rb.db" --no-system-journal
    [ "$rc" -eq 0 ] && ok "a rollback of database and anchor passes the chain and anchor alone (the stated limit)" ||
        { not_ok "rollback without the system journal (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/rb.db" --system-journal-file "$work/sys/system.journal"
    [ "$rc" -eq 1 ] && grep -q "recorded event 40 .* ends at event 30" "$work/out" &&
        ok "the same rollback is caught by the system journal's copy (exit 1)" || { not_ok "rollback with the system journal (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/rb.db" --system-journal-file "$work/sys/system.journal" --json
    py 'import json,sys; d=json.load(open(sys.argv[1])); s=d["system_journal"]; assert not d["ok"] and not s["ok"] and s["first_bad_event"]==40 and "truncated" in s["problem"], d' "$work/out" &&
        [ "$rc" -eq 1 ] && ok "the rollback in --json" || { not_ok "rollback --json (exit $rc)"; cat "$work/out"; }

    # Same seq, another hash: rewritten.
    anchors "$work/rewritten.journal" "$id 20 $(hash_of "$work/j.db" 21) 0"
    run "$cli" audit verify --db "$work/j.db" --system-journal-file "$work/rewritten.journal"
    [ "$rc" -eq 1 ] && grep -q "event 20 differs from the head the system journal recorded" "$work/out" &&
        ok "a record whose hash differs: rewritten (exit 1)" || { not_ok "rewritten (exit $rc)"; cat "$work/out"; }

    # Anyone may send journald entries with KNOD_* fields: only root's and the daemon's count.
    anchors "$work/forged.journal" "$id 10 $(hash_of "$work/j.db" 10) 0" "$id 9999 $(hash_of "$work/j.db" 1) 4242"
    run "$cli" audit verify --db "$work/j.db" --system-journal-file "$work/forged.journal"
    [ "$rc" -eq 0 ] && grep -q "^system journal: 1 chain-head record(s)" "$work/out" &&
        ok "a record sent by another user is not the daemon's and is ignored" || { not_ok "forged record (exit $rc)"; cat "$work/out"; }

    # Events retention removed: their records are older than the first event and are fine.
    cp "$work/j.db" "$work/pr.db"; cp "$work/j.db.anchor" "$work/pr.db.anchor"
    anchors "$work/pruned.journal" "$id 2 $(hash_of "$work/j.db" 2) 0" "$id 40 $(hash_of "$work/j.db" 40) 0"
    sqlite3 "$work/pr.db" "DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq <= 4"
    run "$cli" audit verify --db "$work/pr.db" --no-anchor --system-journal-file "$work/pruned.journal" --json --allow-pruned-anchor
    py 'import json,sys; s=json.load(open(sys.argv[1]))["system_journal"]; assert s["ok"] and s["pruned"]==1 and s["compared"]==1, s' "$work/out" &&
        ok "with --allow-pruned-anchor a record of an event no longer in the database counts as pruned, not as a failure" || { not_ok "pruned"; cat "$work/out"; }
    # Without it (#31): no checkpoint records event 2, so nothing shows it was not rewritten.
    run "$cli" audit verify --db "$work/pr.db" --no-anchor --system-journal-file "$work/pruned.journal" --json
    py 'import json,sys; s=json.load(open(sys.argv[1]))["system_journal"]; assert not s["ok"] and s["first_bad_event"]==2 and "no longer in the journal" in s["problem"], s' "$work/out" &&
        [ "$rc" -eq 1 ] && ok "a record of a pruned event no checkpoint records fails without --allow-pruned-anchor" || { not_ok "pruned, not allowed (exit $rc)"; cat "$work/out"; }
    # A checkpoint at the record's seq is compared with it: a different hash is a rewrite.
    cp "$work/pr.db" "$work/pc.db"
    sqlite3 "$work/pc.db" "INSERT INTO checkpoints (seq, hash, pruned_at_us, events) VALUES (2, randomblob(32), 1, 2)"
    run "$cli" audit verify --db "$work/pc.db" --no-anchor --system-journal-file "$work/pruned.journal"
    [ "$rc" -eq 1 ] && grep -q "event 2 (its retention checkpoint) differs from the head the system journal recorded" "$work/out" &&
        ok "a checkpoint contradicting a system-journal record at its seq: rewritten" || { not_ok "checkpoint vs record (exit $rc)"; cat "$work/out"; }

    # #31's red team: heads are public (the anchor holds one, journald holds KNOD_HASH), so a
    # wipe of all history chained on checkpoints holding the recorded heads, "pruned" by an
    # invented prune dated in 2199, agrees with every record and with the off-host anchor.
    forge=$(dirname "$0")/forge_journal.py
    python3 "$forge" wipe "$work/j.db" "$work/w.db" \
        "10:$(hash_of "$work/j.db" 10),25:$(hash_of "$work/j.db" 25),40:$(hash_of "$work/j.db" 40)"
    run "$cli" audit verify --db "$work/w.db" --system-journal-file "$work/sys/system.journal"
    [ "$rc" -eq 1 ] && grep -q "heads are public" "$work/out" &&
        ok "a wipe on checkpoints holding the recorded heads is not ok (exit 1)" || { not_ok "wipe (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/w.db" --system-journal-file "$work/sys/system.journal" \
        --anchor "$work/j.db.anchor" --retention 180d
    [ "$rc" -eq 1 ] && grep -q "younger than --retention 180d" "$work/out" &&
        ok "--retention does not take the wipe's invented prune on its own word, even with the off-host anchor (exit 1)" ||
        { not_ok "wipe --retention (exit $rc)"; cat "$work/out"; }
    # The same wipe with the prune's times forged to pass and a fresh head of it sent after the
    # wipe (root may send heads), and again with that head dated 180 days ahead (the node's
    # clock set forward): the records of the wiped events are a few minutes old by this clock.
    wid=$(sqlite3 "$work/w.db" "SELECT value FROM meta WHERE key = 'journal_id'")
    whead=$(sqlite3 "$work/w.db" "SELECT max(seq) FROM events")
    anchors "$work/sys/post.journal" "$wid $whead $(hash_of "$work/w.db" "$whead") 0 0"
    run "$cli" audit verify --db "$work/w.db" --system-journal-dir "$work/sys" --retention 180d
    [ "$rc" -eq 1 ] && grep -q "younger than --retention 180d" "$work/out" &&
        ok "a head sent after the wipe vouches for nothing under --retention (exit 1)" || { not_ok "wipe + fresh head (exit $rc)"; cat "$work/out"; }
    anchors "$work/sys/post.journal" "$wid $whead $(hash_of "$work/w.db" "$whead") 0 -$((180 * 86400))"
    run "$cli" audit verify --db "$work/w.db" --system-journal-dir "$work/sys" --retention 180d
    [ "$rc" -eq 1 ] && grep -q "the node's clock was set forward" "$work/out" &&
        ok "a head dated 180 days ahead is refused: the node's clock was set forward (exit 1)" || { not_ok "wipe + future head (exit $rc)"; cat "$work/out"; }
    rm -f "$work/sys/post.journal"
    run "$cli" audit verify --db "$work/w.db" --system-journal-file "$work/sys/system.journal" \
        --allow-pruned-anchor
    [ "$rc" -eq 0 ] && ok "--allow-pruned-anchor: the auditor expects a prune, and a wipe looks like one (the stated limit)" ||
        { not_ok "wipe --allow-pruned-anchor (exit $rc)"; cat "$work/out"; }
    # The chain rewritten under a new journal id: journald holds no head of it.
    python3 "$forge" newid "$work/j.db" "$work/n.db" 30
    run "$cli" audit verify --db "$work/n.db" --no-system-journal
    [ "$rc" -eq 0 ] && ok "the rewrite under a new id passes the chain and its anchor alone (the stated limit)" ||
        { not_ok "newid alone (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/n.db" --system-journal-file "$work/sys/system.journal"
    [ "$rc" -eq 1 ] && grep -q "holds no chain head of this journal" "$work/out" &&
        ok "a named system journal with no head of this journal vouches for none of it (exit 1)" ||
        { not_ok "newid (exit $rc)"; cat "$work/out"; }
    # ... and once root sends a head under the new id, at another path even: the old id's heads
    # from the same host remain (#31's red team: the new head alone passed).
    nid=$(sqlite3 "$work/n.db" "SELECT value FROM meta WHERE key = 'journal_id'")
    anchors "$work/sys/new-id.journal" "$nid 30 $(hash_of "$work/n.db" 30) 0 0 /var/lib/kp2/journal.db"
    run "$cli" audit verify --db "$work/n.db" --system-journal-dir "$work/sys"
    [ "$rc" -eq 1 ] && grep -q "another journal from this journal's host (id '\?$id'\?.*3 record(s), through event 40" "$work/out" &&
        ok "heads of another journal from the same host, at any path: not ok, naming it (exit 1)" ||
        { not_ok "newid with its own head (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/n.db" --system-journal-dir "$work/sys" --expect-journal "$id"
    [ "$rc" -eq 0 ] && ok "--expect-journal names it (a journal deleted on purpose, or another daemon there)" ||
        { not_ok "--expect-journal (exit $rc)"; cat "$work/out"; }
    # Heads without _MACHINE_ID are from every host.
    anchors "$work/sys/new-id.journal" "$nid 30 $(hash_of "$work/n.db" 30) 0 0 - none"
    run "$cli" audit verify --db "$work/n.db" --system-journal-dir "$work/sys"
    [ "$rc" -eq 1 ] && ok "a head without _MACHINE_ID does not hide the host's other journal (exit 1)" ||
        { not_ok "no machine id (exit $rc)"; cat "$work/out"; }
    # The daemon's account on the node has a uid this machine does not know: its heads are
    # named with the fix, and count with --daemon-uid.
    anchors "$work/uid.journal" "$id 40 $(hash_of "$work/j.db" 40) 998"
    run "$cli" audit verify --db "$work/j.db" --system-journal-file "$work/uid.journal"
    [ "$rc" -eq 1 ] && grep -q "sent by other accounts (1 from uid '\?998'\?): if one is the daemon's account on the node, name its uid with --daemon-uid" "$work/out" &&
        ok "heads from an unknown account: not counted, and the message names the uid and --daemon-uid (exit 1)" ||
        { not_ok "daemon uid (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/j.db" --system-journal-file "$work/uid.journal" --daemon-uid 998
    [ "$rc" -eq 0 ] && grep -q "^system journal: 1 chain-head record(s)" "$work/out" &&
        ok "--daemon-uid 998 counts them" || { not_ok "--daemon-uid (exit $rc)"; cat "$work/out"; }
    rm -f "$work/sys/new-id.journal"
    sqlite3 "$work/n.db" "UPDATE meta SET value = '' WHERE key = 'journal_id'"
    run "$cli" audit verify --db "$work/n.db" --no-system-journal
    [ "$rc" -eq 1 ] && grep -q "meta.journal_id is missing or empty" "$work/out" &&
        ok "an emptied journal id is tampering (exit 1)" || { not_ok "empty id (exit $rc)"; cat "$work/out"; }

    # --retention on an honest prune: journal_fill writes the events 200 days ago and prunes
    # now; journald recorded a pruned head 199 days ago; the anchor was copied (cp -p) then too.
    "$fill" "$work/old.db" 20 --prune 36 --days-ago 200 >/dev/null || not_ok "journal_fill --days-ago"
    oid=$(sqlite3 "$work/old.db" "SELECT value FROM meta WHERE key = 'journal_id'")
    ocp=$(sqlite3 "$work/old.db" "SELECT seq FROM checkpoints")
    ohead=$(sqlite3 "$work/old.db" "SELECT max(seq) FROM events")
    anchors "$work/old.journal" "$oid 2 $(hash_of "$work/j.db" 2) 0 $((199 * 86400))" \
        "$oid $ohead $(hash_of "$work/old.db" "$ohead") 0 0"
    printf '{"seq":%s,"hash":"%s"}' "$((ocp - 1))" "$(hash_of "$work/j.db" 7)" >"$work/old-below.anchor"
    touch -d "@$(($(date +%s) - 199 * 86400))" "$work/old-below.anchor"
    run "$cli" audit verify --db "$work/old.db" --anchor "$work/old-below.anchor" \
        --system-journal-file "$work/old.journal" --retention 180d
    [ "$rc" -eq 0 ] && grep -q "1 recorded at least --retention 180d ago: old enough to have been pruned" "$work/out" &&
        grep -q "was pruned by a prune that keeps --retention 180d (accepted)" "$work/out" &&
        ok "--retention 180d accepts a record and an anchor of pruned events 199 days old" ||
        { not_ok "honest retention (exit $rc)"; cat "$work/out"; }
    run "$cli" audit verify --db "$work/old.db" --anchor "$work/old-below.anchor" \
        --system-journal-file "$work/old.journal" --retention 365d
    [ "$rc" -eq 1 ] && ok "--retention 365d on the same prune is not ok (exit 1)" || { not_ok "365d (exit $rc)"; cat "$work/out"; }
fi

# --- a journal on read-only media (#16 item 4) ------------------------------------------
# A live journal's three files (database, -wal with committed events, -shm), as a crashed
# daemon leaves them or a snapshot of a running host holds them, on a read-only bind mount:
# every audit command works, nothing can be written, and the answers are the -wal's.
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
    mkdir "$work/live" "$work/plain"
    cp "$work/j.db" "$work/plain/journal.db"; cp "$work/j.db.anchor" "$work/plain/journal.db.anchor"
    cp "$work/j.db" "$work/live/journal.db"; cp "$work/j.db.anchor" "$work/live/journal.db.anchor"
    py 'import sqlite3, shutil, sys, os
d = sys.argv[1]
c = sqlite3.connect(d + "/journal.db", isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA wal_autocheckpoint=0")
c.execute("DROP TRIGGER events_no_update")
c.execute("UPDATE events SET reason = reason WHERE seq = 1")  # a change only in the -wal
snap = d + ".snap"; os.mkdir(snap)
for suffix in ("", "-wal", "-shm"):
    shutil.copy(d + "/journal.db" + suffix, snap + "/journal.db" + suffix)
c.close()' "$work/live" || not_ok "making the live-journal fixture"
    cp "$work/j.db.anchor" "$work/live.snap/journal.db.anchor"
    for dir in "$work/plain" "$work/live.snap"; do
        ls -A "$dir" | sort >"$work/before"
        # shellcheck disable=SC2016
        unshare -m sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 99
            touch "$1/probe" 2>/dev/null && exit 98
            "$2" audit verify --no-system-journal --db "$1/journal.db" >"$3.verify" 2>&1 || exit 1
            "$2" audit sessions --json --db "$1/journal.db" >"$3.sessions" 2>&1 || exit 2
            "$2" audit events --json --db "$1/journal.db" >"$3.events" 2>&1 || exit 3' - "$dir" "$cli" "$work/ro"
        rc=$?
        name=${dir#"$work"/}
        if [ "$rc" -eq 0 ] && py 'import json,sys; assert len(json.load(open(sys.argv[1])))==20 and len(json.load(open(sys.argv[2])))==40' "$work/ro.sessions" "$work/ro.events"; then
            ok "$name on a read-only bind mount: audit verify, sessions and events work"
        else
            not_ok "$name on a read-only bind mount (step $rc)"; cat "$work/ro.verify" "$work/ro.sessions" "$work/ro.events" 2>/dev/null | head -20
        fi
        ls -A "$dir" | sort | diff -q - "$work/before" >/dev/null && ok "$name: nothing was created beside it" ||
            not_ok "$name: files changed: $(ls -A "$dir")"
    done
else
    skip "read-only bind mounts need root and unshare -m"
fi

# --- paths are file names (#16 item 4): sessions too, besides verify and events -------------
mkdir "$work/p"
cp "$work/j.db" "$work/p/a%41b.db"; cp "$work/j.db.anchor" "$work/p/a%41b.db.anchor"
"$fill" "$work/p/aAb.db" 3 >/dev/null # the file '%41' would name as a URI: 3 sessions, not 20
for name in "a%41b.db" "x#y.db" "q?z.db"; do
    [ -e "$work/p/$name" ] || { cp "$work/j.db" "$work/p/$name"; cp "$work/j.db.anchor" "$work/p/$name.anchor"; }
    n=$("$cli" audit sessions --json --db "$work/p/$name" | py 'import json,sys; print(len(json.load(sys.stdin)))')
    [ "$n" = 20 ] && ok "audit sessions --db '$name' reads exactly that file" || not_ok "audit sessions --db '$name': $n"
done
[ "$(ls -A "$work/p" | wc -l)" -eq 8 ] && ok "nothing was created beside those files" || not_ok "files appeared: $(ls -A "$work/p")"

# --- an auditor before the daemon's first snapshot (#52) ------------------------------------
# The live journal is the daemon's alone (0600); an auditor who may enter the state dir finds no
# snapshot yet: told so, not only "Permission denied"; a file at the snapshot's path that is not
# a whole copy (what an unfinished first publication used to leave) is never read as a journal.
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
    st=$work/state
    mkdir -p "$st"
    cp "$work/j.db" "$st/journal.db"
    chmod 755 "$work" "$st"
    chmod 600 "$st/journal.db"
    as_auditor() { run setpriv --reuid=65534 --regid=65534 --clear-groups "$cli" "$@"; }
    as_auditor audit verify --no-system-journal --db "$st/journal.db"
    [ "$rc" -eq 2 ] && grep -q "Permission denied; there is no auditors' snapshot dir $st/snapshot" "$work/out" &&
        grep -q -- "--snapshot-interval 0" "$work/out" &&
        ok "no snapshot dir: the auditor is told there is none, and why there may be none" ||
        { not_ok "no snapshot dir (exit $rc)"; cat "$work/out"; }
    mkdir -m 755 "$st/snapshot"
    for sub in "verify --no-system-journal" sessions events; do
        # shellcheck disable=SC2086
        as_auditor audit $sub --db "$st/journal.db"
        [ "$rc" -eq 2 ] && grep -q "the daemon has not published an auditors' snapshot yet ($st/snapshot/journal.db is absent" "$work/out" &&
            ok "audit $sub before the first snapshot: not published yet, said so" ||
            { not_ok "audit $sub before the first snapshot (exit $rc)"; cat "$work/out"; }
    done
    for torn in empty header-less; do
        if [ "$torn" = empty ]; then : >"$st/snapshot/journal.db"; else head -c 4096 /dev/zero >"$st/snapshot/journal.db"; fi
        chmod 644 "$st/snapshot/journal.db"
        as_auditor audit verify --no-system-journal --db "$st/journal.db"
        [ "$rc" -eq 2 ] && grep -q "is not a whole auditors' snapshot" "$work/out" &&
            ! grep -q "not a knod journal\|not a database" "$work/out" &&
            ok "a $torn file at the snapshot's path is not read as a journal" ||
            { not_ok "a $torn file at the snapshot's path (exit $rc)"; cat "$work/out"; }
    done
else
    skip "reading as another user needs root and setpriv"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
