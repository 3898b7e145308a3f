#!/bin/sh
# The sim driver end to end on one of Debian 12's kernels (runs as root inside the VM, under
# dash; see sim.sh). The data path tests (tests/integration/datapath_test.cc) start a real
# dbus-daemon and knod-policyd with the sim driver, which builds its own namespace, veth pair,
# XDP flow filter, guard and AF_XDP sockets on this kernel: a grant, bytes landing byte-exact, a
# forbidden flow dropped and counted, steering drift ending a binding (and behind a tc filter
# that ends classification). They run once per guard path
# (KNOD_TEST_SIM_GUARD, the daemon's --sim-guard): /guards names them, "default" for the
# daemon's own choice.
fail=0
ok() { echo "ok - $*"; }
not_ok() {
    echo "not ok - $*"
    fail=1
}
check() { # check DESCRIPTION COMMAND...
    what=$1
    shift
    if "$@"; then ok "$what"; else not_ok "$what"; fi
}
set -f # test names, never file names: KNOD_VM_SIM_TESTS="*" means every DatapathTest
now_ms() { awk '{printf "%d\n", $1 * 1000}' /proc/uptime; }

kernel=$(uname -r)
echo "# kernel $kernel"
for m in veth sch_ingress cls_bpf; do
    check "modprobe $m" modprobe "$m"
done
# cgroup v2, as on any systemd host: the daemon reads its callers' units from it.
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null

# The data path tests to run (sim.sh's KNOD_VM_SIM_TESTS): by default the matrix's own, a grant
# with bytes landing and a forbidden flow dropped, steering drift ending a binding, and drift
# seen behind another tc filter (the guard asks the kernel what else is on its ingress); each
# must run and pass on every path. SimGuardPath (the daemon forced to the tc path: it must start
# where libbpf's probe says this kernel allows the helper) runs with the first path only.
tests=$(cat /tests)
filter=$(echo $tests | sed 's/[^ ]*/DatapathTest.&/g; s/ /:/g')
filter="$filter:SimGuardPath.*"
for guard in $(cat /guards); do
    log=/out/datapath-$guard.log
    started=$(now_ms)
    if [ "$guard" = default ]; then
        env -u KNOD_TEST_SIM_GUARD knod_integration_tests --gtest_filter="$filter" >"$log" 2>&1
    else
        KNOD_TEST_SIM_GUARD=$guard knod_integration_tests --gtest_filter="$filter" >"$log" 2>&1
    fi
    rc=$?
    took=$(($(now_ms) - started))
    cat "$log"
    echo "# guard path $guard on $kernel: $((took / 1000)).$((took % 1000 / 100)) s"
    check "DatapathTest with the guard path $guard passes on $kernel" [ $rc -eq 0 ]
    grep -q '^\[  SKIPPED \]' "$log"
    check "no test skipped (guard path $guard)" [ $? -eq 1 ]
    for t in $tests; do
        [ "$t" = "*" ] && continue
        check "DatapathTest.$t ran and passed (guard path $guard)" \
            grep -q "^\[       OK \] DatapathTest\.$t " "$log"
    done
    case "$filter" in
    *SimGuardPath*)
        check "SimGuardPath ran and passed: the tc path starts where the helper is allowed" \
            grep -q '^\[       OK \] SimGuardPath\.' "$log"
        grep '^# this kernel' "$log"
        ;;
    esac
    filter=${filter%:SimGuardPath.*}
    # Nothing the daemons built outlives them (the tests check their own names too).
    check "no sim link left (guard path $guard)" sh -c '! ls /sys/class/net | grep -q "^knodsi"'
    check "no sim namespace left (guard path $guard)" sh -c '! ls /run/netns 2>/dev/null | grep -q .'
done

exit $fail
