# Shared by the live-kernel tests (source it): builds a small initramfs around a guest script and
# boots one of Debian 12's kernels on it under QEMU (TCG), with a 9p share for the guest's results.
#
#   . tests/vm/lib.sh
#   vm_setup                         # assets (cached), a temp dir, cleanup on exit; 77 if no QEMU
#   vm_kernel 6.1                    # optional: boot Debian 12's own 6.1 from now on (default
#                                    # 6.12, or VM_SERIES before vm_setup); no netdevsim on 6.1
#   VM_BINARIES="build/cli/knod-policy ..."  VM_MODULES="netdevsim vgem"  VM_FILES="src:/dest ..."
#   (a VM_BINARIES entry "src:/dest" puts the binary at /dest instead of /usr/bin/NAME)
#   vm_initramfs guest.sh "$VM_TMP/a.cpio"   # guest.sh runs as root in the guest, under dash
#   vm_boot "$VM_TMP/a.cpio" "$VM_TMP/out-a" "extra kernel args" -- extra qemu args...
#   # then: $VM_TMP/out-a/rc (guest.sh's exit status), guest.log, dmesg; console.log (host side)
#
# In the guest: /out is the host's output folder (9p), PATH has real iproute2, ethtool, pciutils,
# kmod, util-linux (setpriv) and dash as /bin/sh (Debian's busybox runs its own `ip` otherwise);
# busybox fills in the rest. User `knoduser` (uid 1000, gid 1000) exists for unprivileged runs.
# /boot/config-KVER is the kernel's config (Debian's kernel has no /proc/config.gz).
# Nothing leaves the machine: QEMU gets no network unless a test adds a NIC with a local backend
# (`-netdev hubport,...` or `user,restrict=on`).

VM_SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

vm_log() { echo "vm: $*" >&2; }

# Exit 77 (ctest's skip) when the machine cannot run the live-kernel tests at all.
vm_require() {
    local t
    for t in qemu-system-x86_64 busybox cpio depmod modprobe dash; do
        if ! PATH=$PATH:/usr/sbin:/sbin command -v "$t" >/dev/null; then
            echo "vm: $t not found: install it with scripts/install-deps.sh (or skip the vm tests: KNOD_SKIP_VM=1)" >&2
            exit 77
        fi
    done
}

# vm_kernel SERIES (6.12 or 6.1): the kernel the next vm_initramfs and vm_boot use (fetched and
# cached by assets.sh); sets VM_ASSETS and VM_KVER.
vm_kernel() {
    VM_ASSETS=$("$VM_SELF_DIR/assets.sh" --series "$1" | tail -1) || {
        echo "vm: the kernel assets ($1) could not be fetched (see above)" >&2
        exit 1
    }
    VM_KVER=$(cat "$VM_ASSETS/KVER")
}

vm_setup() {
    export PATH=$PATH:/usr/sbin:/sbin
    vm_require
    vm_kernel "${VM_SERIES:-6.12}"
    VM_TMP=$(mktemp -d /tmp/knod-vm.XXXXXX)
    VM_PIDS=()
    trap vm_cleanup EXIT
    trap 'exit 130' INT TERM
}

