#!/usr/bin/env bash
# Runs knod-policyd on a private bus, as on a host but touching nothing of the host's:
# a private dbus-daemon whose configuration includes the project's bus policy from
# packaging/dbus/, the daemon with the sim driver and a temporary state dir. It runs COMMAND with
# DBUS_SYSTEM_BUS_ADDRESS pointing at that bus, then stops both and removes what it made.
#
#   scripts/knod-sandbox.sh [--policy FILE] [--build DIR] [--keep-state DIR] [--unique-sim]
#                           [--bus-stats] [--pod-socket] [--daemon-arg ARG]... -- COMMAND [ARGS...]
#
# --pod-socket serves the pod socket (knod-policyd --pod-socket) as the packaged unit does, in a
# directory of the sandbox's own: $KNOD_POD_SOCKET_DIR/pod.sock (the directory is what a pod
# mounts at /run/knod-policy).
#
# --bus-stats lets root call dbus-daemon's org.freedesktop.DBus.Debug.Stats (the bench reads the
# daemon's match rules there); the system bus's policy, copied here otherwise, refuses it.
#
# --unique-sim gives the sim network names of this run's own (netdev, wire namespace, BPF pin
# root), so tests that run at once never meet on the default knodsim0 (the daemon refuses a sim
# netdev another daemon serves). Inside COMMAND: $KNOD_SANDBOX (the work dir), $KNOD_STATE_DIR,
# $KNOD_DAEMON_PID, $KNOD_BUS_PID (the private dbus-daemon), and the sim's names as the daemon has them: $KNOD_SIM_NETDEV, $KNOD_SIM_NETNS.
set -euo pipefail
. "$(dirname "$0")/wait-lib.sh"
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
policy=$repo/packaging/policy.example.toml
state=
unique_sim=
bus_stats=
pod_socket=
daemon_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --policy) policy=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep-state) state=$2; shift 2 ;;
    --daemon-arg) daemon_args+=("$2"); shift 2 ;;
    --unique-sim) unique_sim=1; shift ;;
    --bus-stats) bus_stats=1; shift ;;
    --pod-socket) pod_socket=1; shift ;;
    --) shift; break ;;
    *) echo "knod-sandbox: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "knod-sandbox: no COMMAND given" >&2; exit 2; }

work=$(mktemp -d /tmp/knod-sandbox.XXXXXX)
chmod 755 "$work" # other uids must reach the bus socket
[ -n "$state" ] || state=$work/state
bus_pid= daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    [ -n "$bus_pid" ] && kill -TERM "$bus_pid" 2>/dev/null && wait "$bus_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# The packaged bus policy names the knod-policy account, which only the package makes: where it
# does not exist, the sandbox's copy leaves that block out (the daemon runs as root here).
policy_conf=$repo/packaging/dbus/org.knod.Policy1.conf
if ! getent passwd knod-policy >/dev/null; then
    sed '/<policy user="knod-policy">/,/<\/policy>/d' "$policy_conf" >"$work/org.knod.Policy1.conf"
    policy_conf=$work/org.knod.Policy1.conf
fi
sed -e "s|@SOCKET@|$work/bus|" -e "s|@POLICY_CONF@|$policy_conf|" \
    "$repo/scripts/private-bus.conf.in" > "$work/bus.conf"
if [ -n "$bus_stats" ]; then
    sed -i 's|</busconfig>|  <policy user="root"><allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Debug.Stats"/></policy>\n</busconfig>|' "$work/bus.conf"
fi
# Its notes go to a log beside the bus, not into the session a person follows.
dbus-daemon --config-file="$work/bus.conf" --nofork --print-address=3 3>"$work/address" \
    2>"$work/bus.log" &
bus_pid=$!
wait_until 60 "dbus-daemon to print its address" test -s "$work/address" || true
[ -s "$work/address" ] || { cat "$work/bus.log" >&2; echo "knod-sandbox: dbus-daemon did not start" >&2; exit 1; }
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/bus

# The sim unless --daemon-arg picks a driver (auto could find real hardware here).
case " ${daemon_args[*]-} " in *" --driver"*) ;; *) daemon_args+=(--driver=sim) ;; esac
if [ -n "$unique_sim" ]; then
    n=$(($$ % 100000))
    daemon_args+=("--sim-netdev=knodsimx$n" "--sim-netns=knod-simx$n"
        "--bpf-pin-root=/sys/fs/bpf/knodx$n")
fi
KNOD_SIM_NETDEV=knodsim0 KNOD_SIM_NETNS=knod-sim
for a in "${daemon_args[@]}"; do
    case "$a" in
    --sim-netdev=*) KNOD_SIM_NETDEV=${a#--sim-netdev=} ;;
    --sim-netns=*) KNOD_SIM_NETNS=${a#--sim-netns=} ;;
    esac
done
export KNOD_SIM_NETDEV KNOD_SIM_NETNS
# knod-cni's spool (issue 52) is the sandbox's own, never the host's /run/knod-cni.
KNOD_CNI_SPOOL=$work/cni-spool
KNOD_POD_SOCKET_DIR=
if [ -n "$pod_socket" ]; then
    KNOD_POD_SOCKET_DIR=$work/knod-policy
    mkdir -m 755 "$KNOD_POD_SOCKET_DIR"
    daemon_args+=("--pod-socket=$KNOD_POD_SOCKET_DIR/pod.sock")
fi
"$build/daemon/knod-policyd" --bus-address="$DBUS_SYSTEM_BUS_ADDRESS" --policy "$policy" \
    --state-dir "$state" --cni-spool="$KNOD_CNI_SPOOL" "${daemon_args[@]}" 2>"$work/daemon.log" &
daemon_pid=$!
# Ready means the daemon itself answers: it owns its name before it builds the sim network and
# the BPF filter (calls queue until then), so the bus knowing the name proves nothing yet.
# A Peer.Ping is answered by the daemon's loop, after all of that.
answers() {
    kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
    busctl --address="$DBUS_SYSTEM_BUS_ADDRESS" --timeout=1 call org.knod.Policy1 \
        /org/knod/Policy1 org.freedesktop.DBus.Peer Ping >/dev/null 2>&1
}
up=
wait_until 120 "knod-policyd to answer a Ping" answers && up=1
[ -n "$up" ] || { cat "$work/daemon.log" >&2; echo "knod-sandbox: knod-policyd never answered a Ping" >&2; exit 1; }
export KNOD_SANDBOX=$work KNOD_STATE_DIR=$state KNOD_DAEMON_PID=$daemon_pid KNOD_BUS_PID=$bus_pid \
    KNOD_CNI_SPOOL KNOD_POD_SOCKET_DIR
set +e
"$@"
rc=$?
set -e
exit $rc
