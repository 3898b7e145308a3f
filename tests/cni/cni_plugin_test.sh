#!/usr/bin/env bash
# knod-cni against a live knod-policyd (issue #34), with real network namespaces standing for
# pod sandboxes: the plugin as a runtime runs it (CNI_* in the environment, the network config
# on stdin), processes inside a sandbox's namespace as the pod's, the daemon telling pods apart by
# that namespace. Run inside scripts/knod-sandbox.sh (the policy: tests/cni/policy.toml).
# Usage: knod-sandbox.sh --unique-sim --policy tests/cni/policy.toml -- cni_plugin_test.sh \
#            KNOD_CNI KNOD_POLICY KNOD_TEST_CLIENT POLICY_FILE
set -u
cni=$(readlink -f "$1") cli=$(readlink -f "$2") client=$(readlink -f "$3") policy=$(readlink -f "$4")
. "$(dirname "$0")/../../scripts/wait-lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
work=$KNOD_SANDBOX/cni
mkdir -p "$work"
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
tag=$(($$ % 100000))
pod_a=knodpoda$tag pod_b=knodpodb$tag pod_c=knodpodc$tag pod_h=knodpodh$tag pod_n=knodpodn$tag
# The spool knod-cni leaves work in when the daemon does not answer (the sandbox's daemon reads it).
spool=${KNOD_CNI_SPOOL:-$work/cni-spool}
holders=()
cleanup() {
    # A daemon left stopped by a failed check must not outlive the test stopped.
    [ -n "${KNOD_DAEMON_PID:-}" ] && kill -CONT "$KNOD_DAEMON_PID" 2>/dev/null
    exec {hold_in}>&-
    for p in "${holders[@]}"; do kill "$p" 2>/dev/null; done
    for ns in "$pod_a" "$pod_b" "$pod_c" "$pod_h" "$pod_n"; do ip netns del "$ns" 2>/dev/null; done
    rm -rf "$spool"
}
trap cleanup EXIT
for ns in "$pod_a" "$pod_b" "$pod_c" "$pod_h" "$pod_n"; do ip netns add "$ns" || { echo "not ok - ip netns add $ns"; exit 1; }; done
# Holders keep their binding until their stdin closes: a FIFO this shell holds open for writing.
mkfifo "$work/hold-in"
exec {hold_in}<>"$work/hold-in"
flow="udp 10.99.0.1:* -> 10.99.0.2:5100"

# plugin COMMAND CONTAINER NETNS ARGS [ANNOTATIONS_JSON]: run knod-cni as a runtime does.
plugin() {
    local command=$1 container=$2 netns=$3 args=$4 annotations=${5:-"{}"}
    local netns_path=
    [ -n "$netns" ] && netns_path=/var/run/netns/$netns
    printf '{"cniVersion":"1.0.0","name":"knod-test","type":"knod-cni","spoolDir":"%s"%s,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":%s},"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.88.0.7/16"}]}}' \
        "$spool" "$PLUGIN_CONFIG" "$annotations" |
        env CNI_COMMAND="$command" CNI_CONTAINERID="$container" CNI_NETNS="$netns_path" CNI_IFNAME=eth0 \
            CNI_ARGS="$args" CNI_PATH=/usr/lib/cni "${PLUGIN_PREFIX[@]}" "$cni" >"$work/out" 2>"$work/err"
    rc=$?
}
PLUGIN_PREFIX=() PLUGIN_CONFIG=
k8s() { echo "IgnoreUnknown=1;K8S_POD_NAMESPACE=$1;K8S_POD_NAME=$2;K8S_POD_UID=$3;K8S_POD_INFRA_CONTAINER_ID=x"; }
json_field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2]))' "$work/out" "$1"; }

# --- VERSION and bad input ----------------------------------------------------------------
env CNI_COMMAND=VERSION "$cni" </dev/null >"$work/out"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "1.1.0" in d["supportedVersions"] and "1.0.0" in d["supportedVersions"] and "0.4.0" in d["supportedVersions"], d' "$work/out" &&
    ok "VERSION lists every version up to 1.1.0" || not_ok "VERSION: $(cat "$work/out")"
echo '{"cniVersion":"9.9.9","name":"x","type":"knod-cni"}' | env CNI_COMMAND=ADD CNI_CONTAINERID=c CNI_NETNS=/var/run/netns/$pod_a CNI_IFNAME=eth0 "$cni" >"$work/out" 2>/dev/null
[ $? -ne 0 ] && [ "$(json_field code)" = 1 ] && ok "an unsupported cniVersion is error 1 (on stdout, as JSON)" || not_ok "cniVersion 9.9.9: $(cat "$work/out")"
echo 'not json' | env CNI_COMMAND=ADD CNI_CONTAINERID=c CNI_NETNS=/var/run/netns/$pod_a CNI_IFNAME=eth0 "$cni" >"$work/out" 2>/dev/null
[ $? -ne 0 ] && [ "$(json_field code)" = 6 ] && ok "a config that is not JSON is error 6" || not_ok "bad JSON: $(cat "$work/out")"

