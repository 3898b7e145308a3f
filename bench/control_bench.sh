#!/usr/bin/env bash
# The control-plane benchmark in one command: knod_control_bench in a sandbox with the sim data
# path off, then in another with it on (a veth pair, namespace and BPF pins with names of this
# run's own, so it needs root), the same arguments to both. Prints both tables, or with --json
# one object {"datapath_off": ..., "datapath_on": ...}. docs/performance.md has the figures.
#
# The mode pod runs the same bench (sim data path off) as a pod's process: the sandbox serves
# the pod socket (--pod-socket), bench/control_bench_pod.sh registers a network namespace of the
# run's own as a pod with knod-cni (Kubernetes namespace "bench") and runs the bench in it on
# the pod socket, no bus in between. With off and pod in one run it ends with the pod socket's
# pair p50 (and live grant p50) over the system bus's, per client count ({"pod_over_bus": ...}
# with --json, the pod's figures under "pod_socket"). --holders needs the system bus (holders
# of other uids, the bus's match rules): refused in pod mode.
#
#   bench/control_bench.sh [--build DIR] [--modes off,on,pod] [--json] [BENCH ARGS...]
#   (BENCH ARGS: knod_control_bench's --seconds, --clients, --live, --probes, --commits,
#    --build-budget, --holders, --holder-bindings, --holder-uids; the default --live is
#    10,1000,10000). The scale case (docs/performance.md): --modes off --live 0 --holders 10,2000
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
modes=off,on
json=
args=()
live_given= holders_given=
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --json) json=--json; shift ;;
    --live) live_given=1; args+=("$1" "$2"); shift 2 ;;
    --holders) holders_given=1; args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
    esac
done
case ",$modes," in
*,pod,*) [ -z "$holders_given" ] || {
    echo "control bench: --holders is not measured in pod mode (holders of other uids on the system bus, the bus's match rules); run it with --modes off or on" >&2
    exit 2
} ;;
esac
[ -n "$live_given" ] || args+=(--live 10,1000,10000)
[ "$(id -u)" -eq 0 ] || { echo "control bench: needs root (the sim's veth and BPF)"; exit 77; }
bench=$build/bench/knod_control_bench
[ -x "$bench" ] || { echo "control bench: $bench is not built" >&2; exit 1; }
n=$(($$ % 100000))
common=(--build "$build" --policy "$repo/bench/control_bench_policy.toml" --bus-stats
    --daemon-arg --rate-limit=1000000 --daemon-arg --linux-audit=false)
