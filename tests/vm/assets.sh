#!/usr/bin/env bash
# Fetches what the live-kernel tests boot: one of Debian 12's kernels (vmlinuz, modules, config).
#   6.12 (the default): Debian's newest 6.12 (bookworm-security), plus an out-of-tree netdevsim
#        built from Debian's linux-source against the matching headers (vm.devmem, vm.host_checks
#        and vm.whole_system need it).
#   6.1: Debian 12's own kernel series (linux-image-6.1.0-N-amd64-unsigned; the newest in apt,
#        bookworm or bookworm-security), kernel and modules only: no netdevsim (its only user,
#        vm.sim, runs the sim driver on veth; building it would cost a 130 MB linux-source-6.1).
# Nothing is installed: the packages are unpacked into a cache keyed by kernel version, outside
# the repository. A second run with a complete cache prints where it is and does nothing else.
#
# Usage: assets.sh [--print-dir] [--series 6.12|6.1]
#   Prints the cache directory of the kernel on its last line (with --print-dir: only that).
# Environment:
#   KNOD_VM_CACHE      cache root (default /var/cache/knod-vm)
#   KNOD_VM_KERNEL     a 6.12 kernel version such as 6.12.117+deb12-amd64 (default: the newest in apt)
#   KNOD_VM_KERNEL_61  a 6.1 kernel version such as 6.1.0-57-amd64 (default: the newest in apt)
#
# The cache directory holds: vmlinuz, config, root/ (the unpacked packages: lib/modules/KVER,
# for 6.12 with netdevsim.ko under extra/ and depmod run), KVER (the version), NETDEVSIM (only
# where netdevsim was built), and .complete.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

print_dir_only=no
series=6.12
while [ $# -gt 0 ]; do
    case "$1" in
    --print-dir) print_dir_only=yes ;;
    --series)
        series=${2:-}
        shift
        ;;
    *)
        echo "usage: assets.sh [--print-dir] [--series 6.12|6.1]" >&2
        exit 2
        ;;
    esac
    shift
done
case "$series" in
6.12 | 6.1) ;;
*)
    echo "assets: --series takes 6.12 or 6.1, not '$series'" >&2
    exit 2
    ;;
esac
say() { [ "$print_dir_only" = yes ] || echo "assets: $*" >&2; }
die() {
    echo "assets: $*" >&2
    exit 1
}

cache_root=${KNOD_VM_CACHE:-/var/cache/knod-vm}
started=$(date +%s)

# The newest 6.12 kernel whose headers and kbuild are also in apt (netdevsim builds against them).
resolve_kernel() {
    local v base
    for v in $(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' |
        awk '{print $1}' | sed -e 's/^linux-image-//' -e 's/-unsigned$//' | sort -rV); do
        base=${v%-amd64}
        if apt-cache show "linux-headers-$v" "linux-headers-$base-common" "linux-kbuild-$base" \
            >/dev/null 2>&1; then
            echo "$v"
            return 0
        fi
    done
    return 1
}

# Debian 12's own series: the newest linux-image-6.1.0-N-amd64-unsigned (ABI number N).
resolve_kernel_61() {
    apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$' |
        awk '{print $1}' | sed -e 's/^linux-image-//' -e 's/-unsigned$//' | sort -rV | head -1 |
        grep .
}

if [ "$series" = 6.12 ]; then
    kver=${KNOD_VM_KERNEL:-}
    if [ -z "$kver" ]; then
        kver=$(resolve_kernel) ||
            die "no linux-image-6.12.*+deb12-amd64-unsigned with matching headers in apt; run 'apt-get update' (bookworm-security must be in sources.list)"
    fi
else
    kver=${KNOD_VM_KERNEL_61:-}
    if [ -z "$kver" ]; then
        kver=$(resolve_kernel_61) ||
            die "no linux-image-6.1.0-*-amd64-unsigned in apt; run 'apt-get update'"
    fi
fi
case "$kver" in
*[!A-Za-z0-9.+_-]* | "") die "kernel version '$kver' is not a version" ;;
esac
base=${kver%-amd64}
dir=$cache_root/$kver

