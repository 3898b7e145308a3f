#!/bin/bash
# The kernel matrix of the sim driver (issue 50): Debian 12's own 6.1 and Debian's newest 6.12,
# booted once each under QEMU (TCG). Inside, tests/vm/sim_guest.sh runs the data path
# integration tests (DatapathTest: a real dbus-daemon and knod-policyd with the sim driver; a
# grant, bytes landing, a forbidden flow dropped, steering drift ending a binding) once per
# guard path: the guard at tc ingress fed the RX queue through XDP metadata (tc), and inside the
# XDP filter (xdp). This machine's own kernel, which refuses bpf_xdp_adjust_meta to XDP
# programs, runs the same tests in the ordinary suite (integration.DatapathTest.*,
# integration.sim-xdp.DatapathTest.*, integration.SimGuardPath.*). No kernel WARNING may appear.
#
#   tests/vm/sim.sh BUILD_DIR        (77: no QEMU here)
# Environment: KNOD_VM_SIM_KERNELS (default "6.1 6.12"), KNOD_VM_SIM_GUARDS (default "tc xdp";
# "default" runs without KNOD_TEST_SIM_GUARD, the daemon's own choice), KNOD_VM_SIM_TESTS (the
# DatapathTest names, default the matrix's three; "*" runs all eight, about 100 s per path and
# kernel under TCG: too long for every run of the suite).
set -u
build=$(cd "${1:?usage: sim.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
. "$here/lib.sh"
vm_setup
started=$(date +%s)
kernels=${KNOD_VM_SIM_KERNELS:-6.1 6.12}
guards=${KNOD_VM_SIM_GUARDS:-tc xdp}
# About 12 s each under TCG (a bus, a daemon, its sim network and BPF programs per test).
tests=${KNOD_VM_SIM_TESTS:-AllowedPayloadArrivesByteExactForbiddenNever ForeignTrafficOnABoundQueueRevokesForSteeringDrift AFilterAheadOfTheGuardDoesNotHideSteeringDrift}

# The test binary finds the daemon, the test client, the CLI and the bus policy at the paths it
# was built with: they go to the same paths in the guest.
daemon=$build/daemon/knod-policyd
client=$build/tests/knod_test_client
cli=$build/cli/knod-policy
for b in "$build/tests/integration/knod_integration_tests" "$daemon" "$client" "$cli"; do
    [ -x "$b" ] || {
        echo "not ok - $b is not built"
        exit 1
    }
done
for t in dbus-daemon sqlite3; do
    command -v "$t" >/dev/null || {
        echo "vm: $t not found: install it with scripts/install-deps.sh" >&2
        exit 77
    }
done
VM_BINARIES="$build/tests/integration/knod_integration_tests $daemon:$daemon $client:$client $cli:$cli
    $(command -v dbus-daemon) $(command -v sqlite3)"
VM_MODULES="veth sch_ingress cls_bpf"
echo "$guards" >"$VM_TMP/guards"
printf '%s\n' "$tests" >"$VM_TMP/tests"
VM_FILES="$src/scripts/private-bus.conf.in:$src/scripts/private-bus.conf.in
    $src/packaging/dbus/org.knod.Policy1.conf:$src/packaging/dbus/org.knod.Policy1.conf
    $VM_TMP/guards:/guards $VM_TMP/tests:/tests"

fail=0
summary=""
for series in $kernels; do
    boot_started=$(date +%s)
    vm_kernel "$series"
    vm_initramfs "$here/sim_guest.sh" "$VM_TMP/sim-$series.cpio"
    out=$VM_TMP/sim-$series
    # No NIC: the sim builds its own veth pair in a namespace of its own.
    vm_boot "$VM_TMP/sim-$series.cpio" "$out" "" -- -M q35
    rc=$?
    took=$(($(date +%s) - boot_started))
    [ -f "$out/guest.log" ] && sed "s/^/[$VM_KVER] /" "$out/guest.log"
    if [ $rc -eq 0 ]; then echo "ok - the sim end to end on $VM_KVER (guard paths: $guards)"; else
        echo "not ok - the sim end to end on $VM_KVER (exit $rc)"
        fail=1
    fi
    if [ -f "$out/dmesg" ] && vm_no_warnings "$out"; then
        echo "ok - no kernel WARNING, Oops or BUG in $VM_KVER's log"
    else
        echo "not ok - $VM_KVER logged a WARNING, Oops or BUG (above), or no log came back"
        fail=1
    fi
    if [ $rc -ne 0 ]; then
        echo "--- console tail ($VM_KVER)"
        tail -40 "$out/console.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*[A-Za-z]//g'
        echo "--- dmesg tail ($VM_KVER)"
        tail -40 "$out/dmesg" 2>/dev/null
    fi
    summary="$summary $VM_KVER: ${took} s ($(grep -h '^# guard path' "$out/guest.log" 2>/dev/null |
        sed 's/^# guard path \([a-z]*\) on [^:]*: /\1 /' | paste -sd, -));"
done
echo "# sim VM test: $(($(date +%s) - started)) s;$summary"
exit $fail
