#!/usr/bin/env bash
# knod-cni under a real container runtime (issue #34): rootful podman 4.3 with its CNI backend
# runs containers from a local root filesystem (--rootfs, offline) on two networks whose
# conflists chain knod-cni after the bridge plugin, one network per Kubernetes-style namespace
# (the plugin's "namespace" option: podman passes no K8S_POD_NAMESPACE). Inside, the Python SDK
# asks knod-policyd for a binding, as uid 0 and as another uid, over the pod socket: only its
# directory is mounted in (at /run/knod-policy, read-only, as docs/kubernetes.md says), never a
# bus, and the SDK finds it with no address given. Run inside
# scripts/knod-sandbox.sh --unique-sim --pod-socket --policy tests/cni/policy.toml.
# Usage: podman_test.sh KNOD_CNI KNOD_POLICY SOURCE_DIR BUILD_DIR
#
# podman's settings here are this machine's (no systemd as PID 1, hybrid cgroups, a limited
# RLIMIT_NOFILE): runc, cgroupfs, a file for events, explicit ulimits; ../shared/cluster-rig.md.
set -u
cni=$(readlink -f "$1") cli=$(readlink -f "$2") src=$(readlink -f "$3") build=$(readlink -f "$4")
. "$src/scripts/wait-lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (rootful podman)"; exit 77; }
[ -n "${KNOD_POD_SOCKET_DIR:-}" ] || { echo "not ok - run me inside scripts/knod-sandbox.sh --pod-socket"; exit 1; }
for need in podman runc /usr/lib/cni/bridge /usr/lib/cni/host-local; do
    command -v "$need" >/dev/null || [ -x "$need" ] ||
        { echo "SKIP: $need missing (scripts/install-deps.sh installs podman, runc, containernetworking-plugins)"; exit 77; }
done
work=$KNOD_SANDBOX/podman
mkdir -p "$work"
chmod 755 "$work"
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
tag=$(($$ % 100000))
net_a=knoda$tag net_b=knodb$tag
bridge_a=kbra$tag bridge_b=kbrb$tag
# Container A has a name as podman users give them (issue 52: upper case and '_' are no DNS
# label, and podman passes the name as K8S_POD_NAME): it must still be that pod.
ctr_a=Knod_PodA_$tag ctr_b=knod-pb-$tag
outside=
podman_() {
    podman --root "$work/storage" --runroot "$work/run" --tmpdir "$work/tmp" --storage-driver vfs "$@"
}
cleanup() {
    [ -n "$outside" ] && kill "$outside" 2>/dev/null
    podman_ rm -f -t 0 "$ctr_a" "$ctr_b" "$ctr_a-x" >/dev/null 2>&1
    ip link del "$bridge_a" 2>/dev/null
    ip link del "$bridge_b" 2>/dev/null
    # What podman mounted under its dirs (a container's shm), if rm left any.
    findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
}
trap cleanup EXIT

# --- the runtime's configuration: everything of this run's own ---------------------------------
mkdir -p "$work/net.d" "$work/cni-bin" "$work/ipam" "$work/out" "$work/tmp"
chmod 1777 "$work/out"
# knod-cni behind a wrapper that names this sandbox's bus and records each call. podman tears a
# container's network down either in `podman stop` or in the cleanup conmon's exit command runs
# (`podman container cleanup`), whichever comes first, and conmon passes on only a few variables:
# from there the plugin would look for the daemon on the default system bus, not this sandbox's,
# and the DEL would end nothing (it did, one run in six). On a node the daemon is on the default
# bus, where both paths find it.
cat >"$work/cni-bin/knod-cni" <<EOF
#!/bin/bash
export DBUS_SYSTEM_BUS_ADDRESS='$DBUS_SYSTEM_BUS_ADDRESS'
"$cni" "\$@"
rc=\$?
echo "\$CNI_COMMAND \$CNI_CONTAINERID rc=\$rc" >>"$work/cni-calls.log"
exit \$rc
EOF
chmod 755 "$work/cni-bin/knod-cni"
for plugin in bridge host-local loopback; do ln -s "/usr/lib/cni/$plugin" "$work/cni-bin/$plugin"; done
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
log_driver = "k8s-file"
[network]
network_backend = "cni"
cni_plugin_dirs = ["$work/cni-bin"]
network_config_dir = "$work/net.d"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$work/events.log"
EOF
export CONTAINERS_CONF=$work/containers.conf
# conflist NAME BRIDGE SUBNET K8S_NAMESPACE: the pod network, then knod-cni chained after it.
conflist() {
    cat >"$work/net.d/$1.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "$1", "plugins": [
  {"type": "bridge", "bridge": "$2", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$work/ipam", "ranges": [[{"subnet": "$3"}]]}},
  {"type": "knod-cni", "namespace": "$4"}]}
