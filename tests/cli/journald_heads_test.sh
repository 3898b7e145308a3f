#!/usr/bin/env bash
# Chain heads and journald's rate limit (#52 item 4).
# 1. Crafted: a system journal file (systemd-journal-remote from export text) holding numbered
#    heads of a real journal; with heads 3..4 of a run missing, `audit verify
#    --system-journal-dir` fails naming them and the events around them; whole, it passes and
#    says "newest: event N of M". Needs no root.
# 2. Live, where root, unshare -m and a cgroup hierarchy journald reads are at hand: a private
#    journald (tmpfs over /run, as system_journal_live_test.sh) with a tiny rate limit
#    (RateLimitBurst=5 per 60 s in /run/systemd/journald.conf.d), the daemon in a cgroup named
#    like a unit (journald limits per unit; no unit, no limit), reloads until it sent 4 heads:
#    journald drops event lines, and still holds every head the daemon counts as sent,
#    numbered 1..N without a gap; verify passes. Before #52 the heads shared the event lines'
#    pool and were suppressed with them.
# Usage: journald_heads_test.sh KNOD_POLICY BUILD_DIR SOURCE_DIR JOURNAL_FILL
set -u
cli=$(readlink -f "$1") build=$(readlink -f "$2") src=$(readlink -f "$3") fill=$(readlink -f "$4")
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
remote=/lib/systemd/systemd-journal-remote
journald=/lib/systemd/systemd-journald

if [ -z "${KNOD_PRIVATE_JOURNALD:-}" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # --- 1. crafted ---
    if [ ! -x "$remote" ]; then
        echo "ok - # SKIP crafted heads: needs $remote"
    else
        "$fill" "$work/j.db" 4 >/dev/null || { echo "not ok - journal_fill"; exit 1; }
        id=$(sqlite3 "$work/j.db" "SELECT value FROM meta WHERE key = 'journal_id'")
        last=$(sqlite3 "$work/j.db" "SELECT max(seq) FROM events")
        run=0123456789abcdef0123456789abcdef
        # Heads 1..5 naming events 1, 2, 3, 4 and the last; $1: the head numbers to leave out.
        craft() {
            local skip=$1 n=0 now seq hash
            now=$(date +%s%6N)
            for seq in 1 2 3 4 "$last"; do
                n=$((n + 1))
                case " $skip " in *" $n "*) continue ;; esac
                hash=$(sqlite3 "$work/j.db" "SELECT lower(hex(hash)) FROM events WHERE seq = $seq")
                printf '__REALTIME_TIMESTAMP=%s\n__MONOTONIC_TIMESTAMP=%s\n_BOOT_ID=%s\n' \
                    "$((now + n))" "$n" 00000000000000000000000000000001
                printf '_UID=0\n_MACHINE_ID=%s\nMESSAGE=knod-policy journal-anchor\n' \
                    00000000000000000000000000000002
                printf 'KNOD_EVENT=journal-anchor\nKNOD_JOURNAL_ID=%s\nKNOD_JOURNAL_PATH=%s\n' "$id" "$work/j.db"
                printf 'KNOD_SEQ=%s\nKNOD_HASH=%s\nKNOD_HEAD_RUN=%s\nKNOD_HEAD_N=%s\n\n' "$seq" "$hash" "$run" "$n"
            done
        }
        for c in whole cut; do
            mkdir -p "$work/$c"
            skip=""
            [ "$c" = cut ] && skip="3 4"
            craft "$skip" | "$remote" --output="$work/$c/heads.journal" - >"$work/remote.log" 2>&1 ||
                { not_ok "journal-remote ($c)"; cat "$work/remote.log"; }
        done
        "$cli" audit verify --db "$work/j.db" --system-journal-dir "$work/whole" >"$work/out" 2>&1; rc=$?
        [ "$rc" -eq 0 ] && grep -q "newest: event $last of $last at" "$work/out" &&
            ok "five numbered heads without a gap verify, newest event $last of $last" ||
            { not_ok "whole heads (exit $rc)"; cat "$work/out"; }
        "$cli" audit verify --db "$work/j.db" --system-journal-dir "$work/cut" >"$work/out" 2>&1; rc=$?
        [ "$rc" -eq 1 ] &&
            grep -q "FAILED: system journal: the system journal's newest head is event $last of $last, but heads 3..4 of daemon run $run (sent between the heads of events 2 and $last) are missing" "$work/out" &&
            grep -q "^system journal: missing head(s) 3..4 of daemon run $run, between the heads of events 2 and $last$" "$work/out" &&
            ok "heads 3..4 missing: verify fails naming them and the events around them" ||
            { not_ok "cut heads (exit $rc)"; cat "$work/out"; }
        "$cli" audit verify --db "$work/j.db" --system-journal-dir "$work/cut" --json >"$work/out" 2>&1
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["system_journal"]; m=d["missing"][0]; assert d["missing_heads"]==2 and m["first"]==3 and m["last"]==4 and m["after_event"]==2, d' "$work/out" 2>/dev/null &&
            ok "--json lists the missing heads" || { not_ok "--json missing"; cat "$work/out"; }
    fi
    rm -rf "$work"
    trap - EXIT
    # --- 2. live, in a mount namespace of its own ---
    # Where journald reads a process's unit from: cgroup2 (all of /sys/fs/cgroup, or its
    # unified/ beside v1 controllers), else the v1 name=systemd hierarchy.
    cgbase=
    for d in /sys/fs/cgroup /sys/fs/cgroup/unified; do
        [ "$(stat -f -c %T "$d" 2>/dev/null)" = cgroup2fs ] && { cgbase=$d; break; }
    done
    [ -z "$cgbase" ] && [ "$(stat -f -c %T /sys/fs/cgroup/systemd 2>/dev/null)" = cgroupfs ] &&
        cgbase=/sys/fs/cgroup/systemd
    if [ "$(id -u)" -ne 0 ] || [ ! -x "$journald" ] || ! unshare -m true 2>/dev/null ||
        [ -z "$cgbase" ]; then
        echo "ok - # SKIP live rate limit: needs root, unshare -m, $journald and a cgroup hierarchy"
        echo "$passed passed, $failed failed"
        [ "$failed" -eq 0 ]
        exit
    fi
    KNOD_PRIVATE_JOURNALD=1 KNOD_PASSED=$passed KNOD_FAILED=$failed KNOD_CGROUP_BASE=$cgbase \
        exec unshare -m --propagation private "$0" "$@"
