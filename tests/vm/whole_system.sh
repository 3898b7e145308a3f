#!/usr/bin/env bash
# Whole-system test (#17 "What to build" 4): the project's .deb, installed with apt into a Debian 12
# root filesystem, under systemd as PID 1 with the system bus and polkitd, booted under QEMU (TCG)
# with Debian's 6.12 kernel. The guest half (whole_system_guest.sh) drives systemctl, the CLI and
# the test client as ordinary users; this half builds the disk and initramfs, boots, and reports.
#
# Usage: whole_system.sh SOURCE_DIR DEB_DIR TEST_CLIENT
#   DEB_DIR: where the packaging.build_deb fixture put knod-policy_*.deb.
# Exit: 0 all passed, 1 a failure, 77 skipped (no QEMU, mmdebstrap, or not root).
# Debugging: KNOD_WS_GUEST=SCRIPT runs SCRIPT in the guest instead of whole_system_guest.sh;
# KNOD_WS_SIMCONF=FILE makes the guest use FILE instead of the package's sim.conf.
# Caches (outside the repo, KNOD_VM_CACHE, default /var/cache/knod-vm): the kernel
# (tests/vm/assets.sh) and the rootfs without the .deb (tests/vm/rootfs.sh). Everything else
# lives in a temporary directory that the exit removes, QEMU included (killed by its pidfile).
set -uo pipefail
export PATH=$PATH:/usr/sbin:/sbin
src=$(cd "${1:?usage: whole_system.sh SOURCE_DIR DEB_DIR TEST_CLIENT}" && pwd)
deb_dir=${2:?usage: whole_system.sh SOURCE_DIR DEB_DIR TEST_CLIENT}
client=${3:?usage: whole_system.sh SOURCE_DIR DEB_DIR TEST_CLIENT}
t0=$(date +%s)
stamp() { echo "# [$(($(date +%s) - t0)) s] $*"; }
die() {
    echo "not ok - whole_system: $*"
    exit 1
}
skip() {
    echo "# SKIP whole_system: $*"
    exit 77
}

[ "$(id -u)" -eq 0 ] || skip "needs root (chroot, mkfs -d with owners)"
for tool in qemu-system-x86_64 mmdebstrap mkfs.ext4 busybox cpio xz; do
    command -v "$tool" >/dev/null || skip "$tool not found (scripts/install-deps.sh installs it)"
done
# The NIC's backend is a tap left down (only a tap gives virtio-net more than one queue).
[ -c /dev/net/tun ] || skip "/dev/net/tun is missing"
[ -x "$client" ] || die "no test client at $client"