# --- explain --pod: the same decisions without a daemon -----------------------------------------
ex=("$cli" explain --policy "$policy" --user 0 --netdev "$KNOD_SIM_NETDEV" --gpu sim0 --flow "$flow" --bytes 4096)
"${ex[@]}" --pod team-a/infer-0 >"$work/out" 2>&1
[ $? -eq 0 ] && grep -q "^pod:      'team-a/infer-0'" "$work/out" && grep -q "^rule:     team-a-pods" "$work/out" &&
    ok "explain --pod: a pod of team-a is granted by the namespace rule, and the pod is printed" || { not_ok "explain --pod team-a"; cat "$work/out"; }
"${ex[@]}" --pod team-b/x --json >"$work/out" 2>&1
[ $? -eq 1 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["rule"]=="no-team-b" and d["caller"]["pod"]["namespace"]=="team-b", d' "$work/out" &&
    ok "explain --pod --json: team-b is denied by its rule" || { not_ok "explain --pod team-b"; cat "$work/out"; }
"${ex[@]}" >"$work/out" 2>&1
[ $? -eq 1 ] && grep -q "no registered pod" "$work/out" && ok "explain without --pod: no pod rule matches" || { not_ok "explain no pod"; cat "$work/out"; }
"${ex[@]}" --pod team-a/x --annotation profile=rx >"$work/out" 2>&1
[ $? -eq 2 ] && grep -q "knod.io/" "$work/out" && ok "explain --annotation outside knod.io/ is bad usage" || { not_ok "explain --annotation"; cat "$work/out"; }

# --- ADD: two pods, each known by its namespace; prevResult passes through ----------------------
plugin ADD "sandbox-a-$tag" "$pod_a" "$(k8s team-a infer-0 uid-a-1)" '{"knod.io/profile":"rx","other.io/secret":"x"}'
[ "$rc" -eq 0 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ips"][0]["address"]=="10.88.0.7/16" and d["interfaces"][0]["name"]=="eth0" and d["cniVersion"]=="1.0.0", d' "$work/out" &&
    ok "ADD registers the pod and prints prevResult unchanged" || { not_ok "ADD team-a (exit $rc)"; cat "$work/out" "$work/err"; }
plugin ADD "sandbox-b-$tag" "$pod_b" "$(k8s team-b infer-1 uid-b-1)"
[ "$rc" -eq 0 ] && ok "ADD of a second pod" || { not_ok "ADD team-b (exit $rc)"; cat "$work/out" "$work/err"; }

# A process in pod A, as uid 0 and as uid 65534: the namespace rule grants both.
in_pod() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
# A holder in the background: its pid is the holder's (no subshell), and it does not keep the
# FIFO's write end this shell holds (it would never see its stdin close).
hold_bg() { local out=$1; shift; "$@" >"$out" 2>&1 <"$work/hold-in" {hold_in}>&- & holders+=($!); }
hold_bg "$work/a0" ip netns exec "$pod_a" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "$flow"
wait_until 60 "pod A's root holder" grep -q "^ok \|^error" "$work/a0"
grep -q "^ok " "$work/a0" && ok "uid 0 in pod team-a/infer-0 is granted by the namespace rule" || { not_ok "pod A root: $(cat "$work/a0")"; }
id_a0=$(awk '/^ok /{print $2}' "$work/a0")
hold_bg "$work/a1" ip netns exec "$pod_a" setpriv --reuid=65534 --regid=65534 --clear-groups "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5101"
wait_until 60 "pod A's nobody holder" grep -q "^ok \|^error" "$work/a1"
grep -q "^ok " "$work/a1" && ok "another uid in the same pod is granted too" || not_ok "pod A nobody: $(cat "$work/a1")"
sqlite3 "$KNOD_STATE_DIR/journal.db" "select detail from events where kind='request-granted' and session_id='$id_a0'" >"$work/grant"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pod"]=={"namespace":"team-a","name":"infer-0","uid":"uid-a-1"}, d' "$work/grant" &&
    ok "the grant event names the pod (namespace, name, UID)" || not_ok "grant detail: $(cat "$work/grant")"

# The same uid on the host, and pod B: no pod rule matches them.
"$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5102" >"$work/host" 2>&1 </dev/null
grep -q "Denied" "$work/host" && grep -q "no registered pod" "$work/host" &&
    ok "root on the host matches no pod rule, and is told why" || not_ok "host root: $(cat "$work/host")"
in_pod "$pod_b" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5103" >"$work/b" 2>&1 </dev/null
grep -q "Denied" "$work/b" && grep -q "no-team-b" "$work/b" &&
    ok "pod team-b/infer-1 is denied by the rule for its namespace" || not_ok "pod B: $(cat "$work/b")"

"$cli" bindings >"$work/table" 2>&1
grep -A3 "^$id_a0 " "$work/table" | grep -q "^    pod team-a/infer-0 (uid uid-a-1)$" &&
    ok "bindings (the host's root) shows each binding's pod below it" || { not_ok "bindings pod line"; cat "$work/table"; }

# --- uid 0 in a pod is not the host's root ---------------------------------------------------
in_pod "$pod_a" "$cli" bindings --json >"$work/list" 2>&1
python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); assert [b["id"] for b in l]==[sys.argv[2]] and l[0]["pod"]=={"namespace":"team-a","name":"infer-0","uid":"uid-a-1"}, l' "$work/list" "$id_a0" &&
    ok "root in a pod lists only its own pod's root's bindings (not nobody's, not the host's)" || not_ok "list in pod: $(cat "$work/list")"
in_pod "$pod_a" "$cli" reload >"$work/reload" 2>&1
[ $? -eq 1 ] && grep -q "Denied" "$work/reload" && ok "root in a pod may not reload the policy" || not_ok "reload in pod: $(cat "$work/reload")"
in_pod "$pod_a" "$cli" revoke "$id_a0" --reason test >"$work/revoke" 2>&1
[ $? -eq 1 ] && grep -q "Denied" "$work/revoke" && ok "root in a pod may not revoke" || not_ok "revoke in pod: $(cat "$work/revoke")"
offload="{\"knod.io/flows\":\"$flow\",\"knod.io/netdev\":\"$KNOD_SIM_NETDEV\",\"knod.io/gpu\":\"sim0\"}"
PLUGIN_PREFIX=(ip netns exec "$pod_a")
plugin ADD "sandbox-x-$tag" "$pod_c" "$(k8s team-a fake uid-x)" "$offload"
PLUGIN_PREFIX=()
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 101 ] && grep -q "host's root" "$work/out" && ok "root in a pod cannot register a pod" || { not_ok "register from a pod (exit $rc)"; cat "$work/out"; }
# As nobody, with a namespace it may open (its own): the bus refuses the call (AccessDenied).
printf '{"cniVersion":"1.0.0","name":"knod-test","type":"knod-cni","runtimeConfig":{"io.kubernetes.cri.pod-annotations":%s}}' "$offload" |
    setpriv --reuid=65534 --regid=65534 --clear-groups env CNI_COMMAND=ADD CNI_CONTAINERID="sandbox-y-$tag" \
        CNI_NETNS=/proc/self/ns/net CNI_IFNAME=eth0 CNI_ARGS="$(k8s team-a fake uid-y)" "$cni" >"$work/out" 2>"$work/err"
