#!/usr/bin/env bash
# Installs every Debian 12 package knod-policy needs to build, test and run.
# Safe to run again: apt-get skips what is already there.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi
packages=(
  # build
  build-essential cmake ninja-build pkg-config clang llvm clang-format
  # libraries
  libbpf-dev bpftool libxdp-dev xdp-tools
  libnl-3-dev libnl-route-3-dev libnl-genl-3-dev libdrm-dev zlib1g-dev
  libssl-dev libsqlite3-dev libsystemd-dev libcap-dev libaudit-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  # tests and benchmarks
  googletest libgtest-dev libgmock-dev libbenchmark-dev libclang-rt-14-dev
  # the audit report's page, rendered and measured by its test; the Cockpit page, driven in
  # Chromium over the DevTools protocol against cockpit-ws (tests/cockpit)
  chromium python3-pil cockpit-ws cockpit-bridge python3-websocket curl
  # the Python package's tests (tests/python) under /usr/bin/python3, and the article's example
  # with a real tensor (Debian's CPU-only torch 1.13; the main job and python.knod use it)
  python3-pytest python3-numpy python3-torch
  # a caller that speaks D-Bus itself and does not attest its process (issue #32)
  python3-dbus
  # pods under real container runtimes (tests/cni): rootful podman with its CNI backend, the
  # CNI reference plugins, containerd's CRI plugin and the test's own CRI client over gRPC
  podman runc catatonit containernetworking-plugins containerd python3-grpcio python3-grpc-tools
  # running: a private bus, namespaces, the journal by hand
  dbus dbus-daemon iproute2 util-linux sqlite3 procps
  # journal files written from export format (audit verify against the system journal's copies)
  systemd-journal-remote
  # knod-policy metrics against the real parts: promtool, node_exporter's textfile collector,
  # a Prometheus that scrapes it (tests/cli/metrics_test.sh)
  prometheus prometheus-node-exporter
  # packaging and its test: the Debian package, its lint, polkit, the unit checks
  debhelper dh-python dpkg-dev lintian polkitd systemd man-db bash-completion git
  # live-kernel and whole-system tests (tests/vm): QEMU, a kernel's modules, an initramfs, a
  # Debian root filesystem
  qemu-system-x86 mmdebstrap busybox-static cpio kmod pciutils ethtool e2fsprogs
)
export DEBIAN_FRONTEND=noninteractive
stamp=/var/lib/apt/periodic/update-success-stamp
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
  echo "install-deps: apt-get update" >&2
  apt-get update -qq
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Tests start their own Prometheus and node_exporter on ports of their own: the packages' system
# services must not hold 9090/9100 (or anything) here. Idempotent; offline without systemd.
for unit in prometheus prometheus-node-exporter; do
  [ -e "/lib/systemd/system/$unit.service" ] || continue
  if [ -d /run/systemd/system ]; then
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
  else
    systemctl disable "$unit" >/dev/null 2>&1 || true
    # Started by invoke-rc.d through its init script where no policy-rc.d forbade it.
    [ -x "/etc/init.d/$unit" ] && "/etc/init.d/$unit" stop >/dev/null 2>&1 || true
  fi
done
# dbus-broker 37 from bookworm-backports, unpacked under /var/cache/knod-policy (not installed),
# for the tests of a bus that sends each caller's pidfd (issue #32).
bash "$(dirname "$0")/fetch-dbus-broker.sh"
echo "install-deps: all packages present" >&2
