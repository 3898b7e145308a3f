#!/usr/bin/env bash
# Installs the Debian 12 packages knod-policy needs. Safe to run again: apt-get skips what is
# already there.
#
#   scripts/install-deps.sh [--for main|test]
#
# --for main: what the main job (scripts/main-job.sh) builds and runs: the compiler and the
#   libraries of the daemon, the CLI, the client library and the C++ example (CMake preset
#   `main`: no test suite, so no GoogleTest), the private bus, ip, setpriv, sqlite3, and Python
#   with Debian's torch for examples/receive.py.
# --for test (the default, so callers that name nothing get everything): the main job's
#   packages and the whole test rig (scripts/run-tests.sh): GoogleTest, Chromium and Cockpit,
#   podman and containerd, Prometheus, the Debian packaging tools, QEMU and mmdebstrap, ...; and
#   the test-only steps at the end (Prometheus's own services off, dbus-broker 37 unpacked).
# What each set costs on a fresh machine: docs/testing.md#what-the-commands-install.
set -euo pipefail
set_name='test'
while [ $# -gt 0 ]; do
  case "$1" in
  --for) set_name=${2:-}; shift 2 || shift ;;
  --for=*) set_name=${1#--for=}; shift ;;
  *) echo "install-deps: unknown argument $1 (usage: install-deps.sh [--for main|test])" >&2; exit 2 ;;
  esac
done
case "$set_name" in
main | test) ;;
*) echo "install-deps: --for takes main or test, not '$set_name'" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi
# The main job: what it builds and what it runs, nothing else. Each package here is needed by a
# step of scripts/main-job.sh (or scripts/knod-sandbox.sh, which it runs).
main_packages=(
  # build: gcc and make, CMake with Ninja; clang compiles the BPF programs (-target bpf; its
  # own backend: no llvm tools needed) and bpftool makes their skeletons (cmake/bpf.cmake)
  build-essential cmake ninja-build pkg-config clang bpftool
  # the libraries of the daemon, the CLI, the client library and the example
  libbpf-dev libxdp-dev
  libnl-3-dev libnl-route-3-dev libnl-genl-3-dev libdrm-dev zlib1g-dev
  libssl-dev libsqlite3-dev libsystemd-dev libaudit-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  # systemd: systemd.pc, whose directories packaging/ installs to (read at configure time),
  # and busctl, with which scripts/knod-sandbox.sh waits for the daemon
  systemd
  # running: the private bus (dbus-daemon), the sim's veth and namespace (ip), the second user
  # (setpriv, util-linux), the journal trail by hand (sqlite3)
  dbus-daemon iproute2 util-linux sqlite3
  # examples/receive.py, the article's example in Python with a real tensor: Debian's CPU-only
  # torch 1.13 (the largest part of this list: docs/testing.md says how large; without torch
  # the example falls back to a numpy array, but the article's example is a tensor)
  python3 python3-numpy python3-torch
)
# The test command: everything above, and these. Only tests, benches and the packaging use them.
test_packages=(
  # the test suite and the benches: GoogleTest and Google Benchmark, the sanitizer and fuzzer
  # runtimes (scripts/sanitize.sh, tests/fuzz), clang-format (tests/format_check.sh), and
  # llvm's tools, which the build itself does not call
  googletest libgtest-dev libgmock-dev libbenchmark-dev libclang-rt-14-dev llvm clang-format
  # xdp-filter's object, the filter bench's baseline (bench/filter_bench.cc)
  xdp-tools
  # callgrind: the control plane's instructions per pair, guarded by bench.control_instructions
  # (bench/control_profile.sh --check; without valgrind that test skips)
  valgrind
  # no target links libcap today; kept with the test rig as it always was
  libcap-dev
  # the audit report's page, rendered and measured by its test; the Cockpit page, driven in
  # Chromium over the DevTools protocol against cockpit-ws (tests/cockpit)
  chromium python3-pil cockpit-ws cockpit-bridge python3-websocket curl
  # the Python package's tests (tests/python) under /usr/bin/python3 (python.knod also runs
  # the torch example, from the main set)
  python3-pytest
  # a caller that speaks D-Bus itself and does not attest its process (issue #32)
  python3-dbus
  # pods under real container runtimes (tests/cni): rootful podman with its CNI backend, the
  # CNI reference plugins, containerd's CRI plugin and the test's own CRI client over gRPC
  podman runc catatonit containernetworking-plugins containerd python3-grpcio python3-grpc-tools
  # the system bus's package (the main job runs dbus-daemon on a bus of its own); procps for the
  # tests that look processes up (ps, pgrep)
  dbus procps
  # journal files written from export format (audit verify against the system journal's copies)
  systemd-journal-remote
  # knod-policy metrics against the real parts: promtool, node_exporter's textfile collector,
  # a Prometheus that scrapes it (tests/cli/metrics_test.sh)
  prometheus prometheus-node-exporter
  # packaging and its test: the Debian package, its lint, polkit, the unit checks
  debhelper dh-python dpkg-dev lintian polkitd man-db bash-completion git
  # live-kernel and whole-system tests (tests/vm): QEMU, a kernel's modules, an initramfs, a
  # Debian root filesystem
  qemu-system-x86 mmdebstrap busybox-static cpio kmod pciutils ethtool e2fsprogs
)
packages=("${main_packages[@]}")
if [ "$set_name" = test ]; then
  packages+=("${test_packages[@]}")
fi
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
  echo "install-deps ($set_name): installing ${missing[*]}" >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$set_name" = main ]; then
  echo "install-deps: the main job's packages are present" >&2
  exit 0
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
