#!/usr/bin/env bash
# Runs inside `unshare --mount` from package_test.sh: the installed knod-policyd, as its own
# account with the unit's capabilities, on a private bus that loads the installed bus policies,
# with a real polkitd that reads the installed actions and one test rule. Test users and the
# rule exist only in this namespace's copy of /etc.
# Usage: polkit_session.sh WORK_DIR [TEST_CLIENT]
# TEST_CLIENT (tests/tools/knod_test_client, readable by other users): callers of other uids
# bind, activate, release and revoke against the installed daemon.
set -uo pipefail
. "$(dirname "$0")/../../scripts/wait-lib.sh"
work=$1
client=${2:-}
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; return 1; fi; }
pids=()
cleanup() {
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; wait "${pids[i]}" 2>/dev/null; done
}
trap cleanup EXIT

# This namespace's /etc is a copy of the host's, bound over /etc as a whole. Not over single
# files: a useradd or userdel on the host (tests/python/run.sh does them, beside this test under
# ctest -j2) renames a new /etc/passwd over the old one, and the kernel detaches a mount whose
# mountpoint is renamed over in another namespace: the test users vanished mid-session and every
# check after "the ordinary user binds again" failed (soak of af0dab9). Nobody renames /etc.
# The copy lives on a tmpfs of this namespace's own: it holds the host's secrets (shadow, host
# keys) and goes with the namespace, even when the test is killed before its cleanup. A useradd
# beside the copy removes its temporary files (passwd.PID, the locks) before cp reaches them, or
# renames a file over the one cp is reading: copy_beside_renames (scripts/wait-lib.sh) makes the
# copy again then. Any other error stops the session.
etc=$work/etc
mkdir -m 0755 "$etc" && mount -t tmpfs -o mode=0755,size=64m knod-test-etc "$etc" || exit 1
copy_beside_renames "$work/etc-copy.err" "$etc" /etc/. || exit 1
if ! grep -q '^knod-policy:' "$etc/passwd" || ! grep -q '^polkitd:' "$etc/passwd"; then
    echo "polkit session: the copy of /etc lacks the package's users (knod-policy, polkitd)" >&2
    exit 1
fi
# Users: one plain, one in the group the polkit rule names.
echo "knodt-user:x:61001:61001::/nonexistent:/usr/sbin/nologin" >>"$etc/passwd"
echo "knodt-admin:x:61002:61002::/nonexistent:/usr/sbin/nologin" >>"$etc/passwd"
echo "knodt-ops:x:61003:61003::/nonexistent:/usr/sbin/nologin" >>"$etc/passwd"
printf 'knodt-user:x:61001:\nknodt-admin:x:61002:\nknodt-admins:x:61000:knodt-admin\n' >>"$etc/group"
# The policy's admin group: no members in the group file; a process holds it or not.
printf 'knodt-ops:x:61003:\nknodt-opsadm:x:61004:\n' >>"$etc/group"

# polkit's rules in this namespace: the test's one alone, whatever the host has.
rm -rf "$etc/polkit-1/rules.d" && mkdir -p "$etc/polkit-1/rules.d"
cat >"$etc/polkit-1/rules.d/50-knod-test.rules" <<'RULE'
polkit.addRule(function(action, subject) {
    if (action.id == "org.knod.policy1.manage" && subject.isInGroup("knodt-admins"))
        return polkit.Result.YES;
});
RULE
chown -R polkitd "$etc/polkit-1/rules.d" && chmod 0700 "$etc/polkit-1/rules.d"
mount --bind "$etc" /etc || exit 1

# The private bus: the system bus's default policy plus every installed service policy.
mkdir -m 0755 "$work/bus" && chmod 0755 "$work"
cat >"$work/bus/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$work/bus/socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  <includedir>/usr/share/dbus-1/system.d</includedir>
</busconfig>
CONF
dbus-daemon --config-file="$work/bus/bus.conf" --nofork --nopidfile &
pids+=($!)
address="unix:path=$work/bus/socket"
export DBUS_SYSTEM_BUS_ADDRESS=$address
has_owner() {
    dbus-send --bus="$address" --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
        org.freedesktop.DBus.NameHasOwner "string:$1" 2>/dev/null | grep -q 'boolean true'
}
wait_for() { wait_until 60 "$1 on the bus" has_owner "$1"; }
wait_until 60 "the bus socket" test -S "$work/bus/socket"

# polkitd starts as root and switches to its own user by itself.
/usr/lib/polkit-1/polkitd --no-debug &
pids+=($!)
check "polkitd owns org.freedesktop.PolicyKit1 on the private bus" 'wait_for org.freedesktop.PolicyKit1'