vm_cleanup() {
    local f pid
    for f in "$VM_TMP"/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f" 2>/dev/null) || continue
        [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    done
    [ -n "${KNOD_VM_KEEP:-}" ] && {
        vm_log "kept $VM_TMP (KNOD_VM_KEEP)"
        return
    }
    rm -rf "$VM_TMP"
}

# Copies a host binary and the libraries ldd names into the initramfs root.
vm_copy_binary() {
    local root=$1 src=$2 dest=${3:-}
    [ -n "$dest" ] || dest=/usr/bin/$(basename "$src")
    mkdir -p "$root$(dirname "$dest")"
    # Without debug info: a RelWithDebInfo build is 3x larger, and every MB of initramfs costs
    # boot time under TCG.
    strip --strip-debug -o "$root$dest" "$src" 2>/dev/null || cp -L "$src" "$root$dest"
    local lib
    for lib in $(ldd "$src" 2>/dev/null | grep -o '/[^ ]*'); do
        [ -e "$root$lib" ] && continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
        # A library of the build tree (libknod-client.so.1, found through the binary's RUNPATH)
        # also goes where the loader looks by default: the RUNPATH's folder may be hidden in the
        # guest (a build under /tmp: the guest mounts its own /tmp when it has none to keep).
        case "$lib" in
        /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) ;;
        *)
            mkdir -p "$root/usr/lib/x86_64-linux-gnu"
            cp -L "$lib" "$root/usr/lib/x86_64-linux-gnu/$(basename "$lib")"
            ;;
        esac
    done
    # ldd names what the binary needs, not whether the guest's loader will find it: every
    # library must resolve inside the initramfs, or the guest test would fail to start.
    local missing
    missing=$(ldd "$src" 2>/dev/null | grep 'not found')
    [ -z "$missing" ] || {
        vm_log "$src: libraries not found on the host: $missing"
        return 1
    }
}