rc=$?
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 101 ] && grep -q "Rejected send message\|AccessDenied" "$work/out" &&
    ok "a user other than root cannot register a pod (the bus refuses)" || { not_ok "register as nobody (exit $rc)"; cat "$work/out"; }

# --- a container's root (a pid namespace of its own, no pod) owns nothing of the host's root ----
hold_bg "$work/h" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:6000"
wait_until 60 "the host root's holder" grep -q "^ok \|^error" "$work/h"
id_h=$(awk '/^ok /{print $2}' "$work/h")
unshare --pid --fork "$cli" bindings --json >"$work/list" 2>&1
python3 -c 'import json,sys; ids=[b["id"] for b in json.load(open(sys.argv[1]))]; assert sys.argv[2] not in ids, ids' "$work/list" "$id_h" &&
    [ -n "$id_h" ] && ok "root in a pid namespace of its own does not see the host root's binding" || { not_ok "contained list (id $id_h)"; cat "$work/list" "$work/h"; }
unshare --pid --fork "$client" release "$id_h" >"$work/rel" 2>&1
grep -q "Denied\|NoSuchBinding\|UnknownObject" "$work/rel" && "$cli" bindings --json | grep -q "$id_h" &&
    ok "... nor release it" || { not_ok "contained release"; cat "$work/rel"; }
