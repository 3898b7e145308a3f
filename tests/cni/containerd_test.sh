#!/usr/bin/env bash
# knod-cni under containerd 1.6's CRI plugin (issue #34), driven as the kubelet drives it: a CRI
# client of the project's (tests/cni/cri/cri_client.py, runtime.v1 over containerd's socket)
# creates and deletes pod sandboxes; containerd runs a bridge network with knod-cni chained
# after it and hands it the pod's namespace, name, UID and annotations; processes placed in the
# sandbox's network namespace are that pod's to knod-policyd. Real parts, offline: Debian's
# containerd, runc, CNI plugins and catatonit (the pause image is made here from it, no
# registry). Run inside scripts/knod-sandbox.sh --pod-socket (the policy:
# tests/cni/containerd_policy.toml); containerd inherits its DBUS_SYSTEM_BUS_ADDRESS, so the
# plugin reaches that daemon. The pod's processes see what a pod is given (docs/kubernetes.md):
# the pod socket's directory at /run/knod-policy, read-only, and no system bus at all.
# Usage: knod-sandbox.sh --unique-sim --pod-socket --policy tests/cni/containerd_policy.toml -- \
#            containerd_test.sh KNOD_CNI KNOD_POLICY KNOD_TEST_CLIENT
set -u
cni=$(readlink -f "$1") cli=$(readlink -f "$2") client=$(readlink -f "$3")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/wait-lib.sh"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (containerd, network namespaces)"
for tool in containerd ctr containerd-shim-runc-v2 runc nsenter; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (Debian: containerd, runc, util-linux)"
done
for p in bridge host-local loopback; do
    [ -x "/usr/lib/cni/$p" ] || skip "/usr/lib/cni/$p is missing (Debian: containernetworking-plugins)"
done
[ -x /usr/bin/catatonit ] || skip "/usr/bin/catatonit is missing (Debian: catatonit)"
# Debian's grpc is for Debian's python, not for another python first on PATH.
/usr/bin/python3 -c 'import grpc, grpc_tools.protoc' 2>/dev/null ||
    skip "/usr/bin/python3 lacks grpc (Debian: python3-grpcio, python3-grpc-tools)"
[ -n "${KNOD_SANDBOX:-}" ] && [ -n "${DBUS_SYSTEM_BUS_ADDRESS:-}" ] && [ -n "${KNOD_POD_SOCKET_DIR:-}" ] ||
    { echo "not ok - run me inside scripts/knod-sandbox.sh --pod-socket"; exit 1; }
command -v unshare >/dev/null || skip "unshare is not installed (Debian: util-linux)"

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
# Names of this run's own, so that two runs (or the podman test) never meet: containerd's whole
# root, state and socket live in the sandbox's work dir; the bridge, the CNI network (whose name
# libcni's cache in /var/lib/cni/results carries) and the pods' cgroup parent carry the tag.
tag=$(($$ % 100000))
work=$KNOD_SANDBOX/ctrd
sock=$work/c.sock
net=knodcri$tag bridge=kcri$tag cgroup=/knod-cri-$tag image=localhost/knod-pause:$tag
ctrd_pid=
holders=()
mkdir -p "$work"/{bin,conf,ipam,calls,logs}

cri() { /usr/bin/python3 "$here/cri/cri_client.py" --socket "$sock" --stubs "$work/stubs" "$@"; }