# vm_initramfs GUEST_SCRIPT OUT_CPIO: the guest script plus VM_BINARIES, VM_MODULES (names, their
# dependencies follow) and VM_FILES ("host:guest" pairs).
vm_initramfs() {
    local guest=$1 out=$2
    local root
    root=$(mktemp -d "$VM_TMP/initramfs.XXXXXX")
    chmod 755 "$root" # mktemp's 0700 would become the guest's /: knoduser could reach nothing
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,proc,sys,dev,tmp,run,out,etc,boot,root,home/knoduser}
    cp "$(command -v busybox)" "$root/bin/busybox"
    local applet
    for applet in $("$root/bin/busybox" --list); do
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    vm_copy_binary "$root" "$(command -v dash)" /bin/dash
    rm -f "$root/bin/sh"
    ln -s dash "$root/bin/sh"
    local tool
    for tool in ip tc ethtool lspci setpriv kmod; do
        vm_copy_binary "$root" "$(command -v "$tool")"
    done
    for tool in modprobe insmod lsmod rmmod depmod; do ln -sf kmod "$root/usr/bin/$tool"; done
    # The kernel's module autoloading runs /sbin/modprobe; `ip netns` wants /var/run.
    ln -sf ../usr/bin/kmod "$root/sbin/modprobe"
    mkdir -p "$root/var" && ln -sf ../run "$root/var/run"
    [ -d /usr/share/misc ] && mkdir -p "$root/usr/share/misc" &&
        cp -L /usr/share/misc/pci.ids "$root/usr/share/misc/" 2>/dev/null
    local b
    for b in ${VM_BINARIES:-}; do
        case "$b" in
        *:*) vm_copy_binary "$root" "${b%%:*}" "${b#*:}" ;;
        *) vm_copy_binary "$root" "$b" ;;
        esac
    done
    local pair
    for pair in ${VM_FILES:-}; do
        mkdir -p "$root$(dirname "${pair#*:}")"
        cp -rL "${pair%%:*}" "$root${pair#*:}"
    done

    # Modules: the named ones and what they depend on, then depmod so `modprobe NAME` works.
    local mods=/lib/modules/$VM_KVER m f
    mkdir -p "$root$mods"
    cp "$VM_ASSETS/root$mods"/modules.{order,builtin,builtin.modinfo} "$root$mods/" 2>/dev/null
    # virtio_pci: built into 6.12, a module in 6.1 (without it the 9p share has no channel).
    for m in virtio_pci 9pnet_virtio 9p ${VM_MODULES:-}; do
        for f in $(modprobe -d "$VM_ASSETS/root" -S "$VM_KVER" --show-depends "$m" 2>/dev/null |
            awk '$1 == "insmod" {print $2}'); do
            mkdir -p "$root$(dirname "${f#"$VM_ASSETS/root"}")"
            cp "$f" "$root${f#"$VM_ASSETS/root"}"
        done
    done
    depmod -b "$root" "$VM_KVER"
    cp "$VM_ASSETS/config" "$root/boot/config-$VM_KVER"

    printf 'root:x:0:0:root:/root:/bin/sh\nknoduser:x:1000:1000:knod test user:/home/knoduser:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\nknoduser:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
    chown 1000:1000 "$root/home/knoduser"
    cp "$guest" "$root/guest.sh"
    cat >"$root/init" <<'EOF'
#!/bin/sh
export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# A build tree under /tmp (a clone there) was copied in at its own path: a tmpfs over /tmp would
# hide it (its binaries, and the libraries their RUNPATH names). The initramfs is memory already.
if [ -z "$(ls -A /tmp)" ]; then mount -t tmpfs tmpfs /tmp; else chmod 1777 /tmp; fi
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm && mount -t tmpfs tmpfs /dev/shm
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
modprobe virtio_pci && modprobe 9pnet_virtio && modprobe 9p
# The share's virtio channel appears when its PCI device has been probed: poll (up to 60 s).
i=0
until mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 knodout /out 2>/dev/null; do
    i=$((i + 1))
    if [ $i -ge 600 ]; then
        echo "KNOD-VM: cannot mount the results share" >/dev/console
        poweroff -f
    fi
    sleep 0.1
done
ip link set lo up
sh /guest.sh >/out/guest.log 2>&1
echo $? >/out/rc
dmesg >/out/dmesg
sync
poweroff -f
EOF
    chmod 755 "$root/init" "$root/guest.sh"
    (cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$out"
    rm -rf "$root"
}

# vm_boot CPIO OUT_DIR "KERNEL_ARGS" [-- QEMU_ARGS...]: boots, waits for power-off (or
# KNOD_VM_TIMEOUT seconds, default 240), and returns the guest script's exit status (or 124 when
# it timed out, 125 when the guest never reported one). The console is OUT_DIR/console.log.
vm_boot() {
    local cpio=$1 out=$2 kargs=$3
    shift 3
    [ "${1:-}" = -- ] && shift
    mkdir -p "$out"
    chmod 777 "$out"
    local name
    name=$(basename "$out")
    local started
    started=$(date +%s)
    # One host thread for both vCPUs (thread=single): under multi-threaded TCG a vCPU can run a
    # stale translation of code the other vCPU just live-patched (the kernel's int3-based
    # text_poke_bp for static keys), and the guest oopsed in early boot ("Oops: int3" in
    # sched_clock_cpu) in 2 of 5 loaded soak runs. Single-threaded TCG has no such window.
    timeout -k 5 "${KNOD_VM_TIMEOUT:-240}" qemu-system-x86_64 \
        -accel tcg,thread=single -cpu max -smp 2 -m 2G \
        -display none -monitor none -serial "file:$out/console.log" -no-reboot \
        -pidfile "$VM_TMP/$name.pid" \
        -kernel "$VM_ASSETS/vmlinuz" -initrd "$cpio" \
        -append "console=ttyS0 panic=-1 oops=panic loglevel=4 $kargs" \
        -virtfs "local,path=$out,mount_tag=knodout,security_model=none,id=knodout" \
        "$@" </dev/null >"$out/qemu.log" 2>&1
    local qrc=$?
    rm -f "$VM_TMP/$name.pid"
    vm_log "$name: qemu exited $qrc after $(($(date +%s) - started)) s"
    if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then
        vm_log "$name: timed out; console tail:"
        tail -30 "$out/console.log" | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' >&2
        return 124
    fi
    if [ ! -f "$out/rc" ]; then
        vm_log "$name: the guest reported no result; qemu said: $(tail -3 "$out/qemu.log")"
        tail -30 "$out/console.log" | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' >&2
        return 125
    fi
    return "$(cat "$out/rc")"
}

# vm_no_warnings OUT_DIR: fails (and prints them) when the guest's kernel logged a WARNING, an
# Oops or a BUG during the run.
vm_no_warnings() {
    local out=$1
    if grep -nE 'WARNING:|Oops|BUG:|Call Trace' "$out/dmesg" >&2; then
        return 1
    fi
    return 0
}