run_mode() {
    case "$1" in
    off) "$repo/scripts/knod-sandbox.sh" "${common[@]}" --daemon-arg --sim-datapath=false -- \
        "$bench" --label "sim data path off" "${args[@]}" $json ;;
    on) "$repo/scripts/knod-sandbox.sh" "${common[@]}" --daemon-arg "--sim-netdev=knodsimc$n" \
        --daemon-arg "--sim-netns=knod-simc$n" --daemon-arg "--bpf-pin-root=/sys/fs/bpf/knodcb$n" \
        -- "$bench" --label "sim data path on" --netdev "knodsimc$n" "${args[@]}" $json ;;
    pod) "$repo/scripts/knod-sandbox.sh" "${common[@]}" --pod-socket \
        --daemon-arg --sim-datapath=false --daemon-arg --max-pod-connections-per-pod=256 -- \
        "$repo/bench/control_bench_pod.sh" "$build/cni/knod-cni" \
        "$bench" --label "pod socket (sim data path off)" "${args[@]}" $json ;;
    *) echo "control bench: unknown mode $1 (off, on, pod)" >&2; return 2 ;;
    esac
}
# The pod socket over the system bus, from off's and pod's output of this run: pair p50 per
# client count and live grant p50 per level.
ratios_text() {
    awk '
        FNR == 1 { f++ }
        /^clients +ping p50/ { t = "pairs"; next }
        /^live +grant p50/ { t = "live"; next }
        t == "pairs" && NF == 10 && $2 ~ /us$/ {
            v = $5; sub(/us$/, "", v); p[f, $1] = v; v = $2; sub(/us$/, "", v); q[f, $1] = v
            v = $7; o[f, $1] = v; if (f == 1) pc[++np] = $1; next
        }
        t == "live" && NF == 6 && $2 ~ /us$/ { v = $2; sub(/us$/, "", v); g[f, $1] = v; if (f == 1) gl[++ng] = $1; next }
        END {
            line = ""
            for (i = 1; i <= np; i++) { c = pc[i]; if (p[1, c] > 0 && p[2, c] != "")
                line = line sprintf("%s%s client%s %.0f / %.0f us = %.2f", line == "" ? "" : ", ", c, c == 1 ? "" : "s", p[2, c], p[1, c], p[2, c] / p[1, c]) }
            if (line != "") print "pod socket / system bus pair p50: " line
            line = ""
            for (i = 1; i <= np; i++) { c = pc[i]; if (q[1, c] > 0 && q[2, c] != "")
                line = line sprintf("%s%s client%s %.0f / %.0f us = %.2f", line == "" ? "" : ", ", c, c == 1 ? "" : "s", q[2, c], q[1, c], q[2, c] / q[1, c]) }
            if (line != "") print "pod socket / system bus Ping p50: " line
            line = ""
            for (i = 1; i <= np; i++) { c = pc[i]; if (o[1, c] > 0 && o[2, c] != "")
                line = line sprintf("%s%s client%s %.2f / %.2f = %.2f", line == "" ? "" : ", ", c, c == 1 ? "" : "s", o[2, c], o[1, c], o[2, c] / o[1, c]) }
            if (line != "") print "pod socket / system bus pair p50/floor (each over its own floor): " line
            line = ""
            for (i = 1; i <= ng; i++) { l = gl[i]; if (g[1, l] > 0 && g[2, l] != "")
                line = line sprintf("%s%s live %.0f / %.0f us = %.2f", line == "" ? "" : ", ", l, g[2, l], g[1, l], g[2, l] / g[1, l]) }
            if (line != "") print "pod socket / system bus grant p50: " line
        }' "$1" "$2"
}
ratios_json() {
    jq -c -n --slurpfile bus "$1" --slurpfile pod "$2" '
        def r(a; b): if (a // 0) > 0 and b != null then b / a else null end;
        {pairs: [$bus[0].pairs[] as $b | ($pod[0].pairs[] | select(.clients == $b.clients)) as $p
                 | {clients: $b.clients, bus_pair_p50_us: $b.pair_p50_us,
                    pod_pair_p50_us: $p.pair_p50_us, ratio: r($b.pair_p50_us; $p.pair_p50_us),
                    bus_ping_p50_us: $b.ping_p50_us, pod_ping_p50_us: $p.ping_p50_us,
                    ping_ratio: r($b.ping_p50_us; $p.ping_p50_us),
                    p50_over_floor_ratio: r($b.p50_over_floor; $p.p50_over_floor)}],
         live: [$bus[0].live[]? as $b | ($pod[0].live[]? | select(.asked == $b.asked)) as $p
                | {asked: $b.asked, bus_grant_p50_us: $b.grant_p50_us,
                   pod_grant_p50_us: $p.grant_p50_us, ratio: r($b.grant_p50_us; $p.grant_p50_us)}]}'
}
key() { case "$1" in pod) echo pod_socket ;; *) echo "datapath_$1" ;; esac; }
outs=$(mktemp -d /tmp/knod-control-bench.XXXXXX)
trap 'rm -rf "$outs"' EXIT
rc=0 sep=
[ -z "$json" ] || printf '{'
for mode in ${modes//,/ }; do
    if [ -n "$json" ]; then
        out=$(run_mode "$mode") || rc=1
        printf '%s' "$out" >"$outs/$mode"
        printf '%s"%s":%s' "$sep" "$(key "$mode")" "${out:-null}"
        sep=,
    else
        run_mode "$mode" | tee "$outs/$mode"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
        echo
    fi
done
if [ -s "$outs/off" ] && [ -s "$outs/pod" ]; then
    if [ -n "$json" ]; then
        r=$(ratios_json "$outs/off" "$outs/pod" 2>/dev/null) && printf '%s"pod_over_bus":%s' "$sep" "$r"
    else
        ratios_text "$outs/off" "$outs/pod"
    fi
fi
[ -z "$json" ] || printf '}\n'
exit $rc