fi

passed=${KNOD_PASSED:-0} failed=${KNOD_FAILED:-0}
work=$(mktemp -d)
unit=knod-test-heads-$$.service
cgdir=$KNOD_CGROUP_BASE/$unit
journald_pid=
cleanup() {
    [ -n "$journald_pid" ] && kill "$journald_pid" 2>/dev/null && wait "$journald_pid" 2>/dev/null
    rmdir "$cgdir" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
mount -t tmpfs tmpfs /run || exit 1
[ -d /var/log/journal ] && { mount -t tmpfs tmpfs /var/log/journal || exit 1; }
mkdir -p /run/systemd/journal /run/systemd/journald.conf.d
# Five lines per 60 s and priority pool (journald scales the burst up with free disk space, a few
# times at most): a few dozen reloads exceed it.
printf '[Journal]\nStorage=volatile\nRateLimitIntervalSec=60s\nRateLimitBurst=5\n' \
    >/run/systemd/journald.conf.d/knod-test.conf
"$journald" >"$work/journald.log" 2>&1 &
journald_pid=$!
. "$src/scripts/wait-lib.sh"
wait_until 60 "journald's socket" test -S /run/systemd/journal/socket
[ -S /run/systemd/journal/socket ] || { not_ok "journald did not start"; cat "$work/journald.log"; exit 1; }
mkdir "$cgdir" || { not_ok "cgroup $cgdir"; exit 1; }

state=$work/state
mkdir -m 0700 "$state"
# The sandbox (bus, daemon, this loop) in the unit's cgroup: journald limits it as that unit.
# Reloads (one event line each) until the daemon sent 4 heads (at most one a second).
# shellcheck disable=SC2016
sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' - "$cgdir" \
    "$src/scripts/knod-sandbox.sh" --build "$build" --keep-state "$state" --unique-sim \
    --daemon-arg --linux-audit=false -- sh -c '
    cli=$1 work=$2
    i=0
    while [ "$i" -lt 5000 ]; do
        i=$((i + 1))
        "$cli" reload >/dev/null || exit 1
        [ $((i % 10)) -eq 0 ] || continue
        "$cli" status --json >"$work/status.json" || exit 1
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); j=[k for k in d[\"sinks\"][\"each\"] if k[\"name\"]==\"journald\"][0]; sys.exit(0 if j[\"heads_written\"] >= 4 else 1)" "$work/status.json" && break
    done
    "$cli" status --json >"$work/status.json"
    "$cli" status >"$work/status.txt"' - "$cli" "$work" >"$work/sandbox.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && ok "the daemon ran in $unit under a private journald; reloads until 4 heads were sent" ||
    { not_ok "sandbox (exit $rc)"; cat "$work/sandbox.log"; }
read -r sent last_head < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); j=[k for k in d["sinks"]["each"] if k["name"]=="journald"][0]; print(j["heads_written"], j["last_head_seq"])' "$work/status.json")
grep -q "chain head(s) sent, the newest for event $last_head" "$work/status.txt" &&
    ok "status says how many heads the journald sink sent ($sent) and the newest event ($last_head)" ||
    { not_ok "status heads line"; cat "$work/status.txt"; }
id=$(sqlite3 "$state/journal.db" "SELECT value FROM meta WHERE key = 'journal_id'")
events=$(sqlite3 "$state/journal.db" "SELECT count(*) FROM events")
heads() { journalctl --no-pager KNOD_JOURNAL_ID="$id" KNOD_EVENT=journal-anchor -o export 2>/dev/null; }
# journald writes what it takes at once; a head it kept is there by the time the sandbox exits.
wait_until 60 "journald to hold the head of event $last_head" \
    bash -c 'journalctl --no-pager KNOD_JOURNAL_ID="$1" KNOD_SEQ="$2" -o export | grep -q "^KNOD_SEQ=$2$"' - "$id" "$last_head"
heads >"$work/heads"
# The stop's own commit may send one more head after the last status (heads go at most once a
# second, and a loaded machine takes longer than that from the last status to the stop): then
# the daemon sent status's count and one more, for an event after status's newest.
read -r max_n max_seq < <(python3 -c '
import sys
n = seq = 0
for rec in open(sys.argv[1], "rb").read().split(b"\n\n"):
    f = dict(l.split(b"=", 1) for l in rec.split(b"\n") if b"=" in l)
    if f.get(b"KNOD_HEAD_N", b"").isdigit() and int(f[b"KNOD_HEAD_N"]) > n:
        n, seq = int(f[b"KNOD_HEAD_N"]), int(f[b"KNOD_SEQ"])
print(n, seq)' "$work/heads")
if [ "${max_n:-0}" -eq $((sent + 1)) ] && [ "${max_seq:-0}" -gt "$last_head" ]; then
    echo "# the stop sent head $max_n, for event $max_seq"
    sent=$max_n last_head=$max_seq
fi
numbers=$(grep -a '^KNOD_HEAD_N=' "$work/heads" | cut -d= -f2 | sort -n | tr '\n' ' ')
expect=$(seq 1 "$sent" | tr '\n' ' ')
# journald says "Suppressed N messages" only when the window ends (60 s): count instead.
lines=$(journalctl --no-pager KNOD_JOURNAL_ID= _SYSTEMD_UNIT="$unit" -o export 2>/dev/null | grep -ac '^KNOD_EVENT=')
[ "$lines" -lt "$events" ] &&
    ok "journald's rate limit dropped event lines: it holds $lines of $events" ||
    { not_ok "the test did not reach the limit: $lines event lines of $events"; }
[ "$numbers" = "$expect" ] && grep -aq '^PRIORITY=4$' "$work/heads" &&
    ok "journald holds every head the daemon sent, 1..$sent, at LOG_WARNING" ||
    { not_ok "heads in journald: '$numbers', sent: '$expect'"; grep -a '^KNOD_SEQ\|^PRIORITY' "$work/heads" | head -20; }
"$cli" audit verify --db "$state/journal.db" >"$work/out" 2>&1; rc=$?
[ "$rc" -eq 0 ] && grep -q "match; newest: event $last_head of [0-9]* at" "$work/out" &&
    ok "audit verify: the heads match, newest event $last_head" || { not_ok "verify (exit $rc)"; cat "$work/out"; }

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
