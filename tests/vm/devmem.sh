#!/bin/bash
# Live-kernel devmem paths (issue 17): Debian's 6.12 under QEMU (TCG) with an emulated VT-d
# IOMMU, real dma-buf exporters (udmabuf, virtio-gpu, vgem) and NICs e1000e, virtio-net (mq=on)
# and netdevsim. One boot runs tests/vm/devmem_guest.sh, which runs the devmem integration
# tests and the holder's receive path (knod_devmem_live_tests, and the C API's over
# libknod-client.so.1) inside; then no kernel WARNING, Oops or BUG may be in the guest's log.
#   tests/vm/devmem.sh BUILD_DIR        (77: no QEMU here)
set -u
build=$(cd "${1:?usage: devmem.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
vm_setup
started=$(date +%s)

VM_BINARIES="$build/tests/integration/knod_devmem_integration_tests $build/tests/unit/knod_devmem_live_tests $build/tests/unit/knod_client_unit_tests $build/cli/knod-policy"
VM_MODULES="veth e1000e virtio_net netdevsim vgem virtio_gpu sch_ingress cls_bpf"
for b in $VM_BINARIES; do
    [ -x "$b" ] || {
        echo "not ok - $b is not built"
        exit 1
    }
done
vm_initramfs "$here/devmem_guest.sh" "$VM_TMP/devmem.cpio"
out=$VM_TMP/devmem
# No NIC reaches anything: the two share a hub with nothing else on it (a port alone on a hub
# cannot send at all, and the guest's TX watchdog fires).
vm_boot "$VM_TMP/devmem.cpio" "$out" "intel_iommu=on" -- \
    -M q35 -device intel-iommu,intremap=on,caching-mode=on \
    -netdev hubport,id=n0,hubid=0 -device e1000e,netdev=n0 \
    -netdev hubport,id=n1,hubid=0 -device virtio-net-pci,netdev=n1,mq=on \
    -device virtio-gpu-pci
rc=$?
[ -f "$out/guest.log" ] && cat "$out/guest.log"
fail=0
if [ $rc -eq 0 ]; then echo "ok - guest checks"; else
    echo "not ok - guest checks (exit $rc)"
    fail=1
fi
if [ -f "$out/dmesg" ] && vm_no_warnings "$out"; then
    echo "ok - no kernel WARNING, Oops or BUG in the guest's log"
else
    echo "not ok - the guest's kernel logged a WARNING, Oops or BUG (above), or no log came back"
    fail=1
fi
if [ $fail -ne 0 ]; then
    echo "--- console tail"
    tail -40 "$out/console.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*[A-Za-z]//g'
    echo "--- dmesg tail"
    tail -40 "$out/dmesg" 2>/dev/null
fi
echo "# devmem VM test: $(($(date +%s) - started)) s"
exit $fail