# A pod's process that makes a network namespace of its own is no pod, and not the host either.
in_pod "$pod_b" unshare --net "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:6001" >"$work/esc" 2>&1 </dev/null
grep -q "Denied" "$work/esc" && grep -q "neither the host's nor a registered pod's" "$work/esc" &&
    ok "a pod's process in a network namespace of its own matches no allow rule (no escape from its pod's deny rule)" || not_ok "escape: $(cat "$work/esc")"
"$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5104" >/dev/null 2>&1 </dev/null
in_pod "$pod_c" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5105" >"$work/c" 2>&1 </dev/null
grep -q "no registered pod" "$work/c" && ok "a refused registration made no pod of its namespace" || not_ok "pod C: $(cat "$work/c")"

# --- a pod whose declared offload request the policy denies fails at ADD ------------------------
plugin ADD "sandbox-c-$tag" "$pod_c" "$(k8s team-b trainer uid-c)" \
    "{\"knod.io/flows\":\"$flow\",\"knod.io/netdev\":\"$KNOD_SIM_NETDEV\",\"knod.io/gpu\":\"sim0\",\"knod.io/region\":\"4KiB\"}"
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 100 ] && grep -q "no-team-b" "$work/out" &&
    ok "ADD of a pod asking for offload its namespace's rule denies fails, naming the rule" || { not_ok "ADD denied (exit $rc)"; cat "$work/out"; }
# Refusals are committed by the journal's writer after the reply: waited for.
pod_refused() { [ "$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select count(*) from events where kind='pod-refused' and rule='no-team-b'")" -ge 1 ]; }
wait_until 60 "the pod-refused event of rule no-team-b" pod_refused &&
    ok "the refused pod is journaled (pod-refused, with the rule)" || not_ok "no pod-refused event"
plugin ADD "sandbox-c-$tag" "$pod_c" "$(k8s team-a trainer uid-c)" \
    "{\"knod.io/flows\":\"$flow\",\"knod.io/netdev\":\"$KNOD_SIM_NETDEV\",\"knod.io/gpu\":\"sim0\"}"
[ "$rc" -eq 0 ] && ok "the same request from a pod of an allowed namespace passes ADD" || { not_ok "ADD allowed offload (exit $rc)"; cat "$work/out"; }
plugin DEL "sandbox-c-$tag" "$pod_c" "$(k8s team-a trainer uid-c)"

# CHECK registers again (as after a daemon restart): it succeeds and prints nothing.
plugin CHECK "sandbox-a-$tag" "$pod_a" "$(k8s team-a infer-0 uid-a-1)"
[ "$rc" -eq 0 ] && [ ! -s "$work/out" ] && ok "CHECK succeeds and prints nothing" || { not_ok "CHECK (exit $rc)"; cat "$work/out" "$work/err"; }

# --- a DEL the daemon answers without deleting is no success (issue 51) ---------------------
# Root in a pod may not unregister pods: the daemon says Denied, the pod stays registered, and
# the plugin says 11 (try again) instead of a success for a deletion nobody made.
PLUGIN_PREFIX=(ip netns exec "$pod_a")
plugin DEL "sandbox-a-$tag" "$pod_a" "$(k8s team-a infer-0 uid-a-1)"
PLUGIN_PREFIX=()
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 11 ] && grep -q "unregisters pods" "$work/out" &&
    "$cli" bindings --json | grep -q "$id_a0" &&
    ok "a DEL the daemon refused is error 11, never success, and the pod's bindings stay" ||
    { not_ok "refused DEL (exit $rc)"; cat "$work/out" "$work/err"; }

# --- DEL ends the pod's bindings as pod-deleted; a second DEL (no netns) succeeds ---------------
plugin DEL "sandbox-a-$tag" "$pod_a" "$(k8s team-a infer-0 uid-a-1)"
[ "$rc" -eq 0 ] && [ ! -s "$work/out" ] && ok "DEL succeeds and prints nothing" || { not_ok "DEL (exit $rc)"; cat "$work/out"; }
ended() { [ "$(sqlite3 "$KNOD_STATE_DIR/journal.db" "select count(*) from sessions where end_reason='pod-deleted'")" = 2 ]; }
wait_until 60 "both of pod A's sessions to end as pod-deleted" ended && ok "DEL ended both of the pod's bindings (pod-deleted)" || not_ok "sessions after DEL: $(sqlite3 "$KNOD_STATE_DIR/journal.db" 'select id, end_reason from sessions')"
sqlite3 "$KNOD_STATE_DIR/journal.db" "select detail from events where kind='session-ended' and session_id='$id_a0'" >"$work/end"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pod"]["namespace"]=="team-a", d' "$work/end" &&
    ok "the end event names the pod" || not_ok "end detail: $(cat "$work/end")"
