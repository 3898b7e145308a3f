#!/bin/sh
# Runs in the guest of host_checks.sh (as root, under dash): records what the live kernel shows
# in sysfs (groups, group types, the PCI tree, netdevs and their queues) and runs
# `knod-policy doctor --json` for each NIC/GPU pair of the topology, as root and as knoduser.
# The host compares the two; this script only collects. Its exit status is 0 unless the
# collection itself broke.
set -u
out=/out
fail() {
    echo "guest: $*"
    exit 1
}

# netdevsim: a netdev with 4 allocated RX queues, 2 of them made active with ethtool (item 5
# of issue 17: the doctor must report the active count).
modprobe e1000e || fail "modprobe e1000e"
modprobe virtio_net || fail "modprobe virtio_net"
modprobe netdevsim || fail "modprobe netdevsim"
echo "17 1 4" >/sys/bus/netdevsim/new_device || fail "netdevsim new_device"
sleep 0.2
nsim=$(ls /sys/bus/netdevsim/devices/netdevsim17/net/ 2>/dev/null | head -1)
[ -n "$nsim" ] || fail "netdevsim made no netdev"
ethtool -L "$nsim" combined 2 || fail "ethtool -L $nsim combined 2"

# Facts, one per line: "pci ADDR CLASS REALPATH GROUP TYPE", "netdev NAME REALPATH-OF-DEVICE
# SYSFS-RX-COUNT", "channels NAME rx combined" (active, from ethtool), "cmdline ...".
{
    echo "cmdline $(cat /proc/cmdline)"
    for d in /sys/bus/pci/devices/*; do
        a=$(basename "$d")
        g=-
        t=-
        if [ -e "$d/iommu_group" ]; then
            g=$(basename "$(readlink -f "$d/iommu_group")")
            t=$(cat "$d/iommu_group/type")
        fi
        echo "pci $a $(cat "$d/class") $(readlink -f "$d") $g $t"
    done
    for n in /sys/class/net/*; do
        name=$(basename "$n")
        dev=-
        [ -e "$n/device" ] && dev=$(readlink -f "$n/device")
        echo "netdev $name $dev $(ls -d "$n"/queues/rx-* 2>/dev/null | wc -l)"
        ch=$(ethtool -l "$name" 2>/dev/null | sed -n '/^Current hardware settings/,$p')
        if [ -n "$ch" ]; then
            rx=$(echo "$ch" | awk '/^RX:/ {print $2}')
            comb=$(echo "$ch" | awk '/^Combined:/ {print $2}')
            echo "channels $name ${rx:-0} ${comb:-0}"
        fi
    done
    for g in /sys/kernel/iommu_groups/*; do
        [ -d "$g" ] || continue
        echo "group $(basename "$g") $(cat "$g/type") $(ls "$g/devices" | tr '\n' ' ')"
    done
} >"$out/facts.txt"
lspci -tv >"$out/lspci-tree.txt" 2>&1
lspci -vvv >"$out/lspci.txt" 2>&1

# The endpoint of a class (02: network, 03: display) below a root port, by PCI address.
below() { # ROOT_PORT CLASS_PREFIX [SECOND_ROOT]
    for d in /sys/bus/pci/devices/*; do
        case "$(readlink -f "$d")" in */"$1"/*) ;; *) continue ;; esac
        case "$(cat "$d/class")" in "0x$2"*) basename "$d" ;; esac
    done | head -1
}
netdev_of() {
    for n in /sys/class/net/*; do
        case "$(readlink -f "$n/device" 2>/dev/null)" in */"$1" | */"$1"/*) basename "$n" ;; esac
    done | head -1
}

# Pairs: NIC root port, GPU root port (pcie.0 addresses fixed by host_checks.sh).
pairs="acs,0000:00:03.0,0000:00:02.0 noacs,0000:00:05.0,0000:00:04.0 switch,0000:00:06.0,0000:00:06.0 cross,0000:00:06.0,0000:00:02.0"
: >"$out/pairs.txt"
for p in $pairs; do
    # shellcheck disable=SC2046
    set -- $(echo "$p" | tr , ' ')
    name=$1 nic_rp=$2 gpu_rp=$3
    nic_pci=$(below "$nic_rp" 02)
    gpu_pci=$(below "$gpu_rp" 03)
    nic=$(netdev_of "$nic_pci")
    [ -n "$nic" ] && [ -n "$gpu_pci" ] || fail "pair $name: no NIC ($nic_pci) or GPU ($gpu_pci)"
    echo "$name $nic $nic_pci $gpu_pci" >>"$out/pairs.txt"
    knod-policy doctor --json --nic "$nic" --gpu "$gpu_pci" >"$out/doctor-root-$name.json" \
        2>"$out/doctor-root-$name.err"
    echo $? >"$out/doctor-root-$name.rc"
    setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all \
        knod-policy doctor --json --nic "$nic" --gpu "$gpu_pci" >"$out/doctor-user-$name.json" \
        2>"$out/doctor-user-$name.err"
    echo $? >"$out/doctor-user-$name.rc"
done
knod-policy doctor --json >"$out/doctor-root-all.json" 2>"$out/doctor-root-all.err"
echo $? >"$out/doctor-root-all.rc"
exit 0
