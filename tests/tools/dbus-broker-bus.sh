#!/bin/sh
# A private bus run by dbus-broker (scripts/fetch-dbus-broker.sh unpacked it), for tests of a bus
# that sends ProcessFD. Started as dbus-daemon would be for the sandbox: in the foreground, until
# SIGTERM. Nothing on the host changes: in a mount namespace of its own, /usr/bin gets the
# unpacked broker on top (dbus-broker-launch runs /usr/bin/dbus-broker) and /run a writable layer
# in WORK with a journal socket whose records go to WORK/broker.log (the launcher insists on
# journald). The launcher connects to its own bus (DBUS_SYSTEM_BUS_ADDRESS), as under systemd.
#   dbus-broker-bus.sh CONFIG SOCKET WORK
set -eu
config=$1 socket=$2 work=$3
broker=${KNOD_DBUS_BROKER_DIR:-/var/cache/knod-policy/dbus-broker}
[ -x "$broker/usr/bin/dbus-broker-launch" ] ||
    { echo "dbus-broker-bus: no $broker (run scripts/fetch-dbus-broker.sh)" >&2; exit 1; }
mkdir -p "$work/run-upper" "$work/run-work"
exec unshare -m --propagation private /bin/sh -c '
    broker=$1 config=$2 socket=$3 work=$4
    # Without both layers nothing may go on: the /run below is the host one.
    mount -t overlay overlay -o "lowerdir=$broker/usr/bin:/usr/bin" /usr/bin || exit 1
    mount -t overlay overlay -o "lowerdir=/run,upperdir=$work/run-upper,workdir=$work/run-work" \
        /run || exit 1
    mkdir -p /run/systemd/journal || exit 1
    /usr/bin/python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
out = open(sys.argv[2], \"ab\", buffering=0)
while True:
    out.write(s.recv(65536).replace(b\"\\0\", b\" \") + b\"\\n\")
" /run/systemd/journal/socket "$work/broker.log" &
    sink=$!
    while [ ! -S /run/systemd/journal/socket ]; do sleep 0.02; done
    # Listening first under another name: systemd-socket-activate makes the socket 0644, and
    # every user must be able to connect (as to dbus-daemon) by the time SOCKET exists.
    DBUS_SYSTEM_BUS_ADDRESS=unix:path=$socket systemd-socket-activate \
        -E DBUS_SYSTEM_BUS_ADDRESS -l "$work/bus.listening" "$broker/usr/bin/dbus-broker-launch" \
        --scope system --config-file "$config" &
    launcher=$!
    while [ ! -S "$work/bus.listening" ]; do sleep 0.02; done
    chmod 0666 "$work/bus.listening"
    mv "$work/bus.listening" "$socket"
    trap "kill \$launcher \$sink 2>/dev/null" TERM INT
    wait $launcher
    kill $sink 2>/dev/null
' sh "$broker" "$config" "$socket" "$work"