(printf '{"cniVersion":"1.0.0","name":"knod-test","type":"knod-cni"}' |
    env CNI_COMMAND=DEL CNI_CONTAINERID="sandbox-a-$tag" CNI_IFNAME=eth0 CNI_NETNS= "$cni" >"$work/out" 2>&1)
[ $? -eq 0 ] && ok "a second DEL, without netns or prevResult, succeeds" || { not_ok "second DEL"; cat "$work/out"; }
in_pod "$pod_a" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5106" >"$work/a2" 2>&1 </dev/null
grep -q "no registered pod" "$work/a2" && ok "after DEL the namespace is no pod's" || not_ok "after DEL: $(cat "$work/a2")"

# --- GC (CNI 1.1): the sandboxes of this network that the runtime no longer lists go -------------
plugin ADD "sandbox-g1-$tag" "$pod_a" "$(k8s team-a gc-1 uid-g1)"
hold_bg "$work/g1" ip netns exec "$pod_a" "$client" hold-until-end "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5120"
wait_until 60 "the GC pod's holder" grep -q "^ok \|^error" "$work/g1"
id_g1=$(awk '/^ok /{print $2; exit}' "$work/g1")
gc() { # NETWORK ATTACHMENTS_JSON: a GC as a CNI 1.1 runtime sends it
    printf '{"cniVersion":"1.1.0","name":"%s","type":"knod-cni","cni.dev/valid-attachments":%s}' "$1" "$2" |
        env CNI_COMMAND=GC CNI_PATH=/usr/lib/cni "${PLUGIN_PREFIX[@]}" "$cni" >"$work/out" 2>"$work/err"
    rc=$?
}
gc other-net '[]'
[ "$rc" -eq 0 ] && "$cli" bindings --json | grep -q "$id_g1" && [ -n "$id_g1" ] &&
    ok "GC of another network collects nothing of this one's" || { not_ok "GC other network (exit $rc)"; cat "$work/out" "$work/err" "$work/g1"; }
gc knod-test '{"containerID":"x"}'
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 7 ] && ok "GC with a malformed valid-attachments is error 7" || { not_ok "GC malformed (exit $rc)"; cat "$work/out"; }
gc knod-test "[{\"containerID\":\"sandbox-b-$tag\"}]"
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 7 ] && "$cli" bindings --json | grep -q "$id_g1" &&
    ok "GC with an entry missing its ifname is error 7 and collects nothing" || { not_ok "GC without ifname (exit $rc)"; cat "$work/out"; }
# Refusals of a container's root are journaled as any caller's: the first of a window in full,
# the rest as the window's count (written when it closes).
not_authorized() {
    sqlite3 "$KNOD_STATE_DIR/journal.db" "select (select count(*) from events where kind='pod-refused' and decision='not-authorized') + (select coalesce(sum(json_extract(detail, '\$.count')), 0) from events where kind='refusals-coalesced' and decision='pod-refused')"
}
refused_before=$(not_authorized)
PLUGIN_PREFIX=(ip netns exec "$pod_a")
printf '{"cniVersion":"1.1.0","name":"knod-test","type":"knod-cni","cni.dev/valid-attachments":[]}' |
    ip netns exec "$pod_a" env CNI_COMMAND=GC "$cni" >"$work/out" 2>"$work/err"
rc=$?
PLUGIN_PREFIX=()
counted() { [ "$(not_authorized)" -gt "$refused_before" ]; }
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 101 ] && "$cli" bindings --json | grep -q "$id_g1" &&
    wait_until 60 "the refused GC to be journaled (in full or in its window's count)" counted &&
    ok "root in a pod cannot garbage-collect pods, and the refusal is journaled" || { not_ok "GC from a pod (exit $rc, $refused_before -> $(not_authorized))"; cat "$work/out"; }
gc knod-test "[{\"containerID\":\"sandbox-b-$tag\",\"ifname\":\"eth0\"}]"
[ "$rc" -eq 0 ] && [ ! -s "$work/out" ] && wait_until 30 "the GC'd pod's holder to hear its end" grep -q "^ended" "$work/g1" &&
    grep -q "^ended revoked pod-deleted" "$work/g1" && ok "GC: a sandbox no longer listed is unregistered, its binding ends as pod-deleted" ||
    { not_ok "GC (exit $rc)"; cat "$work/out" "$work/err" "$work/g1"; }
in_pod "$pod_b" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5121" >"$work/b2" 2>&1 </dev/null
grep -q "no-team-b" "$work/b2" && ok "... and the listed sandbox stays registered" || not_ok "after GC pod B: $(cat "$work/b2")"

