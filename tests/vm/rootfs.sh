#!/usr/bin/env bash
# Builds (once) the Debian 12 root filesystem the whole-system test boots: systemd as PID 1, the
# system bus, polkitd, and the libraries the project's .deb depends on, so that installing the
# .deb later needs no network. The tree is cached outside the repository, keyed by a hash of the
# package list, the kernel version and this script's version; a second run only prints it.
#
# Usage: rootfs.sh KERNEL_CACHE_DIR [DEB]
#   KERNEL_CACHE_DIR: what tests/vm/assets.sh printed (its modules are copied in, depmod run).
#   DEB: the project's .deb; the packages in its Depends join the list.
#   Prints the rootfs directory on its last line.
# Environment: KNOD_VM_CACHE (default /var/cache/knod-vm).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
script_version=2

kdir=${1:?usage: rootfs.sh KERNEL_CACHE_DIR [DEB]}
deb=${2:-}
kver=$(cat "$kdir/KVER")
say() { echo "rootfs: $*" >&2; }
die() {
    say "$*"
    exit 1
}
command -v mmdebstrap >/dev/null || die "mmdebstrap not found (scripts/install-deps.sh installs it)"

packages=(systemd systemd-sysv dbus dbus-user-session polkitd pkexec iproute2 udev kmod procps util-linux
    # systemd-journal-upload and -remote: chain heads leave the node (#35); off until the test
    # configures them.
    systemd-journal-remote
    # The daemon's libraries (what its Depends names today); a .deb given adds its own.
    libc6 libgcc-s1 libstdc++6 libbpf1 libdrm-amdgpu1 libdrm2 libelf1 libnl-3-200 libnl-genl-3-200 libnl-route-3-200
    libsqlite3-0 libssl3 libsystemd0 libtomlplusplus3 libxdp1 libaudit1 libcap2 zlib1g)
if [ -n "$deb" ]; then
    # "a (>= 1), b | c" -> a b (the first of each alternative).
    while read -r p; do [ -n "$p" ] && packages+=("$p"); done < <(dpkg-deb -f "$deb" Depends |
        tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/[[:space:]]//g')
fi
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
key=$( (
    echo "v$script_version $kver"
    printf '%s\n' "${packages[@]}"
) | sha256sum | cut -c1-16)
cache_root=${KNOD_VM_CACHE:-/var/cache/knod-vm}
dir=$cache_root/rootfs-$key
if [ -f "$dir/.complete" ]; then
    say "cached in $dir"
    echo "$dir"
    exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.rootfs.lock"
flock -w 900 9 || die "another build holds $cache_root/.rootfs.lock for over 15 minutes"
if [ -f "$dir/.complete" ]; then
    echo "$dir"
    exit 0
fi
started=$(date +%s)
tmp=$(mktemp -d "$cache_root/.rootfs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "building a bookworm rootfs with: ${packages[*]}"
# A fixed machine-id: without one every boot is a first boot (presets, slower).
# The serial console logs in nobody; root has no password (the image never leaves the cache
# and boots with no network reaching out).
timeout 900 mmdebstrap --variant=apt --include="$(
    IFS=,
    echo "${packages[*]}"
)" \
    --customize-hook='chroot "$1" systemd-machine-id-setup' \
    --customize-hook='echo knod-vm >"$1/etc/hostname"' \
    --customize-hook='chroot "$1" apt-get clean' \
    --customize-hook='chroot "$1" systemctl disable systemd-journal-upload.service systemd-journal-remote.socket' \
    bookworm "$tmp/root" >"$tmp/build.log" 2>&1 || {
    tail -20 "$tmp/build.log" >&2
    die "mmdebstrap failed or took over 15 minutes (log above)"
}
cp -a "$kdir/root/lib/modules" "$tmp/root/lib/"
depmod -b "$tmp/root" "$kver"
cp "$kdir/config" "$tmp/root/boot/config-$kver"
touch "$tmp/root/.complete"
rm -rf "$dir"
mv "$tmp/root" "$dir"
say "built $dir ($(du -sh "$dir" | cut -f1)) in $(($(date +%s) - started)) s"
echo "$dir"
