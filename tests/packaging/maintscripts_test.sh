#!/usr/bin/env bash
# The built package's maintainer scripts, as dpkg calls them on install, upgrade, remove and
# purge (#52 item 3), in seconds and without root: each script runs with the commands it calls
# on systemd (deb-systemd-invoke, deb-systemd-helper, systemctl, systemd-sysusers,
# systemd-tmpfiles) recorded instead of run, and its absolute paths moved under a scratch root.
# What they do to a real system under systemd is vm.whole_system's phase E; this says which
# script does what, for every argument dpkg passes.
# Usage: maintscripts_test.sh DEB_DIR (the packaging.build_deb fixture's output)
set -uo pipefail
deb_dir=${1:?usage: maintscripts_test.sh DEB_DIR}
deb=$(ls "$deb_dir"/knod-policy_*_"$(dpkg --print-architecture)".deb 2>/dev/null | head -1)
[ -n "$deb" ] || { echo "not ok - no knod-policy .deb in $deb_dir"; exit 1; }
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $1"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $1"; }
check() { if eval "$2"; then ok "$1"; else not_ok "$1"; return 1; fi; }

work=$(mktemp -d /tmp/knod-maintscripts.XXXXXX)
trap 'rm -rf "$work"' EXIT
dpkg-deb -e "$deb" "$work/ctl" || { echo "not ok - dpkg-deb -e $deb"; exit 1; }
root=$work/root
mkdir -p "$work/bin" "$root/run/systemd/system"
log=$work/calls
for cmd in deb-systemd-invoke deb-systemd-helper systemctl systemd-sysusers systemd-tmpfiles; do
    # was-enabled: the units were never enabled (as shipped); everything else succeeds.
    cat >"$work/bin/$cmd" <<STUB
#!/bin/sh
echo "$cmd \$*" >>"$log"
case "\$*" in *was-enabled*) exit 1 ;; esac
exit 0
STUB
    chmod 0755 "$work/bin/$cmd"
done
# The scripts' absolute paths, under the scratch root.
for s in preinst postinst prerm postrm; do
    [ -f "$work/ctl/$s" ] || continue
    sed -E "s#(/run/systemd/system|/run/knod-policy|/run/knod-cni|/var/lib/prometheus|/var/lib/knod-policy|/sys/fs/bpf/knod|/etc/knod)#$root\1#g" \
        "$work/ctl/$s" >"$work/$s"
done
# SCRIPT ARGS...: its exit status; what it called is in $log (emptied first).
run() {
    local s=$1
    shift
    : >"$log"
    [ -f "$work/$s" ] || return 0
    env -u DPKG_ROOT PATH="$work/bin:/usr/bin:/bin" sh "$work/$s" "$@" >"$work/out" 2>&1
}
called() { grep -q -- "$1" "$log"; }
stops() { grep -E "^deb-systemd-invoke stop .*$1" "$log" >/dev/null; }

# --- install ----------------------------------------------------------------------------
run preinst install
check "a fresh install's preinst stops nothing" '! called "invoke stop"'
run postinst configure ""
check "a fresh install's postinst starts and enables nothing (README.Debian: an admin does)" \
    '! called "invoke start" && ! called "invoke restart" && ! called "invoke try-restart" &&
     ! called "helper enable" && ! called "systemctl start"' || cat "$log"

# --- upgrade ----------------------------------------------------------------------------
run preinst upgrade 0.1.0
check "an upgrade's preinst stops nothing (a stop would empty the fd store)" '! called "invoke stop"' ||
    cat "$log"
run prerm upgrade 0.1.1
check "an upgrade's prerm stops nothing" '! called "invoke stop"' || cat "$log"
run postinst configure 0.1.0
check "an upgrade's postinst try-restarts the daemon and the metrics timer (what ran runs again)" \
    'grep -Eq "^deb-systemd-invoke try-restart .*knod-policyd.service" "$log" &&
     grep -Eq "^deb-systemd-invoke try-restart .*knod-policy-metrics.timer" "$log"' || cat "$log"
check "an upgrade's postinst reloads systemd before it restarts" \
    'awk "/daemon-reload/ && !r {r = NR} /try-restart/ && !t {t = NR} END {exit !(r && t && r < t)}" "$log"' ||
    cat "$log"
check "an upgrade's postinst starts nothing that was not running" \
    '! called "invoke start" && ! called "invoke restart"' || cat "$log"

# --- remove and purge ---------------------------------------------------------------------
textfile=$root/var/lib/prometheus/node-exporter/knod-policy.prom
mkdir -p "$(dirname "$textfile")" "$root/run/knod-policy" "$root/run/knod-cni" "$root/sys/fs/bpf/knod" \
    "$root/var/lib/knod-policy" "$root/etc/knod/policy.d"
printf 'knod_up 1\n' >"$textfile"
printf 'half\n' >"$root/var/lib/prometheus/node-exporter/.knod-policy.prom.AbC123"
printf 'other\n' >"$root/var/lib/prometheus/node-exporter/other.prom"
: >"$root/var/lib/knod-policy/journal.db"
run prerm remove
check "removal's prerm stops the metrics timer and the daemon" \
    'stops knod-policyd.service && stops knod-policy-metrics.timer' || cat "$log"
check "removal's prerm stops the timer before the daemon (no run against a stopping daemon)" \
    'grep -Eq "^deb-systemd-invoke stop .*knod-policy-metrics.timer.*knod-policyd.service" "$log"' ||
    cat "$log"
run postrm remove
check "removal's postrm deletes the metrics textfile and a torn temporary copy, nothing else" \
    '[ ! -e "$textfile" ] && [ ! -e "$root/var/lib/prometheus/node-exporter/.knod-policy.prom.AbC123" ] &&
     [ -e "$root/var/lib/prometheus/node-exporter/other.prom" ] && [ -e "$root/var/lib/knod-policy/journal.db" ]'
run postrm purge
check "purge removes the run dir, knod-cni's spool, the pin dir and the empty config dir" \
    '[ ! -e "$root/run/knod-policy" ] && [ ! -e "$root/run/knod-cni" ] && [ ! -e "$root/sys/fs/bpf/knod" ] && [ ! -e "$root/etc/knod" ]'
check "purge keeps the journal and says so" \
    '[ -e "$root/var/lib/knod-policy/journal.db" ] && grep -q "kept the journal" "$work/out"'
KNOD_PURGE_JOURNAL=yes run postrm purge
check "purge with KNOD_PURGE_JOURNAL=yes removes the state dir" '[ ! -e "$root/var/lib/knod-policy" ]'

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