# --- a FIFO where the network namespace should be: an error, not a hung runtime ------------------
mkfifo "$work/not-a-netns"
plugin_fifo() {
    printf '{"cniVersion":"1.0.0","name":"knod-test","type":"knod-cni"}' |
        timeout 60 env CNI_COMMAND=ADD CNI_CONTAINERID="sandbox-f-$tag" CNI_NETNS="$work/not-a-netns" CNI_IFNAME=eth0 "$cni" >"$work/out" 2>"$work/err"
}
plugin_fifo
rc=$?
# Nothing waited on the FIFO and no pod was made of it; the ADD fails, saying why (issue 52: a
# refused registration is never a pod started unregistered).
[ "$rc" -eq 1 ] && grep -q "not a network namespace" "$work/err" && ok "a FIFO as CNI_NETNS does not hang the plugin, and is no pod's namespace" || not_ok "FIFO netns (exit $rc): $(cat "$work/out" "$work/err")"

# --- a network configuration with wrong types is an error, not a crash --------------------------
typed_ok=1
for bad in '{"cniVersion":1,"name":"x","type":"knod-cni"}:1' \
           '{"cniVersion":"1.0.0","name":"x","type":"knod-cni","namespace":7}:7' \
           '{"cniVersion":"1.0.0","name":["x"],"type":"knod-cni"}:7' \
           '{"cniVersion":"1.0.0","name":"x","type":"knod-cni","prevResult":[1]}:7'; do
    printf '%s' "${bad%:*}" | env CNI_COMMAND=ADD CNI_CONTAINERID="sandbox-t-$tag" CNI_NETNS=/var/run/netns/$pod_c CNI_IFNAME=eth0 "$cni" >"$work/out" 2>"$work/err"
    rc=$?
    [ "$rc" -eq 1 ] && [ "$(json_field code)" = "${bad##*:}" ] || { not_ok "config ${bad%:*}: exit $rc, $(cat "$work/out" "$work/err")"; typed_ok=0; }
done
[ "$typed_ok" = 1 ] && ok "configs with a number, an array or a non-object where a string or an object belongs are errors 1 or 7"

# --- the audit report counts per Kubernetes namespace ------------------------------------------
"$cli" audit report --db "$KNOD_STATE_DIR/journal.db" --json >"$work/report" 2>&1
python3 -c '
import json, sys
r = {t["k8s_namespace"]: t for t in json.load(open(sys.argv[1]))["by_k8s_namespace"]}
assert r["team-a"]["sessions"] == 3 and r["team-a"]["denials"] == 0, r
assert r["team-b"]["sessions"] == 0 and r["team-b"]["denials"] >= 1, r' "$work/report" &&
    ok "audit report --json: team-a's three sessions and team-b's denials, per namespace" || { not_ok "report per namespace"; cat "$work/report"; }
"$cli" audit report --db "$KNOD_STATE_DIR/journal.db" >"$work/report.txt" 2>&1
"$cli" audit report --db "$KNOD_STATE_DIR/journal.db" --html "$work/report.html" 2>/dev/null
grep -A3 "^per Kubernetes namespace" "$work/report.txt" | grep -q "^  team-a " && grep -q "Per Kubernetes namespace" "$work/report.html" &&
    ok "... and in the tables and the page" || { not_ok "report tables per namespace"; cat "$work/report.txt"; }

# --- podman's names are pods (issue 52, item 2) ------------------------------------------------
# Podman passes the container's name as K8S_POD_NAME (generated `nifty_pasteur`, a user's
# `MyInference`) and no namespace (the conflist's "namespace" stands for it). Rule podman-named
# names k8s_pods = ["MyInference"]: exactly that pod, case and all.
PLUGIN_CONFIG=',"namespace":"podman"'
plugin ADD "sandbox-n1-$tag" "$pod_n" "IgnoreUnknown=1;K8S_POD_NAME=MyInference"
[ "$rc" -eq 0 ] && ok "ADD of podman's MyInference succeeds" || { not_ok "ADD MyInference (exit $rc)"; cat "$work/out" "$work/err"; }
in_pod "$pod_n" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:7001" >"$work/n1" 2>&1 </dev/null
grep -q "^ok " "$work/n1" && ok "a process of pod podman/MyInference is granted by the rule naming it" || not_ok "MyInference's process: $(cat "$work/n1")"
plugin DEL "sandbox-n1-$tag" "$pod_n" ""
plugin ADD "sandbox-n2-$tag" "$pod_n" "IgnoreUnknown=1;K8S_POD_NAME=nifty_pasteur"
[ "$rc" -eq 0 ] && ok "ADD of podman's generated nifty_pasteur succeeds" || { not_ok "ADD nifty_pasteur (exit $rc)"; cat "$work/out" "$work/err"; }
in_pod "$pod_n" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:7002" >"$work/n2" 2>&1 </dev/null
grep -q "Denied" "$work/n2" && grep -q "k8s_pods" "$work/n2" && ! grep -q "no registered pod" "$work/n2" &&
    ok "... it is a registered pod, and the rule naming MyInference does not match it" || not_ok "nifty_pasteur's process: $(cat "$work/n2")"
