#!/usr/bin/env bash
# bench/control_bench.sh's pod mode, run inside scripts/knod-sandbox.sh --pod-socket: runs
# COMMAND (knod_control_bench and its arguments) as a pod's process. It makes a network namespace
# of this run's own, registers it as a pod with knod-cni as a runtime does (CNI ADD; Kubernetes
# namespace "bench", which the pod rule in bench/control_bench_policy.toml grants), runs COMMAND
# inside it with KNOD_POLICY_ADDRESS naming the sandbox's pod socket, then DEL and deletes the
# namespace, on every way out.
#
#   knod-sandbox.sh --pod-socket ... -- control_bench_pod.sh KNOD_CNI COMMAND [ARGS...]
set -uo pipefail
cni=$1
shift
[ -n "${KNOD_POD_SOCKET_DIR:-}" ] && [ -n "${KNOD_SANDBOX:-}" ] ||
    { echo "control bench (pod): run me inside scripts/knod-sandbox.sh --pod-socket" >&2; exit 2; }
[ -x "$cni" ] || { echo "control bench (pod): $cni is not built" >&2; exit 1; }
# Names of this run's own (this shell's pid): two runs at once never meet.
ns=knod-cbpod$$
container=knod-control-bench-$$
pod_args="IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=control-bench-$$;K8S_POD_UID=control-bench-uid-$$;K8S_POD_INFRA_CONTAINER_ID=$container"
log=$KNOD_SANDBOX/cni-bench.log
added= made=
# plugin COMMAND: knod-cni as a runtime runs it (CNI_* in the environment, the config on stdin).
plugin() {
    printf '{"cniVersion":"1.0.0","name":"knod-bench","type":"knod-cni","spoolDir":"%s","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.88.0.7/16"}]}}' \
        "$KNOD_CNI_SPOOL" |
        env CNI_COMMAND="$1" CNI_CONTAINERID="$container" CNI_NETNS="/var/run/netns/$ns" \
            CNI_IFNAME=eth0 CNI_ARGS="$pod_args" CNI_PATH=/usr/lib/cni "$cni" >>"$log" 2>&1
}
cleanup() {
    if [ -n "$added" ]; then
        plugin DEL || echo "control bench (pod): CNI DEL of $container failed: $(tail -n 3 "$log")" >&2
        added=
    fi
    if [ -n "$made" ]; then
        ip netns del "$ns" 2>/dev/null || echo "control bench (pod): ip netns del $ns failed" >&2
        made=
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ip netns add "$ns" || { echo "control bench (pod): ip netns add $ns failed" >&2; exit 1; }
made=1
added=1 # a failed ADD is undone by a DEL too, as a runtime does
plugin ADD || { echo "control bench (pod): CNI ADD failed: $(cat "$log")" >&2; exit 1; }
ip netns exec "$ns" env KNOD_POLICY_ADDRESS="unix:path=$KNOD_POD_SOCKET_DIR/pod.sock" "$@"
rc=$?
exit $rc
