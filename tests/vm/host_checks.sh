#!/usr/bin/env bash
# Live-kernel host checks (issue 17): boots Debian's 6.12 under QEMU (TCG) on one PCIe topology
# carrying three NIC/GPU pairs, once per IOMMU mode, runs `knod-policy doctor --json` in the
# guest as root and as an unprivileged user, and checks its verdicts against what the guest's
# own sysfs shows and what each topology must give.
#
#   pcie.0 00:02.0 root port (ACS)              -> virtio-gpu-pci   GPU of pair "acs"
#          00:03.0 root port (ACS)              -> e1000e           NIC of pair "acs"
#          00:04.0 root port (disable-acs=on)   -> virtio-gpu-pci   GPU of pair "noacs"
#          00:05.0 root port (disable-acs=on)   -> virtio-net-pci   NIC of pair "noacs" (1 queue)
#          00:06.0 root port (ACS) -> x3130 switch upstream port
#                     -> xio3130 downstream port -> virtio-net-pci  NIC of pairs "switch", "cross"
#                     -> xio3130 downstream port -> virtio-gpu-pci  GPU of pair "switch"
#   pair "cross": the switch's NIC with the GPU of pair "acs" (crosses the switch upstream port)
#   plus netdevsim (no PCI parent): 4 RX queues allocated, 2 active.
#
# Modes: dma (VT-d, caching-mode=on), dma-fq (caching-mode off), pt (iommu=pt),
# passthrough (iommu.passthrough=1), none (no IOMMU). KNOD_VM_HOST_MODES="dma pt" picks some.
#
# Usage: host_checks.sh BUILD_DIR    Exit: 0 all ok, 1 a check failed, 77 no QEMU here.
set -uo pipefail
build=${1:?usage: host_checks.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_setup

VM_BINARIES="$build/cli/knod-policy"
VM_MODULES="netdevsim e1000e virtio_net"
VM_FILES=""
vm_initramfs "$here/host_checks_guest.sh" "$VM_TMP/host.cpio"

topology=(
    -M q35,kernel-irqchip=split -nodefaults
    -device pcie-root-port,id=rpag,bus=pcie.0,addr=0x2,chassis=1
    -device virtio-gpu-pci,bus=rpag
    -device pcie-root-port,id=rpan,bus=pcie.0,addr=0x3,chassis=2
    -netdev hubport,id=na,hubid=1 -device e1000e,netdev=na,bus=rpan
    -device pcie-root-port,id=rpdg,bus=pcie.0,addr=0x4,chassis=3,disable-acs=on
    -device virtio-gpu-pci,bus=rpdg
    -device pcie-root-port,id=rpdn,bus=pcie.0,addr=0x5,chassis=4,disable-acs=on
    -netdev hubport,id=nd,hubid=2 -device virtio-net-pci,netdev=nd,bus=rpdn
    -device pcie-root-port,id=rps,bus=pcie.0,addr=0x6,chassis=5
    -device x3130-upstream,id=up,bus=rps
    -device xio3130-downstream,id=dn1,bus=up,chassis=6,slot=0
    -device xio3130-downstream,id=dn2,bus=up,chassis=7,slot=1
    -netdev hubport,id=ns,hubid=3 -device virtio-net-pci,netdev=ns,bus=dn1
    -device virtio-gpu-pci,bus=dn2
)

status=0
for mode in ${KNOD_VM_HOST_MODES:-dma dma-fq pt passthrough none}; do
    case $mode in
    dma) kargs="intel_iommu=on" iommu=(-device intel-iommu,intremap=on,caching-mode=on) ;;
    dma-fq) kargs="intel_iommu=on" iommu=(-device intel-iommu,intremap=on) ;;
    pt) kargs="intel_iommu=on iommu=pt" iommu=(-device intel-iommu,intremap=on,caching-mode=on) ;;
    passthrough) kargs="intel_iommu=on iommu.passthrough=1" iommu=(-device intel-iommu,intremap=on,caching-mode=on) ;;
    none) kargs="" iommu=() ;;
    *)
        echo "host_checks: unknown mode $mode" >&2
        exit 2
        ;;
    esac
    out=$VM_TMP/out-$mode
    started=$(date +%s)
    vm_boot "$VM_TMP/host.cpio" "$out" "knod.mode=$mode $kargs" -- "${topology[@]}" "${iommu[@]}"
    rc=$?
    echo "# boot $mode: $(($(date +%s) - started)) s (guest exit $rc)"
    if [ $rc -ne 0 ]; then
        echo "not ok - $mode: the guest did not finish (exit $rc)"
        [ -f "$out/guest.log" ] && sed 's/^/#   guest: /' "$out/guest.log"
        tail -40 "$out/console.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*[A-Za-z]//g; s/^/#   console: /'
        status=1
        continue
    fi
    if ! python3 "$here/host_checks_verify.py" "$mode" "$out"; then
        status=1
        echo "# $mode: dmesg tail:"
        tail -25 "$out/dmesg" | sed 's/^/#   /'
        echo "# $mode: guest log:"
        sed 's/^/#   /' "$out/guest.log"
    fi
    if ! vm_no_warnings "$out"; then
        echo "not ok - $mode: the kernel logged a WARNING, Oops or BUG"
        status=1
    fi
done
exit $status