plugin DEL "sandbox-n2-$tag" "$pod_n" ""
plugin ADD "sandbox-n3-$tag" "$pod_n" "IgnoreUnknown=1;K8S_POD_NAME=myinference"
in_pod "$pod_n" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:7003" >"$work/n3" 2>&1 </dev/null
[ "$rc" -eq 0 ] && grep -q "Denied" "$work/n3" && ok "a rule naming MyInference does not match myinference" || not_ok "myinference (exit $rc): $(cat "$work/n3")"
plugin DEL "sandbox-n3-$tag" "$pod_n" ""
bad_names_ok=1
for bad in 'two words' '-leading' 'semi%3Bcolon' "$(printf 'esc\033[31m')" 'cafÃ©'; do
    plugin ADD "sandbox-n4-$tag" "$pod_n" "IgnoreUnknown=1;K8S_POD_NAME=$bad"
    [ "$rc" -eq 1 ] && [ "$(json_field code)" = 4 ] && grep -q "no pod name" "$work/out" && ! grep -q $'\033' "$work/out" ||
        { not_ok "K8S_POD_NAME '$bad' (exit $rc): $(cat "$work/out" "$work/err")"; bad_names_ok=0; }
done
[ "$bad_names_ok" = 1 ] && ok "a K8S_POD_NAME no runtime gives fails ADD with error 4 and the reason, escaped (never a pod started unregistered)"
plugin ADD "sandbox-n5-$tag" "$pod_n" "IgnoreUnknown=1"
[ "$rc" -eq 0 ] && ok "without K8S_POD_NAME the container id names the pod" || { not_ok "ADD without a name (exit $rc)"; cat "$work/out" "$work/err"; }
plugin DEL "sandbox-n5-$tag" "$pod_n" ""
PLUGIN_CONFIG=

# --- a hung daemon never stalls the node (issue 52, item 1) -------------------------------------
# knod-policyd stopped (SIGSTOP: debugged, swapped out, blocked): ADD of a pod that asks for no
# offload and DEL return within the plugin's budget (2.5 s by default; the 15 s guard only detects
# a hang: sd-bus's default alone is 25 s), the work waits in the spool, and once the daemon runs
# again the pod is that pod, and the deleted one is gone.
PLUGIN_PREFIX=(timeout 15)
kill -STOP "$KNOD_DAEMON_PID"
plugin ADD "sandbox-h-$tag" "$pod_h" "$(k8s team-a hung-0 uid-h)"
[ "$rc" -eq 0 ] && grep -q "is queued in $spool" "$work/err" && [ -f "$spool/sandbox-h-$tag@eth0" ] &&
    ok "a stopped daemon: ADD of a pod asking for nothing returns, its registration queued" || { not_ok "ADD with the daemon stopped (exit $rc)"; cat "$work/out" "$work/err"; }
plugin ADD "sandbox-i-$tag" "$pod_c" "$(k8s team-a hung-1 uid-i)" "{\"knod.io/flows\":\"$flow\"}"
[ "$rc" -eq 1 ] && [ "$(json_field code)" = 11 ] && [ ! -e "$spool/sandbox-i-$tag@eth0" ] &&
    ok "... a pod asking for offload gets 11 (try again later) in time, nothing queued" || { not_ok "offload ADD with the daemon stopped (exit $rc)"; cat "$work/out" "$work/err"; }
plugin DEL "sandbox-b-$tag" "$pod_b" ""
[ "$rc" -eq 0 ] && grep -q "deletion of sandbox sandbox-b-$tag is queued" "$work/err" && [ -f "$spool/sandbox-b-$tag@eth0" ] &&
    ok "... DEL returns in time, the deletion queued" || { not_ok "DEL with the daemon stopped (exit $rc)"; cat "$work/out" "$work/err"; }