kdir=$("$src/tests/vm/assets.sh" --print-dir) || die "tests/vm/assets.sh failed"
kver=$(cat "$kdir/KVER")
deb=$(ls "$deb_dir"/knod-policy_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || die "no knod-policy_*.deb in $deb_dir (the packaging.build_deb test makes it)"
rootfs=$("$src/tests/vm/rootfs.sh" "$kdir" "$deb" | tail -1) || die "tests/vm/rootfs.sh failed"
[ -d "$rootfs" ] || die "tests/vm/rootfs.sh printed no directory"
stamp "kernel $kver, rootfs $rootfs, $(basename "$deb")"

work=$(mktemp -d /tmp/knod-wholesys.XXXXXX)
cleanup() {
    local pid
    pid=$(cat "$work/qemu.pid" 2>/dev/null) # QEMU removes it as it exits
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null && sleep 0.5
        kill -9 "$pid" 2>/dev/null
    fi
    umount "$work/root/proc" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# --- the disk: the cached rootfs plus the .deb, installed with apt as a user would ------------
cp -a --reflink=auto "$rootfs" "$work/root" || die "cannot copy the rootfs"
cp "$deb" "$work/root/tmp/"
unshare --mount --propagation private sh -c '
    mount -t proc proc "$1/proc" &&
    chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        "/tmp/$(basename "$2")"' sh "$work/root" "$deb" >"$work/apt.log" 2>&1 ||
    {
        tail -20 "$work/apt.log"
        die "apt-get install ./$(basename "$deb") failed in the image"
    }
rm -f "$work/root/tmp/"*.deb
install -m 0755 "$client" "$work/root/usr/local/bin/knod_test_client"
# Test accounts: an ordinary user in the policy's group (and udmabuf's), an admin for polkit,
# an auditor.
chroot "$work/root" sh -e -c '
    groupadd -g 61000 knodt-users; groupadd -g 61010 knodt-admins; groupadd -g 61020 knodt-opsadm
    udmabuf_group=$(getent group kvm >/dev/null && echo kvm || echo users)
    useradd -u 61001 -U -G knodt-users,$udmabuf_group -m -s /bin/sh knodt-user
    useradd -u 61002 -U -G knodt-admins -M -s /usr/sbin/nologin knodt-admin
    useradd -u 61003 -U -G knod-audit -M -s /usr/sbin/nologin knodt-aud' >>"$work/apt.log" 2>&1 ||
    die "cannot add the test users"
# /dev/udmabuf is root 0600 without a rule; group kvm like /dev/kvm.
echo 'KERNEL=="udmabuf", GROUP="kvm", MODE="0660"' >"$work/root/etc/udev/rules.d/60-knodt-udmabuf.rules"
cat >"$work/root/etc/polkit-1/rules.d/50-knodt.rules" <<'RULE'
polkit.addRule(function(action, subject) {
    if (action.id == "org.knod.policy1.manage" && subject.isInGroup("knodt-admins"))
        return polkit.Result.YES;
});
RULE
# The runner: mounts the host's share and runs the guest half; Type=exec so the system still
# reaches "running" while it works. It powers off at the end.
cat >"$work/root/etc/systemd/system/knodt-runner.service" <<'UNIT'
[Unit]
Description=knod whole-system test runner
After=multi-user.target
[Service]
Type=exec
ExecStart=/bin/sh -c 'modprobe 9pnet_virtio; mkdir -p /mnt/host && mount -t 9p -o trans=virtio,version=9p2000.L host /mnt/host && /bin/bash /mnt/host/guest.sh >/mnt/host/guest.log 2>&1; sync; systemctl poweroff --force --force'
UNIT
mkdir -p "$work/root/etc/systemd/system/multi-user.target.wants"
ln -s ../knodt-runner.service "$work/root/etc/systemd/system/multi-user.target.wants/"
# No getty on the console: its output is the test's log.
ln -sf /dev/null "$work/root/etc/systemd/system/serial-getty@ttyS0.service"
mkfs.ext4 -q -F -L root -d "$work/root" "$work/root.img" 2G || die "mkfs.ext4 -d failed"
rm -rf "$work/root"
stamp "disk ready ($(du -sh "$work/root.img" | cut -f1) used)"

# --- the initramfs: busybox, the modules for virtio_blk and ext4, switch_root to systemd ----
mkdir -p "$work/initrd/bin" "$work/initrd/lib/modules" "$work/initrd/dev" "$work/initrd/proc" \
    "$work/initrd/sys" "$work/initrd/newroot"
cp "$(command -v busybox)" "$work/initrd/bin/busybox"
mods="lib/crc16 fs/mbcache fs/jbd2/jbd2 crypto/crc32c_generic fs/ext4/ext4 drivers/block/virtio_blk"
for m in $mods; do
    xz -dc "$kdir/root/lib/modules/$kver/kernel/$m.ko.xz" >"$work/initrd/lib/modules/$(basename "$m").ko" ||
        die "module $m not in the kernel cache"
done
cat >"$work/initrd/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(for m in $mods; do printf '%s ' "$(basename "$m")"; done); do insmod /lib/modules/\$m.ko; done
for i in \$(seq 600); do [ -b /dev/vda ] && break; sleep 0.1; done
mount -t ext4 -o rw /dev/vda /newroot || { echo "initramfs: cannot mount /dev/vda"; poweroff -f; }
umount /proc /sys; mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
INIT
chmod 0755 "$work/initrd/init"
(cd "$work/initrd" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initrd.img"

# --- boot ---------------------------------------------------------------------------------
mkdir -p "$work/share"
cp "${KNOD_WS_GUEST:-$src/tests/vm/whole_system_guest.sh}" "$work/share/guest.sh"
# The upgrade the guest installs over the running package (phase E): the same package under a
# higher version, so apt and dpkg run every maintainer script of an upgrade.
version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -R "$deb" "$work/upgrade" &&
    sed -i "s/^Version: .*/Version: $version+wsupgrade1/" "$work/upgrade/DEBIAN/control" &&
    dpkg-deb --root-owner-group -b "$work/upgrade" "$work/share/knod-policy-upgrade.deb" >/dev/null ||
    die "cannot make the upgrade package"
rm -rf "$work/upgrade"
[ -n "${KNOD_WS_SIMCONF:-}" ] && cp "$KNOD_WS_SIMCONF" "$work/share/sim.conf"
chmod 0777 "$work/share"
stamp "booting"
# The NIC: virtio-net with 2 queue pairs (devmem reserves a queue other than 0). Only a tap
# backend gives QEMU more than one queue; it is left down and bridged to nothing, so no packet
# leaves this machine, and it vanishes with QEMU.
tap=knodws$$
# In the background: a signal to this script runs its traps at once, not after QEMU ends.
# thread=single: see vm_boot in lib.sh (multi-threaded TCG let a vCPU run stale live-patched code).
timeout 780 qemu-system-x86_64 -accel tcg,thread=single -cpu max -smp 2 -m 2G -M q35 \
    -nographic -no-reboot -pidfile "$work/qemu.pid" \
    -kernel "$kdir/vmlinuz" -initrd "$work/initrd.img" \
    -append "console=ttyS0 root=/dev/vda rw panic=-1 quiet systemd.show_status=0 net.ifnames=0" \
    -drive file="$work/root.img",if=virtio,format=raw,snapshot=on \
    -virtfs local,path="$work/share",mount_tag=host,security_model=none,id=host \
    -netdev tap,id=n0,ifname=$tap,script=no,downscript=no,vhost=off,queues=2 \
    -device virtio-net-pci,netdev=n0,mq=on,vectors=6 \
    -serial file:"$work/console.log" -monitor none >"$work/qemu.out" 2>&1 &
wait $!
qemu_rc=$?
rm -f "$work/qemu.pid"
stamp "the guest powered off (qemu exit $qemu_rc)"

if [ ! -s "$work/share/guest.log" ]; then
    echo "# no output from the guest; its console:"
    sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\r//g' "$work/console.log" | tail -80 | sed 's/^/# /'
    cat "$work/qemu.out"
    die "the guest did not run the test (qemu exit $qemu_rc)"
fi
sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' "$work/share/guest.log"
passed=$(grep -c '^ok ' "$work/share/guest.log")
failed=$(grep -c '^not ok ' "$work/share/guest.log")
grep -q '^1\.\.[0-9]' "$work/share/guest.log" || {
    failed=$((failed + 1))
    echo "not ok - the guest half ran to its end"
    sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\r//g' "$work/console.log" | tail -40 | sed 's/^/# /'
}
stamp "whole system: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
