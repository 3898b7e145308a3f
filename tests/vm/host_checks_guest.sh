#!/bin/sh
# Runs in the guest of host_checks.sh (as root, under dash): records what the live kernel shows
# in sysfs (groups, group types, the PCI tree, netdevs and their queues) and runs
# `knod-policy doctor --json` (every pair, and one pair selected) as root and as knoduser.
# The host compares the two; this script only collects. Its exit status is 0 unless the
# collection itself broke.
set -u
out=/out
fail() {
    echo "guest: $*"
    exit 1
}
# Guest uptime at each step, for the log: TCG is slow and the budget is tight.
mark() { echo "guest: $(cut -d' ' -f1 /proc/uptime) s: $*"; }
mark start

# netdevsim: a netdev with 4 allocated RX queues, 2 of them made active with ethtool (item 5
# of issue 17: the doctor must report the active count).
modprobe e1000e || fail "modprobe e1000e"
modprobe virtio_net || fail "modprobe virtio_net"
modprobe netdevsim || fail "modprobe netdevsim"
echo "17 1 4" >/sys/bus/netdevsim/new_device || fail "netdevsim new_device"
# Its netdev appears asynchronously: wait for it (60 s at most), not for a time.
nsim=
for _ in $(seq 600); do
    nsim=$(ls /sys/bus/netdevsim/devices/netdevsim17/net/ 2>/dev/null | head -1)
    [ -n "$nsim" ] && break
    sleep 0.1
done
[ -n "$nsim" ] || fail "netdevsim made no netdev"
ethtool -L "$nsim" combined 2 || fail "ethtool -L $nsim combined 2"

mark "modules loaded, netdevsim made"
# Facts, one per line: "pci ADDR CLASS REALPATH GROUP TYPE", "netdev NAME REALPATH-OF-DEVICE
# SYSFS-RX-COUNT", "channels NAME rx combined" (active, from ethtool), "cmdline ...".
# Few forks: each costs tens of milliseconds under TCG.
{
    read -r cmdline </proc/cmdline
    echo "cmdline $cmdline"
    for d in /sys/bus/pci/devices/*; do
        read -r class <"$d/class"
        g=- t=-
        if [ -e "$d/iommu_group" ]; then
            set -- $(realpath "$d" "$d/iommu_group")
            g=${2##*/}
            read -r t <"$d/iommu_group/type"
        else
            set -- $(realpath "$d")
        fi
        echo "pci ${d##*/} $class $1 $g $t"
    done
    for n in /sys/class/net/*; do
        name=${n##*/}
        dev=-
        [ -e "$n/device" ] && dev=$(realpath "$n/device")
        rx=0
        for q in "$n"/queues/rx-*; do [ -e "$q" ] && rx=$((rx + 1)); done
        echo "netdev $name $dev $rx"
        # Active channels (the "Current hardware settings" block): RX + Combined.
        ethtool -l "$name" 2>/dev/null | awk -v n="$name" '
            /^Current hardware settings/ {cur = 1}
            cur && /^RX:/ {rx = $2} cur && /^Combined:/ {c = $2}
            END {if (cur) print "channels " n " " (rx == "" ? 0 : rx) " " (c == "" ? 0 : c)}'
    done
    for g in /sys/kernel/iommu_groups/*; do
        [ -d "$g" ] || continue
        read -r t <"$g/type"
        list=
        for m in "$g"/devices/*; do list="$list ${m##*/}"; done
        echo "group ${g##*/} $t$list"
    done
} >"$out/facts.txt"
lspci -vvvn >"$out/lspci.txt" 2>&1 # -n: pci.ids costs seconds under TCG
mark "facts written"

# The endpoint of a class (02: network, 03: display) below a root port, and the netdev of a PCI
# function, from the facts above.
below() { # ROOT_PORT CLASS_PREFIX
    awk -v rp="/$1/" -v cls="0x$2" '$1 == "pci" && index($4, rp) && index($3, cls) == 1 {print $2; exit}' "$out/facts.txt"
}
netdev_of() { # PCI_ADDRESS
    awk -v a="/$1" '$1 == "netdev" && (index($3, a "/") || substr($3, length($3) - length(a) + 1) == a) {print $2; exit}' "$out/facts.txt"
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
done

# doctor: each run costs about 1.5 s under TCG, so the whole report (every NIC with every GPU)
# once per user, and one pair selected with --nic/--gpu once per user.
doctor() { # WHO NAME ARGS...
    who=$1 name=$2
    shift 2
    if [ "$who" = root ]; then
        knod-policy doctor --json "$@" >"$out/doctor-$who-$name.json" 2>"$out/doctor-$who-$name.err"
    else
        setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all \
            knod-policy doctor --json "$@" >"$out/doctor-$who-$name.json" 2>"$out/doctor-$who-$name.err"
    fi
    echo $? >"$out/doctor-$who-$name.rc"
}
set -- $(grep '^acs ' "$out/pairs.txt")
for who in root user; do
    doctor "$who" all
    doctor "$who" acs --nic "$2" --gpu "$4"
done
mark done
exit 0