if [ -f "$dir/.complete" ]; then
    say "kernel $kver cached in $dir"
    echo "$dir"
    exit 0
fi

command -v apt-get >/dev/null || die "apt-get not found: the assets come from Debian's archive"
mkdir -p "$cache_root"
# One fetch at a time per cache root: two test runs may start together.
exec 9>"$cache_root/.lock"
flock -w 900 9 || die "another fetch holds $cache_root/.lock for over 15 minutes"
if [ -f "$dir/.complete" ]; then
    echo "$dir"
    exit 0
fi

tmp=$(mktemp -d "$cache_root/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt-get download runs as _apt where it can
packages=("linux-image-$kver-unsigned")
if [ "$series" = 6.12 ]; then
    packages+=(
        "linux-headers-$kver"
        "linux-headers-$base-common"
        "linux-kbuild-$base"
        "linux-source-6.12"
    )
fi
say "fetching ${packages[*]}"
(cd "$tmp" && timeout 900 apt-get download -q "${packages[@]}") >"$tmp/download.log" 2>&1 || {
    tail -5 "$tmp/download.log" >&2
    die "apt-get download failed or took over 15 minutes (network, or a version dropped from bookworm-security: run 'apt-get update')"
}
say "fetched $(du -sh "$tmp" | cut -f1) in $(($(date +%s) - started)) s"

mkdir -p "$tmp/root"
for deb in "$tmp"/*.deb; do
    case "$deb" in
    *linux-source-6.12_*)
        src_version=$(dpkg-deb -f "$deb" Version)
        dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" ./usr/src/linux-source-6.12.tar.xz
        ;;
    *) dpkg-deb -x "$deb" "$tmp/root" ;;
    esac
done
image_version=$(dpkg-deb -f "$tmp"/linux-image-"$kver"-unsigned_*.deb Version)
moddir=$tmp/root/lib/modules/$kver
mkdir -p "$tmp/out"
if [ "$series" = 6.12 ]; then
    [ "${src_version%%-*}" = "${image_version%%-*}" ] ||
        die "linux-source-6.12 is $src_version but the kernel is $image_version: run 'apt-get update' or set KNOD_VM_KERNEL"

    # netdevsim: only its folder of the source tree, built against the unpacked headers.
    say "building netdevsim for $kver"
    tar -xJf "$tmp/usr/src/linux-source-6.12.tar.xz" -C "$tmp" linux-source-6.12/drivers/net/netdevsim
    headers=$tmp/root/usr/src/linux-headers-$kver
    # The headers' Makefile includes the -common tree by its installed (absolute) path.
    sed -i "s|/usr/src/linux-headers-$base-common|$tmp/root/usr/src/linux-headers-$base-common|g" \
        "$headers/Makefile"
    make -s -C "$headers" M="$tmp/linux-source-6.12/drivers/net/netdevsim" CONFIG_NETDEVSIM=m \
        CONFIG_DEBUG_INFO_BTF_MODULES= -j"$(nproc)" modules >"$tmp/netdevsim.log" 2>&1 || {
        tail -20 "$tmp/netdevsim.log" >&2
        die "netdevsim did not build against linux-headers-$kver (log above)"
    }
    mkdir -p "$moddir/extra"
    cp "$tmp/linux-source-6.12/drivers/net/netdevsim/netdevsim.ko" "$moddir/extra/"
    touch "$tmp/out/NETDEVSIM"
fi
depmod -b "$tmp/root" "$kver"

# Only what a boot needs stays: the kernel, its config, the modules.
mv "$tmp/root/boot/vmlinuz-$kver" "$tmp/out/vmlinuz"
mv "$tmp/root/boot/config-$kver" "$tmp/out/config"
mkdir -p "$tmp/out/root/lib/modules"
mv "$moddir" "$tmp/out/root/lib/modules/"
echo "$kver" >"$tmp/out/KVER"
touch "$tmp/out/.complete"
rm -rf "$dir"
mv "$tmp/out" "$dir"
say "kernel $kver ready in $dir ($(du -sh "$dir" | cut -f1), $(($(date +%s) - started)) s)"
echo "$dir"