# A policy for the sim that lets knodt-user bind; the admin group is knodt-opsadm.
cat >"$work/policy.toml" <<'POLICY'
[settings]
admin_group = "knodt-opsadm"

[[rule]]
name = "package-test"
users = ["knodt-user"]
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
POLICY
chmod 0644 "$work/policy.toml"

# The installed daemon as the unit runs it: its own account, only the unit's capabilities
# (CapabilityBoundingSet and AmbientCapabilities of knod-policyd.service: no CAP_KILL).
caps=+net_admin,+bpf,+perfmon,+sys_ptrace,+audit_write
setpriv --reuid=knod-policy --regid=knod-policy --init-groups --inh-caps=-all,"$caps" \
    --ambient-caps=-all,"$caps" --bounding-set=-all,"$caps" --no-new-privs \
    /usr/sbin/knod-policyd --bus=system --driver=sim --sim-datapath=false --journald=false \
    --policy "$work/policy.toml" >"$work/daemon.log" 2>&1 &
pids+=($!)
check "the installed daemon, as knod-policy, owns org.knod.Policy1" 'wait_for org.knod.Policy1' ||
    cat "$work/daemon.log"

as_user() { setpriv --reuid="$1" --regid="$1" --init-groups "${@:2}"; }
as_user knodt-user knod-policy status >"$work/out" 2>&1
check "an unprivileged caller may read the status" '[ $? -eq 0 ]' || cat "$work/out"
as_user knodt-user dbus-send --bus="$address" --print-reply --dest=org.freedesktop.DBus \
    /org/freedesktop/DBus org.freedesktop.DBus.RequestName string:org.knod.Policy1 uint32:0 \
    >"$work/out" 2>&1
check "the bus policy stops an unprivileged caller owning org.knod.Policy1" 'grep -q AccessDenied "$work/out"'
as_user knodt-user knod-policy reload >"$work/out" 2>&1
check "polkit: a caller outside the rule's group is denied the admin method" \
    '[ $? -eq 1 ] && grep -q Error.Denied "$work/out"' || cat "$work/out"
as_user knodt-admin knod-policy reload >"$work/out" 2>&1
check "polkit: a caller in the rule's group is allowed the admin method" \
    '[ $? -eq 0 ] && grep -q "policy reloaded" "$work/out"' || { cat "$work/out" "$work/daemon.log"; }
# CanManage (the Cockpit page greys its buttons by it) asks polkit the same question.
as_user knodt-admin busctl --address="$address" call org.knod.Policy1 /org/knod/Policy1 \
    org.knod.Policy1.Manager CanManage >"$work/out" 2>&1
check "polkit: CanManage says yes to a caller in the rule's group" 'grep -q "^bs true" "$work/out"' || cat "$work/out"
as_user knodt-user busctl --address="$address" call org.knod.Policy1 /org/knod/Policy1 \
    org.knod.Policy1.Manager CanManage >"$work/out" 2>&1
check "polkit: CanManage says no, with the reason, to a caller outside it" \
    'grep -q "^bs false \".*org.knod.policy1.manage" "$work/out"' || cat "$work/out"
reload_journaled() {
    [ "$(sqlite3 /var/lib/knod-policy/journal.db "select count(*) from events where kind='policy-reload' and reason='reloaded by uid 61002'")" -ge 1 ]
}
check "the journal records the allowed reload by uid 61002" \
    'wait_until 60 "the reload by uid 61002 in the journal" reload_journaled'

# Callers of other uids against the daemon as the unit runs it.
if [ -z "$client" ]; then
    echo "# no test client given: the bind/activate/release/revoke checks are skipped"