gc knod-test "[]"
[ "$rc" -eq 1 ] && [ "$(json_field code)" = 11 ] && ok "... GC returns in time with 11 (the next GC does it)" || { not_ok "GC with the daemon stopped (exit $rc)"; cat "$work/out" "$work/err"; }
PLUGIN_PREFIX=()
kill -CONT "$KNOD_DAEMON_PID"
wait_until 60 "the daemon to take the queued entries" bash -c "[ ! -e '$spool/sandbox-h-$tag@eth0' ] && [ ! -e '$spool/sandbox-b-$tag@eth0' ]"
in_pod "$pod_h" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5130" >"$work/h1" 2>&1 </dev/null
grep -q "^ok " "$work/h1" && ok "once the daemon runs again, the pod started meanwhile is team-a/hung-0 (granted by its rule)" || not_ok "queued pod: $(cat "$work/h1")"
in_pod "$pod_b" "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 "udp 10.99.0.1:* -> 10.99.0.2:5131" >"$work/b3" 2>&1 </dev/null
grep -q "no registered pod" "$work/b3" && ok "... and the sandbox deleted meanwhile is no pod's" || not_ok "queued DEL: $(cat "$work/b3")"
plugin ADD "sandbox-h-$tag" "$pod_h" "$(k8s team-a hung-0 uid-h)"
[ "$rc" -eq 0 ] && ok "ADD again of the queued sandbox (the late call and the spool are one pod)" || { not_ok "ADD again (exit $rc)"; cat "$work/out" "$work/err"; }
plugin DEL "sandbox-h-$tag" "$pod_h" ""

# --- no daemon: a pod that asks for nothing starts; one that asks for offload is told to retry ---
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/no-bus
plugin ADD "sandbox-d-$tag" "$pod_b" "$(k8s team-a quiet uid-d)"
[ "$rc" -eq 0 ] && grep -q "is queued in $spool" "$work/err" && ok "no daemon: a pod asking for nothing is not blocked (its registration queued)" || { not_ok "ADD without daemon (exit $rc)"; cat "$work/out" "$work/err"; }
plugin ADD "sandbox-e-$tag" "$pod_b" "$(k8s team-a eager uid-e)" "{\"knod.io/flows\":\"$flow\"}"
[ "$rc" -ne 0 ] && [ "$(json_field code)" = 11 ] && ok "no daemon: a pod asking for offload gets 11 (try again later)" || { not_ok "ADD offload without daemon (exit $rc)"; cat "$work/out"; }
plugin DEL "sandbox-e-$tag" "" ""
[ "$rc" -eq 0 ] && ok "no daemon: DEL succeeds" || not_ok "DEL without daemon (exit $rc)"
# The spool as the plugin keeps it while no daemon reads it: root's alone; an ADD queued while no
# daemon ran is withdrawn by its pod's DEL; a full spool is 11, never success for work nobody does.
gc knod-test "[]"
[ "$rc" -eq 1 ] && [ "$(json_field code)" = 11 ] && ok "no bus: GC is 11 (nothing collected is no success)" || { not_ok "GC without a bus (exit $rc)"; cat "$work/out"; }
daemons_spool=$spool spool=$work/unread-spool
plugin ADD "sandbox-q-$tag" "$pod_c" "$(k8s team-a queued uid-q)"
[ "$rc" -eq 0 ] && [ -f "$spool/sandbox-q-$tag@eth0" ] && [ "$(stat -c %u "$spool")" = 0 ] &&
    [ $((0$(stat -c %a "$spool") & 7)) -eq 0 ] && [ $((0$(stat -c %a "$spool/sandbox-q-$tag@eth0") & 022)) -eq 0 ] &&
    ok "no daemon: the queued registration is root's, in a directory closed to others" || { not_ok "spool ADD (exit $rc)"; ls -la "$spool"; }
plugin DEL "sandbox-q-$tag" "$pod_c" ""
[ "$rc" -eq 0 ] && [ ! -e "$spool/sandbox-q-$tag@eth0" ] && grep -q "withdrawn" "$work/err" &&
    ok "... and the pod's DEL withdraws it (it never reached a daemon)" || { not_ok "spool DEL (exit $rc)"; cat "$work/err"; ls -la "$spool"; }
for i in $(seq 1 1024); do : >"$spool/filler-$i@eth0"; done
plugin ADD "sandbox-r-$tag" "$pod_c" "$(k8s team-a full uid-r)"
add_rc=$rc add_code=$(json_field code)
plugin DEL "sandbox-r-$tag" "$pod_c" ""
[ "$add_rc" -eq 1 ] && [ "$add_code" = 11 ] && [ "$rc" -eq 1 ] && [ "$(json_field code)" = 11 ] && grep -q "cannot be queued" "$work/out" &&
    ok "... a full spool (1,024 entries) makes ADD and DEL 11 (try again later)" || { not_ok "full spool (ADD $add_rc/$add_code, DEL $rc)"; cat "$work/out"; }
rm -rf "$spool"
spool=$daemons_spool

echo "# $passed passed, $failed failed"
[ "$failed" -eq 0 ]
