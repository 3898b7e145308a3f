#!/bin/sh
# The devmem paths on a live 6.12 kernel (runs as root inside the VM, under dash; see devmem.sh).
# NICs: e1000e (PCI parent, no devmem queue management), virtio-net (parent on the virtio bus)
# and netdevsim (its own bus, no DMA mask); dma-buf exporters: udmabuf, virtio-gpu, vgem.
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

# iproute2 keeps named network namespaces in /var/run/netns (the tests' veth pairs live there).
mkdir -p /var && ln -sfn /run /var/run

for m in veth e1000e virtio_net netdevsim vgem virtio_gpu sch_ingress cls_bpf; do
    check "modprobe $m" modprobe "$m"
done
check "netdevsim device with 4 RX queues made" sh -c 'echo "1 1 4" >/sys/bus/netdevsim/new_device'
# Devices appear asynchronously: wait (up to 60 s: an emulated CPU beside a neighbour's load)
# for three NICs and two DRM cards.
i=0
while [ $i -lt 600 ]; do
    nics=$(ls /sys/class/net | grep -vc '^lo$')
    cards=$(ls /dev/dri 2>/dev/null | grep -c '^card')
    [ "$nics" -ge 3 ] && [ "$cards" -ge 2 ] && break
    sleep 0.1
    i=$((i + 1))
done
for n in $(ls /sys/class/net); do
    ip link set "$n" up
    echo "# $n: $(readlink -f /sys/class/net/$n/device 2>/dev/null || echo 'no device')"
done
check "three NICs (e1000e, virtio-net, netdevsim)" [ "$nics" -ge 3 ]
check "two DRM cards (virtio-gpu, vgem)" [ "$cards" -ge 2 ]
check "/dev/udmabuf" [ -c /dev/udmabuf ]

# gtests WHAT LOG BINARY: runs a test binary, shows its log, and checks that every test in it
# ran (none may skip on this kernel) and passed.
gtests() {
    # Names of their own: check() sets $what, and dash has no local variables by default.
    gtests_name=$1 gtests_log=$2
    shift 2
    "$@" >"$gtests_log" 2>&1
    gtests_rc=$?
    cat "$gtests_log"
    check "$gtests_name tests pass on $(uname -r)" [ $gtests_rc -eq 0 ]
    check "no $gtests_name test skipped" no_skip "$gtests_log"
}
# no_skip LOG: the log was read and names no skipped test (grep's 2, an unreadable log, fails).
no_skip() {
    grep -q '^\[  SKIPPED \]' "$1"
    [ $? -eq 1 ]
}

# The devmem integration tests: region checks on real dma-bufs, queue-get, bind-rx refused
# unasked for each non-PCI netdev, the kernel's answers on e1000e with matching hints.
export KNOD_EXPECT_DMABUF_EXPORTERS=1
gtests "devmem integration" /tmp/gtest.log knod_devmem_integration_tests
check "the e1000e answered bind-rx itself (EOPNOTSUPP)" \
    grep -q 'queue 0 + dma-buf: .*netdev bind-rx: Operation not supported' /tmp/gtest.log

# The holder's receive path (#36) on this kernel's loopback TCP: SO_DEVMEM_DONTNEED's limits and
# its answers for sockets that are not TCP, as the receiver reads them (this kernel has
# CONFIG_NET_DEVMEM: nothing skips).
gtests "devmem receive" /tmp/live.log knod_devmem_live_tests
check "the kernel refused one range more than the receiver's batches" \
    grep -q '^\[       OK \] DevmemLive.TheKernelTakesTheBatchesTheReceiverMakes' /tmp/live.log
# The same path through the C API (libknod-client.so.1), as a C holder calls it.
gtests "C API devmem receive" /tmp/capi.log knod_client_unit_tests --gtest_filter='CApiDevmem.*'
check "the C API's devmem receive test ran" grep -q '^\[       OK \] CApiDevmem\.' /tmp/capi.log
# knod.distributed's devmem path (#53) on this kernel: stream messages received whole and in
# step, a foreign message and a sender that stops halfway named, in C++ and through the C API.
check "the collectives' devmem stream ran on $(uname -r)" \
    grep -q '^\[       OK \] DevmemLive.StreamMessagesArriveWholeAndInStep' /tmp/live.log
check "the C API's devmem stream receive ran" \
    grep -q '^\[       OK \] CApiDevmem.AStreamMessageThroughTheCApi' /tmp/capi.log

# The doctor sees the same machine (a smoke check that the CLI runs on this kernel).
check "knod-policy doctor runs" sh -c 'knod-policy doctor >/tmp/doctor.log 2>&1; [ $? -le 2 ]'
# The per-NIC devmem pre-checks (issue 18) on the e1000e: rings-get reports no header split.
grep 'devmem' /tmp/doctor.log
check "the doctor says why the e1000e is not devmem-ready" \
    grep -q 'not devmem-ready: .*no header split' /tmp/doctor.log
check "the devmem backend refused the e1000e at request time for header split" \
    grep -q 'RefusesAPciNicWithoutHeaderSplitAtRequestTime' /tmp/gtest.log

exit $fail
