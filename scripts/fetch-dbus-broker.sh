#!/usr/bin/env bash
# dbus-broker 37 from Debian's bookworm-backports, unpacked (not installed) into
# /var/cache/knod-policy/dbus-broker, for the tests that run knod-policyd on a bus that sends
# each caller's pidfd (ProcessFD: dbus-broker >= 34; bookworm's own dbus-broker is 33). Nothing
# on the host changes: the package is not installed and the host's apt sources stay as they are.
# Safe to run again: does nothing when the unpacked broker is there.
#   scripts/fetch-dbus-broker.sh [DIR]   (default /var/cache/knod-policy/dbus-broker)
set -euo pipefail
dest=${1:-/var/cache/knod-policy/dbus-broker}
if [ -x "$dest/usr/bin/dbus-broker-launch" ]; then exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "fetch-dbus-broker: run as root (apt-get)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main" \
    >"$tmp/sources.list"
opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
      -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "APT::Get::List-Cleanup=0"
      -o "APT::Sandbox::User=root")
echo "fetch-dbus-broker: bookworm-backports' package lists" >&2
apt-get "${opts[@]}" update -qq
(cd "$tmp" && apt-get "${opts[@]}" download -qq dbus-broker/bookworm-backports)
deb=$(ls "$tmp"/dbus-broker_*.deb)
mkdir -p "$dest"
dpkg -x "$deb" "$dest"
"$dest/usr/bin/dbus-broker-launch" --version | head -1 >&2