# Processes still in the pods' cgroups (none after a clean StopPodSandbox).
cgroup_procs() { find /sys/fs/cgroup -path "*/${cgroup#/}/*" -name cgroup.procs -exec cat {} + 2>/dev/null; }
no_cgroup_procs() { [ -z "$(cgroup_procs)" ]; }
cleanup() {
    local p id m d
    for p in "${holders[@]}"; do kill "$p" 2>/dev/null; done
    if [ -n "$ctrd_pid" ] && kill -0 "$ctrd_pid" 2>/dev/null; then
        # Sandboxes a failed check left go as the kubelet makes them go: stopped, then removed
        # (containerd then tears down their network, mounts and shims itself).
        for id in $(cri --timeout 30 list 2>/dev/null); do
            cri --timeout 30 stop "$id" >/dev/null 2>&1
            cri --timeout 30 remove "$id" >/dev/null 2>&1
        done
        kill -TERM "$ctrd_pid" 2>/dev/null
        wait "$ctrd_pid" 2>/dev/null
    fi
    # What outlived containerd (it was killed, or a stop failed): the pods' processes, found by
    # their cgroup, and the shims serving this containerd, found by its socket. A shim's own
    # socket is in containerd's fixed /run/containerd/s, named by a hash of where it serves.
    for p in $(cgroup_procs); do kill -KILL "$p" 2>/dev/null; done
    for p in $(pgrep -f -- "containerd-shim-runc-v2 .*-address $sock\$"); do
        id=$(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | sed -n '/^-id$/{n;p}')
        kill -KILL "$p" 2>/dev/null
        [ -n "$id" ] && rm -f "/run/containerd/s/$(printf '%s' "$sock/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
    done
    wait_until 60 "the pods' processes to go" no_cgroup_procs
    # Mounts under the work dir (network namespaces, the sandboxes' /dev/shm, rootfs binds),
    # deepest first.
    awk -v w="$work" '$5 == w || index($5, w "/") == 1 { print $5 }' /proc/self/mountinfo |
        sort -r | while read -r m; do umount -l "$m"; done
    # The pods' cgroup parent, in every hierarchy (runc removed the sandboxes' own below it).
    find /sys/fs/cgroup -maxdepth 2 -type d -name "${cgroup#/}" 2>/dev/null | while read -r d; do
        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    ip link del "$bridge" 2>/dev/null
    # libcni's cache of each attachment (this network's, and containerd's own cni-loopback
    # one), which a DEL removes: named NETWORK-SANDBOX-IFNAME, the sandboxes being this run's.
    for id in $(awk '{ print $2 }' "$work/calls/log" 2>/dev/null | sort -u); do
        rm -f /var/lib/cni/results/*-"$id"-*
    done
    rm -rf "$work"
}
trap cleanup EXIT

# --- containerd with a configuration of the test's own --------------------------------------
# The plugin dir holds Debian's plugins and knod-cni behind a wrapper that records each call
# (command, sandbox, netns, CNI_ARGS, exit status; ADD's config) and runs the real plugin on the
# same stdin and stdout: the checks below see what containerd sent, not only what it reported.
for p in bridge host-local loopback; do ln -s "/usr/lib/cni/$p" "$work/bin/$p"; done
cat >"$work/bin/knod-cni" <<EOF
#!/bin/bash
config=\$(cat)
[ "\$CNI_COMMAND" = ADD ] && printf '%s\n' "\$config" >"$work/calls/add-\$CNI_CONTAINERID.json"
printf '%s\n' "\$config" | "$cni"
rc=\$?
echo "\$CNI_COMMAND \$CNI_CONTAINERID netns=\${CNI_NETNS:-none} args=\$CNI_ARGS rc=\$rc" >>"$work/calls/log"
exit \$rc
EOF
chmod 755 "$work/bin/knod-cni"
# The bridge has no address (isGateway false) and masquerades nothing: a pod needs no route off
# the host here, and the host gets no route that another run's subnet could clash with.
cat >"$work/conf/10-$net.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$net",
  "plugins": [
    { "type": "bridge", "bridge": "$bridge", "isGateway": false, "ipMasq": false,
      "ipam": { "type": "host-local", "subnet": "10.177.$((tag % 256)).0/24",
                "dataDir": "$work/ipam" } },
    { "type": "knod-cni", "capabilities": { "io.kubernetes.cri.pod-annotations": true } }
  ]
}
EOF
# native snapshotter: a rootfs is a plain copy (no overlay over whatever the work dir is on).
# Network namespaces are mounted under the state dir, not /var/run/netns: another runtime's
# cni-* there is never this run's to remove. restrict_oom_score_adj: these machines lack
# CAP_SYS_RESOURCE (cluster-rig.md). Plugins this test does not need, and ones that write
# outside the work dir (opt: /opt/containerd), are disabled.
cat >"$work/config.toml" <<EOF
version = 2
root = "$work/root"
state = "$work/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = "$work/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$image"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$work/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$work/bin"
    conf_dir = "$work/conf"
    max_conf_num = 1
EOF
/usr/bin/python3 "$here/cri/make_pause_image.py" "$work/pause.tar" "$image" ||
    { echo "not ok - cannot make the pause image"; exit 1; }

containerd --config "$work/config.toml" --log-level info >"$work/containerd.log" 2>&1 &
ctrd_pid=$!
answers() {
    kill -0 "$ctrd_pid" 2>/dev/null || { echo "not ok - containerd exited"; tail -20 "$work/containerd.log"; exit 1; }
    cri --timeout 5 version >"$work/version" 2>&1
}
if wait_until 60 "containerd's CRI to answer Version" answers; then
    grep -q "^containerd .* v1$" "$work/version" && ok "containerd's CRI answers runtime.v1 Version: $(cat "$work/version")" ||
        not_ok "Version: $(cat "$work/version")"
else
    not_ok "containerd never answered: $(cat "$work/version")"; tail -20 "$work/containerd.log"; exit 1
fi
# The CNI config is loaded by a watcher, the image by an event: wait for both as the kubelet
# does (it waits for NetworkReady) before the first sandbox.
wait_until 60 "containerd's CRI to report RuntimeReady and NetworkReady" cri ready ||
    { not_ok "CRI not ready: $(cri ready)"; exit 1; }
ctr --address "$sock" -n k8s.io images import --snapshotter native "$work/pause.tar" >"$work/import" 2>&1 ||
    { not_ok "ctr images import: $(cat "$work/import")"; exit 1; }
wait_until 60 "the CRI plugin to know the pause image" cri image "$image" >/dev/null &&
    ok "a pause image made here from catatonit imports offline and the CRI knows it" ||
    { not_ok "pause image: $(cri image "$image")"; exit 1; }

# --- RunPodSandbox of a team-a pod: the plugin registers it --------------------------------
uid_a=$(cat /proc/sys/kernel/random/uuid)
cri run --namespace team-a --name infer-0 --uid "$uid_a" --annotation knod.io/profile=rx \
    --annotation other.io/secret=x --cgroup-parent "$cgroup" --log-dir "$work/logs/a" >"$work/run-a" 2>&1
rc=$?
sandbox_a=$(cat "$work/run-a")
[ "$rc" -eq 0 ] && [[ "$sandbox_a" =~ ^[0-9a-f]{64}$ ]] && ok "RunPodSandbox of team-a/infer-0 succeeds" ||
    { not_ok "RunPodSandbox team-a (exit $rc): $sandbox_a"; tail -20 "$work/containerd.log"; exit 1; }
# CNI_ARGS is K=V;K=V from a Go map: in no fixed order.
has_args() { local line=$1 kv; shift; for kv in "$@"; do [[ ";${line#* args=}" == *";$kv;"* || ";${line#* args=}" == *";$kv rc="* ]] || return 1; done; }
add_a=$(grep "^ADD $sandbox_a netns=/.* rc=0$" "$work/calls/log")
has_args "$add_a" K8S_POD_NAMESPACE=team-a K8S_POD_NAME=infer-0 "K8S_POD_UID=$uid_a" &&
    /usr/bin/python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["runtimeConfig"]["io.kubernetes.cri.pod-annotations"]; assert a["knod.io/profile"]=="rx" and a["other.io/secret"]=="x", a' \
        "$work/calls/add-$sandbox_a.json" 2>"$work/err" &&
    ok "containerd ran knod-cni's ADD with the pod's namespace, name and UID and all its annotations" ||
    { not_ok "ADD as containerd ran it"; cat "$work/calls/log" "$work/err"; }
cri status "$sandbox_a" >"$work/status-a" 2>&1
netns=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["netns"])' "$work/status-a" 2>/dev/null)
case "$netns" in
"$work"/*) [ "$(stat -f -c %T "$netns" 2>/dev/null)" = nsfs ] ;;
*) false ;;
esac && ok "PodSandboxStatus names the sandbox's network namespace" || { not_ok "status: $(cat "$work/status-a")"; netns=; }
netns_dir=$(dirname "${netns:-$work/state/netns/x}")
ip_files() { find "$work/ipam/$net" -maxdepth 1 -name '[0-9]*.[0-9]*.[0-9]*.[0-9]*' 2>/dev/null | wc -l; }
bridge_ports() { ip -o link show master "$bridge" 2>/dev/null | wc -l; }

# --- RunPodSandbox of a team-b pod asking for offload: refused, naming the rule --------------
offload=(--annotation "knod.io/flows=udp 10.99.0.1:* -> 10.99.0.2:5200" --annotation "knod.io/netdev=$KNOD_SIM_NETDEV"
    --annotation knod.io/gpu=sim0 --annotation knod.io/region=4KiB)
uid_b=$(cat /proc/sys/kernel/random/uuid)
cri run --namespace team-b --name x --uid "$uid_b" "${offload[@]}" --cgroup-parent "$cgroup" \
    --log-dir "$work/logs/b" >"$work/run-b" 2>&1
rc=$?
# What the kubelet shows as FailedCreatePodSandBox: containerd's error, the plugin's message in it.
[ "$rc" -eq 1 ] && grep -q 'plugin type="knod-cni" failed (add): knod-policy refuses the pod.s offload request' "$work/run-b" &&
    grep -q "no-team-b" "$work/run-b" &&
    ok "RunPodSandbox of team-b/x asking for offload fails, and the error names the rule no-team-b" ||
    not_ok "RunPodSandbox team-b (exit $rc): $(cat "$work/run-b")"
sed 's/^/#   /' "$work/run-b"
sandbox_b=$(grep -o 'sandbox "[0-9a-f]\{64\}"' "$work/run-b" | grep -o '[0-9a-f]\{64\}')
# Refusals are committed by the journal's writer after the reply: waited for.
refused_rows() { sqlite3 "$KNOD_STATE_DIR/journal.db" "select detail from events where kind='pod-refused' and rule='no-team-b'" >"$work/refused" && [ -s "$work/refused" ]; }
wait_until 60 "the pod-refused event of rule no-team-b" refused_rows
/usr/bin/python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert d["pod"]=={"namespace":"team-b","name":"x","uid":sys.argv[2]}, d' \
    "$work/refused" "$uid_b" 2>"$work/err" &&
    ok "the journal has the pod-refused event (rule no-team-b, the pod's namespace, name, UID)" ||
    not_ok "pod-refused: $(cat "$work/refused" "$work/err")"
# containerd cleans up after a failed ADD: a DEL (with the netns) follows, the sandbox, its
# namespace, address and bridge port are gone; the daemon never registered it.
left_b() {
    [ "$(cri list)" = "$sandbox_a" ] && [ "$(find "$netns_dir" -mindepth 1 -maxdepth 1 | wc -l)" -eq 1 ] &&
        [ "$(ip_files)" -eq 1 ] && [ "$(bridge_ports)" -eq 1 ]
}
[ -n "$sandbox_b" ] && grep -q "^ADD $sandbox_b netns=/.* rc=1$" "$work/calls/log" &&
    grep -q "^DEL $sandbox_b netns=/.* rc=0$" "$work/calls/log" && left_b &&
    ok "after the refused ADD containerd sent DEL, and the sandbox left nothing behind (list, netns, IP, bridge port)" ||
    { not_ok "what the refused sandbox left ($sandbox_b): list $(cri list | tr '\n' ' '), netns $(find "$netns_dir" -mindepth 1 -maxdepth 1 -printf "%f "), IPs $(ip_files), ports $(bridge_ports)"; cat "$work/calls/log"; }

# --- processes in the team-a sandbox's network namespace are that pod's ---------------------
# hold-until-end prints "ok ID KEY" once granted, then "ended revoked|released REASON" when the
# daemon tells it the binding ended (30 s at most: it is started just before it is needed).
# in_pod CMD...: CMD in the sandbox's network namespace and a mount namespace of its own that
# shows what a pod is given: an empty /run with the pod socket's directory at /run/knod-policy
# (read-only), and neither the node's system bus socket nor this sandbox's bus (the work dir is
# covered). No address in its environment: the client library finds the pod socket by itself.
in_pod() {
    nsenter --net="$netns" unshare --mount --propagation private -- env -u DBUS_SYSTEM_BUS_ADDRESS \
        bash -c 'mount -t tmpfs -o mode=755 pod-run /run && mkdir /run/knod-policy &&
            mount --bind -o ro "$1" /run/knod-policy && mount -t tmpfs -o mode=755 hide "$2" && shift 2 &&
            exec "$@"' in_pod "$KNOD_POD_SOCKET_DIR" "$KNOD_SANDBOX" "$@"
}
in_pod sh -c 'test -S /run/knod-policy/pod.sock && test ! -e /run/dbus/system_bus_socket && test ! -e "$0"' \
    "${DBUS_SYSTEM_BUS_ADDRESS#unix:path=}" &&
    ok "the pod's processes have the pod socket and no system bus socket (neither the node's nor the sandbox's)" ||
    not_ok "the pod's view: $(in_pod ls -la /run /run/knod-policy 2>&1)"
hold_bg() { local out=$1; shift; in_pod "$client" hold-until-end "$KNOD_SIM_NETDEV" sim0 4096 "$@" >"$out" 2>&1 </dev/null & holders+=($!); }
hold_bg "$work/h1" "udp 10.99.0.1:* -> 10.99.0.2:5100"
hold_bg "$work/h2" "udp 10.99.0.1:* -> 10.99.0.2:7000"
wait_until 60 "the pod's holders to be answered" bash -c 'grep -q "^ok \|^error" "$1" && grep -q "^ok \|^error" "$2"' _ "$work/h1" "$work/h2"
id1=$(awk '/^ok /{print $2; exit}' "$work/h1") id2=$(awk '/^ok /{print $2; exit}' "$work/h2")
rule_of() { sqlite3 "$KNOD_STATE_DIR/journal.db" "select rule from events where kind='request-granted' and session_id='$1'"; }
[ -n "$id1" ] && [ "$(rule_of "$id1")" = team-a-pods ] &&
    ok "a process in the sandbox's network namespace is granted by rule team-a-pods" ||
    not_ok "holder in pod: $(cat "$work/h1") (rule $(rule_of "$id1"))"
sqlite3 "$KNOD_STATE_DIR/journal.db" "select detail from events where kind='request-granted' and session_id='$id1'" >"$work/grant"
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pod"]=={"namespace":"team-a","name":"infer-0","uid":sys.argv[2]}, d' \
    "$work/grant" "$uid_a" 2>"$work/err" &&
    ok "the grant event names the pod's namespace, name and UID as the CRI request gave them" ||
    not_ok "grant detail: $(cat "$work/grant" "$work/err")"
# The annotation rule grants only a pod that carries knod.io/profile=rx. The daemon refuses a
# registration carrying any key outside knod.io/ (pod_registry), so the pod being registered
# at all shows the plugin dropped other.io/secret, which containerd did send it (checked above).
[ -n "$id2" ] && [ "$(rule_of "$id2")" = team-a-rx-profile ] &&
    ok "the pod's knod.io/ annotation reached the daemon (rule team-a-rx-profile), and only knod.io/ ones did" ||
    not_ok "annotation holder: $(cat "$work/h2") (rule $(rule_of "$id2"))"
"$cli" bindings --json >"$work/list" 2>&1
/usr/bin/python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); assert sorted(b["id"] for b in l)==sorted(sys.argv[2:4]) and all(b["pod"]["uid"]==sys.argv[4] for b in l), l' \
    "$work/list" "$id1" "$id2" "$uid_a" 2>"$work/err" &&
    ok "bindings --json lists both of the pod's bindings with its UID" || not_ok "bindings: $(cat "$work/list" "$work/err")"

# --- StopPodSandbox ends the pod's bindings; RemovePodSandbox sends the second DEL ------------
cri stop "$sandbox_a" >"$work/stop" 2>&1 && grep -q "^DEL $sandbox_a netns=/.* rc=0$" "$work/calls/log" &&
    ok "StopPodSandbox succeeds, and containerd sent DEL with the netns" || { not_ok "StopPodSandbox: $(cat "$work/stop")"; cat "$work/calls/log"; }
ended() { [ "$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select count(*) from sessions where id in ('$id1','$id2') and end_reason='pod-deleted'")" = 2 ]; }
wait_until 60 "both of the pod's sessions to end as pod-deleted" ended &&
    ok "both bindings ended with end_reason pod-deleted" ||
    not_ok "sessions: $(sqlite3 "$KNOD_STATE_DIR/journal.db" "select id, end_reason from sessions where id in ('$id1','$id2')")"
wait_until 60 "the holders to be told" bash -c 'grep -q "^ended" "$1" && grep -q "^ended" "$2"' _ "$work/h1" "$work/h2"
grep -q "^ended .*pod-deleted" "$work/h1" && grep -q "^ended .*pod-deleted" "$work/h2" &&
    ok "the holders were told their bindings ended (pod-deleted)" || not_ok "holders: $(cat "$work/h1" "$work/h2")"
cri remove "$sandbox_a" >"$work/remove" 2>&1 && grep -q "^DEL $sandbox_a netns=none .*rc=0$" "$work/calls/log" &&
    ok "RemovePodSandbox succeeds, and the second DEL (no netns) with it" || { not_ok "RemovePodSandbox: $(cat "$work/remove")"; cat "$work/calls/log"; }
"$cli" bindings --json >"$work/list" 2>&1
[ -z "$(cri list)" ] && /usr/bin/python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))==[]' "$work/list" 2>/dev/null &&
    ok "no sandbox and no binding is left (ListPodSandbox, bindings --json)" || not_ok "left: $(cri list) $(cat "$work/list")"
mounts() { awk -v w="$work" 'index($5, w "/") == 1' /proc/self/mountinfo | wc -l; }
[ "$(mounts)" -eq 0 ] && [ "$(ip_files)" -eq 0 ] && [ "$(bridge_ports)" -eq 0 ] && no_cgroup_procs &&
    ok "containerd left no mount, address, bridge port or process of the pods" ||
    not_ok "left: $(mounts) mounts, $(ip_files) IPs, $(bridge_ports) ports, processes: $(cgroup_procs | tr '\n' ' ')"

if [ "$failed" -ne 0 ]; then
    echo "# knod-cni calls:"; sed 's/^/#   /' "$work/calls/log"
    echo "# containerd's log (last 30 lines):"; tail -30 "$work/containerd.log" | sed 's/^/#   /'
fi
echo "# $passed passed, $failed failed ($SECONDS s)"
[ "$failed" -eq 0 ]