else
    flow='udp 10.99.0.1:* -> 10.99.0.2:5000'
    # hold: "ok ID KEY" once granted (and activated), then holds until its stdin closes.
    start_holder() { # NAME COMMAND
        mkfifo "$work/$1.in"
        as_user knodt-user "$client" "$2" knodsim0 sim0 4096 "$flow" <"$work/$1.in" >"$work/$1.out" 2>&1 &
        pids+=($!)
    }
    wait_line() { wait_until 60 "a line from $1" test -s "$work/$1.out"; }
    start_holder hold1 hold-active
    exec 7>"$work/hold1.in"
    wait_line hold1
    id1=$(awk '$1 == "ok" {print $2}' "$work/hold1.out")
    check "an ordinary user binds and activates (daemon as knod-policy, the unit's capabilities)" \
        '[ -n "$id1" ]' || cat "$work/hold1.out" "$work/daemon.log"
    as_user knodt-user "$client" release "$id1" >"$work/out" 2>&1
    check "the ordinary user releases its binding" 'grep -qx ok "$work/out"' || cat "$work/out"
    exec 7>&-

    start_holder hold2 hold
    exec 8>"$work/hold2.in"
    wait_line hold2
    id2=$(awk '$1 == "ok" {print $2}' "$work/hold2.out")
    check "the ordinary user binds again" '[ -n "$id2" ]' || cat "$work/hold2.out"
    as_user knodt-user "$client" revoke "$id2" "package test" >"$work/out" 2>&1
    check "a caller outside the admin group and polkit's rule may not revoke" \
        'grep -q Error.Denied "$work/out"' || cat "$work/out"
    setpriv --reuid=knodt-ops --regid=knodt-ops --groups=61004 "$client" revoke "$id2" "package test" \
        >"$work/out" 2>&1
    check "a process holding the policy's admin group revokes" 'grep -qx ok "$work/out"' ||
        { cat "$work/out" "$work/daemon.log"; }
    exec 8>&-
    revoked_by_ops() { [ "$(revokes)" -ge 1 ]; }
    revokes() { sqlite3 /var/lib/knod-policy/journal.db "select count(*) from events where kind='revoke' and session_id='$id2' and uid=61003"; }
    check "the journal records the revocation by uid 61003" \
        'wait_until 60 "the revocation by uid 61003 in the journal" revoked_by_ops'
fi

# Auditors (#16 item 5, #33 item 4): the live journal is the daemon's alone (a reader of a WAL
# database could lock bytes of its -shm that every commit needs); knod-audit members read the
# snapshot the daemon publishes in snapshot/, which `audit` given the live journal reads
# instead, saying so; anyone else is told they cannot read it (exit 2); nobody but the daemon
# reads the key secret.
db=/var/lib/knod-policy/journal.db
snap=/var/lib/knod-policy/snapshot/journal.db
as_auditor() { setpriv --reuid=knodt-user --regid=knodt-user --groups=knod-audit "$@"; }
check "the live journal's files are 0600 knod-policy" \
    '[ "$(stat -c "%a %U" "$db" "$db-wal" "$db-shm" "$db.anchor" | sort -u)" = "600 knod-policy" ]' ||
    ls -la /var/lib/knod-policy
published() { [ -s "$snap.anchor" ]; }
check "the daemon published the auditors' snapshot" 'wait_until 60 "the snapshot" published' ||
    ls -la /var/lib/knod-policy /var/lib/knod-policy/snapshot
check "the snapshot dir is 2750 and its files 0640, knod-policy:knod-audit" \
    '[ "$(stat -c "%a %U %G" /var/lib/knod-policy/snapshot)" = "2750 knod-policy knod-audit" ] &&
     [ "$(stat -c "%a %U %G" "$snap" "$snap.anchor" | sort -u)" = "640 knod-policy knod-audit" ]' ||
    ls -la /var/lib/knod-policy/snapshot
check "the key secret is 0600 knod-policy" '[ "$(stat -c "%a %U" /var/lib/knod-policy/key-secret)" = "600 knod-policy" ]'
for sub in verify sessions events; do
    as_auditor knod-policy audit $sub --db "$db" >"$work/out" 2>&1
    check "a knod-audit member runs audit $sub on the live journal's snapshot" \
        '[ $? -eq 0 ] && grep -q "reading its published snapshot $snap" "$work/out"' || cat "$work/out"
    as_user knodt-user knod-policy audit $sub --db "$db" >"$work/out" 2>&1
    check "a non-member's audit $sub: exit 2, cannot read the journal" \
        '[ $? -eq 2 ] && grep -q "cannot read the journal $db: Permission denied" "$work/out"' || cat "$work/out"
done
check "a knod-audit member cannot open the live -shm (whose locks stop commits)" \
    '[ -e "$db-shm" ] && ! as_auditor sh -c ": <\"\$0\"" "$db-shm" 2>/dev/null'
as_auditor knod-policy audit verify --db "$db" >"$work/out" 2>&1
check "the auditor's verify compares the anchor too" 'grep -q "^anchor: event [0-9]* matches" "$work/out"' || cat "$work/out"
as_auditor cat /var/lib/knod-policy/key-secret >/dev/null 2>&1
check "a knod-audit member cannot read the key secret" '[ $? -ne 0 ]'

echo "# session: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