EOF
}
octet=$((tag % 200 + 20))
conflist "$net_a" "$bridge_a" "10.$octet.1.0/24" team-a
conflist "$net_b" "$bridge_b" "10.$octet.2.0/24" team-b

# A root filesystem from the host's /usr (read-only) and a copy of the few files of /etc a
# program needs; the source and build trees mounted read-only at their own paths.
rootfs=$work/rootfs
mkdir -p "$rootfs"/{usr,etc,proc,sys,dev,tmp,run,var/tmp}
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$rootfs/$l"; done
# A useradd or ldconfig beside the copy renames a new file over one cp is reading:
# copy_beside_renames (scripts/wait-lib.sh) makes the copy again then.
copy_beside_renames "$work/etc-copy.err" "$rootfs/etc/" /etc/ld.so.cache /etc/ld.so.conf /etc/ld.so.conf.d \
    /etc/passwd /etc/group /etc/nsswitch.conf || { echo "podman test: cannot copy /etc's files" >&2; exit 1; }
bus=${DBUS_SYSTEM_BUS_ADDRESS#unix:path=}
# The pod socket's directory, and no bus: neither the node's system bus nor this sandbox's.
mounts=(-v /usr:/usr:ro -v "$src:$src:ro" -v "$work/out:/out" -v "$KNOD_POD_SOCKET_DIR:/run/knod-policy:ro")
case "$build/" in "$src"/*) ;; *) mounts+=(-v "$build:$build:ro") ;; esac
env_in=(-e "PYTHONPATH=$src/python"
        -e "KNOD_CLIENT_LIBRARY=$build/client/libknod-client.so.1" -e PYTHONDONTWRITEBYTECODE=1)
flow() { echo "udp 10.99.0.1:* -> 10.99.0.2:$1"; }
holder=(/usr/bin/python3 "$src/tests/cni/pod_holder.py")
journal() { sqlite3 "$KNOD_STATE_DIR/journal.db" "$1"; }

# --- a container on team-a's network: uid 0 and another uid are granted ------------------------
podman_ run -d --name "$ctr_a" --network "$net_a" "${mounts[@]}" "${env_in[@]}" --rootfs "$rootfs" \
    "${holder[@]}" /out/a-root "$KNOD_SIM_NETDEV" sim0 "$(flow 5200)" >"$work/run-a" 2>&1 ||
    { not_ok "podman run on $net_a failed"; cat "$work/run-a"; exit 1; }
# settled FILE CONTAINER: the holder wrote its verdict, or its container is no longer running.
settled() { grep -qs "^ok \|^error" "$1" || [ "$(podman_ inspect -f '{{.State.Running}}' "$2" 2>/dev/null)" != true ]; }
wait_until 60 "the container's root holder" settled "$work/out/a-root" "$ctr_a"
if ! grep -qs "^ok .* team-a-pods$" "$work/out/a-root"; then
    not_ok "uid 0 in the container: $(cat "$work/out/a-root" 2>&1)"
    podman_ logs "$ctr_a" 2>&1 | tail -20
    exit 1 # every check below needs this container and its binding
fi
ok "uid 0 in a podman container on team-a's network is granted by the namespace rule"
id_root=$(awk '/^ok /{print $2}' "$work/out/a-root")
podman_ exec -d --user 65534:65534 "$ctr_a" "${holder[@]}" /out/a-nobody "$KNOD_SIM_NETDEV" sim0 "$(flow 5201)" >/dev/null
wait_until 60 "the container's nobody holder" settled "$work/out/a-nobody" "$ctr_a"
grep -q "^ok .* team-a-pods$" "$work/out/a-nobody" &&
    ok "uid 65534 in the same container is granted too" || not_ok "container nobody: $(cat "$work/out/a-nobody")"
id_nobody=$(awk '/^ok /{print $2}' "$work/out/a-nobody")
journal "select detail from events where kind='request-granted' and session_id='$id_root'" >"$work/grant"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pod"]["namespace"]=="team-a" and d["pod"]["name"]==sys.argv[2], d' \
    "$work/grant" "$ctr_a" && ok "the grant event names the pod: the network's namespace, the container's name" ||
    not_ok "grant detail: $(cat "$work/grant")"
"$cli" bindings --json >"$work/list"
python3 -c '
import json, sys
by_id = {b["id"]: b for b in json.load(open(sys.argv[1]))}
a, b = by_id[sys.argv[2]], by_id[sys.argv[3]]
assert a["uid"] == 0 and b["uid"] == 65534, (a, b)
assert a["pod"]["name"] == b["pod"]["name"] == sys.argv[4], (a, b)' "$work/list" "$id_root" "$id_nobody" "$ctr_a" &&
    ok "bindings shows both, with their uids and the pod" || { not_ok "bindings"; cat "$work/list"; }

# --- the container reaches the daemon through the pod socket, and no bus at all ----------------
podman_ exec "$ctr_a" sh -c 'test -S /run/knod-policy/pod.sock && test ! -e /run/dbus/system_bus_socket &&
    test ! -e "$1" && test -z "${DBUS_SYSTEM_BUS_ADDRESS:-}"' _ "$bus" &&
    ok "the container has the pod socket, and no system bus socket (the node's or the sandbox's)" ||
    not_ok "the container's view: $(podman_ exec "$ctr_a" ls -la /run /run/knod-policy 2>&1)"
podman_ exec "$ctr_a" /usr/bin/python3 -c '
import socket, sys
for path in ("/run/dbus/system_bus_socket", sys.argv[1]):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        continue
    sys.exit("connected to " + path)' "$bus" && ok "no bus socket can be connected to from the container" ||
    not_ok "a bus is reachable from the container"

# --- uid 0 in the container is not the host's root -------------------------------------------
podman_ exec "$ctr_a" "$cli" reload >"$work/reload" 2>&1
[ $? -eq 1 ] && grep -q "Denied" "$work/reload" && ok "root in the container may not reload the policy" ||
    not_ok "reload in container: $(cat "$work/reload")"
podman_ exec "$ctr_a" "$cli" revoke "$id_nobody" --reason test >"$work/revoke" 2>&1
[ $? -eq 1 ] && grep -q "Denied" "$work/revoke" && ok "root in the container may not revoke another uid's binding" ||
    not_ok "revoke in container: $(cat "$work/revoke")"
podman_ exec "$ctr_a" "$cli" bindings --json >"$work/list-in" 2>&1
python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); assert [b["id"] for b in l]==[sys.argv[2]], l' "$work/list-in" "$id_root" &&
    ok "root in the container lists only its own uid's binding in its pod" || not_ok "list in container: $(cat "$work/list-in")"
podman_ exec -e CNI_COMMAND=ADD -e CNI_CONTAINERID=forged-$tag -e CNI_NETNS=/proc/self/ns/net -e CNI_IFNAME=eth9 \
    -e "CNI_ARGS=K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=forged" "${env_in[@]}" -i "$ctr_a" "$cni" \
    <<<'{"cniVersion":"1.0.0","name":"x","type":"knod-cni","namespace":"team-a","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"knod.io/flows":"udp 10.99.0.1:* -> 10.99.0.2:5300"}}}' \
    >"$work/forge" 2>&1
# No bus to send RegisterPod on (the pod socket would refuse it too: not the host's root).
[ $? -ne 0 ] && grep -q '"code": *11' "$work/forge" &&
    ok "root in the container cannot register a pod (knod-cni run inside it reaches no bus)" ||
    not_ok "register from the container: $(cat "$work/forge")"

# --- a container on team-b's network is denied by that namespace's rule -------------------------
podman_ run --rm --name "$ctr_b" --network "$net_b" "${mounts[@]}" "${env_in[@]}" --rootfs "$rootfs" \
    "${holder[@]}" /out/b-root "$KNOD_SIM_NETDEV" sim0 "$(flow 5202)" >"$work/run-b" 2>&1
grep -q "^error Denied no-team-b:" "$work/out/b-root" &&
    ok "a container on team-b's network is denied, and the SDK names the rule" ||
    { not_ok "container on team-b: $(cat "$work/out/b-root" "$work/run-b")"; }
# Refusals are committed by the journal's writer after the reply: waited for.
denied_b() { [ "$(journal "select count(*) from events where kind='request-denied' and rule='no-team-b'")" -ge 1 ]; }
wait_until 60 "the request-denied row of rule no-team-b" denied_b &&
    ok "the refusal is journaled with the rule" || not_ok "no request-denied row for no-team-b"

# --- a process sharing the sandbox's network namespace from outside the container: its binding
# outlives the container's processes and ends when the runtime tears the network down (DEL). ----
pid_a=$(podman_ inspect -f '{{.State.Pid}}' "$ctr_a")
KNOD_CLIENT_LIBRARY=$build/client/libknod-client.so.1 PYTHONPATH=$src/python PYTHONDONTWRITEBYTECODE=1 \
    nsenter --net="/proc/$pid_a/ns/net" "${holder[@]}" "$work/out/a-outside" "$KNOD_SIM_NETDEV" sim0 "$(flow 5203)" \
    </dev/null >"$work/outside.log" 2>&1 &
outside=$!
wait_until 60 "the holder in the sandbox's namespace" grep -qs "^ok \|^error" "$work/out/a-outside"
grep -q "^ok .* team-a-pods$" "$work/out/a-outside" && ok "a process that joins the container's network namespace counts as its pod" ||
    not_ok "outside holder: $(cat "$work/out/a-outside" "$work/outside.log")"
id_outside=$(awk '/^ok /{print $2}' "$work/out/a-outside")

# --- the container stops: every binding of the pod ends ---------------------------------------
podman_ stop -t 2 "$ctr_a" >/dev/null 2>&1 || not_ok "podman stop"
ended() { [ "$(journal "select count(*) from sessions where id in ('$id_root','$id_nobody','$id_outside') and end_reason is not null")" = 3 ]; }
wait_until 60 "the pod's three sessions to end" ended && ok "the container stopped: all three of its pod's bindings ended" ||
    not_ok "sessions: $(journal 'select id, end_reason from sessions'); knod-cni calls: $(cat "$work/cni-calls.log")"
[ "$(journal "select end_reason from sessions where id='$id_outside'")" = pod-deleted ] &&
    ok "the binding that outlived the container's processes ended as pod-deleted (CNI DEL)" ||
    not_ok "outside end: $(journal "select end_reason from sessions where id='$id_outside'")"
wait_until 30 "the outside holder to hear the end" grep -q "^ended" "$work/out/a-outside" &&
    grep -q "^ended pod-deleted" "$work/out/a-outside" && ok "... and its holder was told so" ||
    not_ok "outside holder: $(cat "$work/out/a-outside")"
journal "select detail from events where kind='session-ended' and session_id='$id_root'" >"$work/end"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pod"]["name"]==sys.argv[2], d' "$work/end" "$ctr_a" &&
    ok "the container's own sessions' end events name the pod" || not_ok "end detail: $(cat "$work/end")"
podman_ rm -f -t 0 "$ctr_a" >/dev/null 2>&1
"$cli" bindings --json >"$work/list"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))==[], "left"' "$work/list" &&
    ok "no binding is left" || { not_ok "left: $(cat "$work/list")"; }

sed 's/^/# knod-cni call: /' "$work/cni-calls.log"
echo "# $passed passed, $failed failed"
[ "$failed" -eq 0 ]
