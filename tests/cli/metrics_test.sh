#!/usr/bin/env bash
# knod-policy metrics with the real parts (#35): a daemon on a private bus with the sim, a grant,
# an activation with traffic, a denial and a release; promtool lints the text; a real
# node_exporter (textfile collector) and a real Prometheus, on loopback ports of this test's
# own, scrape it, and Prometheus' HTTP API must return what `status --json` and
# `bindings --json` show.
#   metrics_test.sh BUILD_DIR SOURCE_DIR          (ctest: cli.metrics; 77 when the Debian
#                                                 packages cannot be installed)
set -u
if [ "${1:-}" != --inside ]; then
    build=$1 src=$2
    need() { command -v promtool >/dev/null && command -v prometheus >/dev/null &&
        command -v prometheus-node-exporter >/dev/null; }
    if ! need; then
        # What scripts/install-deps.sh installs; its services are kept off there as here.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            prometheus prometheus-node-exporter >/dev/null 2>&1
        for unit in prometheus prometheus-node-exporter; do
            systemctl disable "$unit" >/dev/null 2>&1
            [ -d /run/systemd/system ] && systemctl stop "$unit" >/dev/null 2>&1
        done
    fi
    if ! need; then
        echo "SKIP: promtool, prometheus or prometheus-node-exporter missing and the Debian" \
            "packages prometheus, prometheus-node-exporter could not be installed" >&2
        exit 77
    fi
    work=$(mktemp -d /tmp/knod-metrics-test.XXXXXX)
    chmod 755 "$work"
    # The policy is the test's own: its allow rule's name carries a quote and a backslash (the
    # parser refuses control characters in policy strings; a newline's escape is unit-tested),
    # which must come back from Prometheus as they were.
    cat >"$work/policy.toml" <<'EOF'
[settings]
auditor_group = "knod-audit"
unmatched_traffic = "pass"

[[rule]]
name = "no-nobody"
action = "deny"
users = ["nobody"]

[[rule]]
name = "sim \"local\" \\ rule"
action = "allow"
users = ["root"]
netdevs = ["knodsim*"]
gpus = ["sim*"]
max_region = "64MiB"
max_bindings_per_uid = 16
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
key_lifetime = "1h"
EOF
    "$src/scripts/knod-sandbox.sh" --build "$build" --unique-sim --policy "$work/policy.toml" -- \
        "$0" --inside "$build" "$src" "$work"
    rc=$?
    rm -rf "$work"
    exit $rc
fi

shift
build=$1 src=$2 work=$3
cli=$build/cli/knod-policy client=$build/tests/knod_test_client
. "$src/scripts/wait-lib.sh"
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; return 1; fi; }
exporter_pid= prometheus_pid= a_pid= b_pid=
cleanup() {
    # A daemon left stopped by a failed check would never hear the sandbox's SIGTERM.
    [ -n "${KNOD_DAEMON_PID:-}" ] && kill -CONT "$KNOD_DAEMON_PID" 2>/dev/null
    for p in $exporter_pid $prometheus_pid $a_pid $b_pid; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
}
trap cleanup EXIT
textdir=$work/textfile
mkdir -p "$textdir"

# --- a grant with traffic and a release, a denial, a second binding with traffic ------------
coproc A { exec "$client" hold-active "$KNOD_SIM_NETDEV" sim0 65536 "udp 10.99.0.1:* -> 10.99.0.2:5000"; }
a_pid=$A_PID
exec {a_out}<&"${A[0]}" {a_in}>&"${A[1]}" {A[0]}<&- {A[1]}>&-
read -r line <&"$a_out"
a_id=$(echo "$line" | cut -d' ' -f2)
check "binding A granted and active" '[ "${line%% *}" = ok ]'
"$cli" sim-send --netns "$KNOD_SIM_NETNS" --to 10.99.0.2:5000 --count 3 --data hello >/dev/null 2>&1
rx_of() { # ID FIELD: a binding's figure as bindings --json shows it
    "$cli" bindings --json | python3 -c '
import json, sys
b = [b for b in json.load(sys.stdin) if b["id"] == sys.argv[1]]
print(b[0][sys.argv[2]] if b else "")' "$1" "$2"
}
a_landed() { [ "$(rx_of "$a_id" rx_packets)" = 3 ]; }
wait_until 60 "A's three packets" a_landed
a_bytes=$(rx_of "$a_id" rx_bytes) a_packets=$(rx_of "$a_id" rx_packets)
check "A received 15 bytes in 3 packets" '[ "$a_bytes" = 15 ] && [ "$a_packets" = 3 ]'
"$client" release "$a_id" >"$work/out" 2>&1
check "A released by its owner" 'grep -q "^ok" "$work/out"'
exec {a_in}>&- {a_out}<&-
wait "$a_pid" 2>/dev/null
a_pid=

setpriv --reuid=65534 --regid=65534 --clear-groups "$client" hold "$KNOD_SIM_NETDEV" sim0 4096 \
    "udp 10.99.0.1:* -> 10.99.0.2:5100" >"$work/out" 2>&1
check "nobody is denied by rule no-nobody" 'grep -q "^error.*no-nobody" "$work/out"'

# B is rank 1 of a job (SetJob, issue #53): knod_job_bindings counts it under its job.
coproc B { KNOD_TEST_JOB=10.0.0.1:29500 KNOD_TEST_JOB_RANK=1 \
    exec "$client" hold-active "$KNOD_SIM_NETDEV" sim0 65536 "udp 10.99.0.1:* -> 10.99.0.2:5001"; }
b_pid=$B_PID
exec {b_out}<&"${B[0]}" {b_in}>&"${B[1]}" {B[0]}<&- {B[1]}>&-
read -r line <&"$b_out"
b_id=$(echo "$line" | cut -d' ' -f2)
check "binding B granted and active" '[ "${line%% *}" = ok ]'
"$cli" sim-send --netns "$KNOD_SIM_NETNS" --to 10.99.0.2:5001 --count 2 --data abcd >/dev/null 2>&1
b_landed() { [ "$(rx_of "$b_id" rx_packets)" = 2 ]; }
wait_until 60 "B's two packets" b_landed

# --- the text ----------------------------------------------------------------------------
"$cli" metrics >"$work/m.prom" 2>"$work/err"
check "knod-policy metrics exits 0" '[ $? -eq 0 ]' || cat "$work/err"
promtool check metrics <"$work/m.prom" >"$work/lint" 2>&1
check "promtool check metrics finds nothing to complain about" '[ $? -eq 0 ] && [ ! -s "$work/lint" ]' ||
    cat "$work/lint"
check "no label names a binding id, pid, key id or uid" \
    '! grep -q "$a_id\|$b_id" "$work/m.prom" && ! grep -Eq "[{,](id|pid|uid|key_id|binding)=" "$work/m.prom"'
check "the rule's quote and backslash are escaped inside its label" \
    'grep -qF "rule=\"sim \\\"local\\\" \\\\ rule\"} 1" "$work/m.prom" && [ "$(grep -c "^knod_up " "$work/m.prom")" = 1 ]'
check "requests by decision, refusals, ends and the commit histogram are there" \
    'grep -q "^knod_requests_total{decision=\"allow\"} 2$" "$work/m.prom" &&
     grep -q "^knod_requests_total{decision=\"deny\"} 1$" "$work/m.prom" &&
     grep -q "^knod_refusals_total{kind=\"request-denied\"} 1$" "$work/m.prom" &&
     grep -q "^knod_bindings_ended_total{reason=\"release\"} 1$" "$work/m.prom" &&
     grep -q "^knod_journal_commit_duration_seconds_count [1-9]" "$work/m.prom" &&
     grep -q "^knod_start_time_seconds [0-9]" "$work/m.prom"'
check "no series per job tag unless asked (--job-tags)" '! grep -q "knod_job_bindings" "$work/m.prom"'
"$cli" metrics --job-tags >"$work/m-jobs.prom" 2>"$work/err"
check "knod-policy metrics --job-tags exits 0" '[ $? -eq 0 ]' || cat "$work/err"
check "live bindings per job: B's job once, the untagged binding not at all" \
    'grep -q "^knod_job_bindings{job_tag=\"10.0.0.1:29500\"} 1$" "$work/m-jobs.prom" &&
     [ "$(grep -c "^knod_job_bindings{" "$work/m-jobs.prom")" = 1 ]'
setpriv --reuid=65534 --regid=65534 --clear-groups "$cli" metrics >"$work/out" 2>&1
check "nobody may not read the metrics (exit 1, Denied)" '[ $? -eq 1 ] && grep -q "Error.Denied" "$work/out"'

"$cli" metrics --job-tags --textfile "$textdir" >"$work/out" 2>&1
check "--textfile writes knod-policy.prom, readable by the collector's group only (issue #51), and leaves no temporary file" \
    '[ $? -eq 0 ] && [ "$(ls -A "$textdir")" = knod-policy.prom ] && [ "$(stat -c %a:%G "$textdir/knod-policy.prom")" = 640:prometheus ]'
"$cli" metrics --textfile "$textdir" --textfile-group no-such-group-knod >"$work/out" 2>&1
check "a collector group that does not exist is exit 1 (the packaged unit fails: 2 is its success), naming the fix" \
    '[ $? -eq 1 ] && grep -q "name the group node_exporter runs as" "$work/out"'
check "the textfile lints clean too" 'promtool check metrics <"$textdir/knod-policy.prom" >/dev/null 2>&1'

# --- node_exporter and Prometheus, on ports of their own ----------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Starts "$@" with @PORT@ replaced by a free port until it answers READY_URL (a port taken in
# between makes it exit: another try); sets started_pid and started_port.
start_on_free_port() {
    local ready_path=$1 log=$2
    shift 2
    local try
    for try in 1 2 3 4 5; do
        started_port=$(free_port)
        "${@//@PORT@/$started_port}" >"$log" 2>&1 &
        started_pid=$!
        up_or_gone() {
            curl -sf "http://127.0.0.1:$started_port$ready_path" >/dev/null 2>&1 ||
                ! kill -0 "$started_pid" 2>/dev/null
        }
        wait_until 60 "$1 on port $started_port" up_or_gone
        kill -0 "$started_pid" 2>/dev/null && return 0
        wait "$started_pid" 2>/dev/null
    done
    cat "$log" >&2
    return 1
}
start_on_free_port /metrics "$work/exporter.log" prometheus-node-exporter --collector.disable-defaults \
    --collector.textfile --collector.textfile.directory="$textdir" --web.listen-address=127.0.0.1:@PORT@
exporter_pid=$started_pid exporter_port=$started_port
check "node_exporter serves the textfile's figures" \
    'curl -sf "http://127.0.0.1:$exporter_port/metrics" | grep -q "^knod_up 1$"'
mkdir -p "$work/prometheus"
cat >"$work/prometheus/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: knod-node
    static_configs:
      - targets: ["127.0.0.1:$exporter_port"]
EOF
start_on_free_port /-/ready "$work/prometheus.log" prometheus \
    --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/prometheus/data" \
    --web.listen-address=127.0.0.1:@PORT@
prometheus_pid=$started_pid prometheus_port=$started_port
check "Prometheus is ready" '[ -n "$prometheus_pid" ]'

# promql EXPR: the query's result as JSON lines [labels, value], one per series.
promql() {
    curl -sf --data-urlencode "query=$1" "http://127.0.0.1:$prometheus_port/api/v1/query" |
        python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["status"] == "success", r
for s in r["data"]["result"]:
    print(json.dumps([s["metric"], s["value"][1]]))'
}
# The daemon's figures now (the file is rewritten first, as the timer would), and Prometheus'
# for the same: equal once Prometheus has scraped this file. Nothing moves meanwhile (no
# traffic, no calls), so the file, status and bindings describe one moment.
agree() {
    "$cli" metrics --job-tags --textfile "$textdir" >/dev/null 2>&1 || return 1
    "$cli" status --json >"$work/status.json" 2>/dev/null || return 1
    "$cli" bindings --json >"$work/bindings.json" 2>/dev/null || return 1
    for q in knod_info knod_bindings knod_rx_bytes_total knod_rx_packets_total \
        knod_journal_pending_records knod_journal_available knod_sink_written_records_total \
        knod_sink_failed_records_total knod_sink_dropped_records_total knod_up knod_job_bindings \
        'knod_requests_total{decision="allow"}' 'knod_bindings_ended_total{reason="release"}'; do
        promql "$q" >"$work/q.$(echo "$q" | tr -c 'a-z_\n' _)" || return 1
    done
    python3 - "$work" "$KNOD_SIM_NETDEV" "$a_bytes" "$a_packets" <<'PY' 2>"$work/agree.why"
import glob, json, os, sys
work, netdev, a_bytes, a_packets = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
status = json.load(open(os.path.join(work, "status.json")))
bindings = json.load(open(os.path.join(work, "bindings.json")))
def q(name):
    path = os.path.join(work, "q." + "".join(c if c in "abcdefghijklmnopqrstuvwxyz_" else "_" for c in name))
    return [json.loads(l) for l in open(path)]
def one(name, **labels):
    rows = [v for m, v in q(name) if all(m.get(k) == want for k, want in labels.items())]
    assert len(rows) == 1, (name, labels, q(name))
    return float(rows[0])
assert one("knod_up") == 1
assert one("knod_info", version=status["version"], driver=status["driver"]) == 1
# Live bindings: the same count, and the rule's name exactly as bindings --json has it.
assert sum(float(v) for m, v in q("knod_bindings")) == status["bindings"], (q("knod_bindings"), status)
for b in bindings:
    assert one("knod_bindings", state=b["state"], netdev=b["netdev"], gpu=b["gpu"], rule=b["rule"]) >= 1
# RX per netdev and GPU: the released binding's figures plus the live ones'.
live = [b for b in bindings if b["netdev"] == netdev and b["gpu"] == "sim0"]
assert one("knod_rx_bytes_total", netdev=netdev, gpu="sim0") == a_bytes + sum(b["rx_bytes"] for b in live)
assert one("knod_rx_packets_total", netdev=netdev, gpu="sim0") == a_packets + sum(b["rx_packets"] for b in live)
assert one("knod_journal_pending_records") == status["pending_journal_records"]
assert one("knod_journal_available") == (1 if status["journal_available"] else 0)
for k in status["sinks"].get("each", []):
    assert one("knod_sink_written_records_total", sink=k["name"]) == k["written"], k
    assert one("knod_sink_failed_records_total", sink=k["name"]) == k["failed"], k
    assert one("knod_sink_dropped_records_total", sink=k["name"]) == k["dropped"], k
assert one('knod_requests_total{decision="allow"}') == 2
# Tagged bindings per job, as bindings --json shows their tags.
assert one("knod_job_bindings", job_tag="10.0.0.1:29500") == sum(
    1 for b in bindings if b["job"] == "10.0.0.1:29500") == 1, q("knod_job_bindings")
assert one('knod_bindings_ended_total{reason="release"}') == 1
PY
}
wait_until 120 "Prometheus to return what status --json and bindings --json show" agree
check "PromQL through Prometheus' HTTP API returns what status --json and bindings --json show" \
    '[ $? -eq 0 ]' || cat "$work/agree.why"
check "the live binding is one, active, with B's 8 bytes" \
    'python3 -c "import json,sys; b=json.load(open(sys.argv[1])); assert [(x[\"state\"], x[\"rx_bytes\"]) for x in b] == [(\"active\", 8)], b" "$work/bindings.json"'
# rate() needs two samples: waited for, one scrape a second.
rate_series() { [ "$(promql 'rate(knod_rx_bytes_total[1m]) >= 0' | wc -l)" = 1 ]; }
wait_until 60 "rate() over knod_rx_bytes_total" rate_series
check "rate() over the RX counter works (a counter, one series per netdev and GPU)" '[ $? -eq 0 ]'

# --- a hung daemon (issue 52): knod_up 0 within the collector's own deadline -----------------
# SIGSTOP: the bus takes the calls and nobody answers. sd-bus's default is 25 s a call (two
# calls: ~50 s of knod_up 1); the guard (20 s) only detects a hang.
kill -STOP "$KNOD_DAEMON_PID"
timeout 20 "$cli" metrics --textfile "$textdir" >"$work/out" 2>&1
hung_rc=$?
kill -CONT "$KNOD_DAEMON_PID"
check "a stopped daemon: metrics returns in its deadline (exit 2) and the file holds knod_up 0 alone" \
    '[ $hung_rc -eq 2 ] && [ "$(grep -v "^#" "$textdir/knod-policy.prom")" = "knod_up 0" ]' || cat "$work/out"
"$cli" metrics --textfile "$textdir" >"$work/out" 2>&1
check "... and knod_up 1 again once it runs" 'grep -q "^knod_up 1$" "$textdir/knod-policy.prom"'

# --- the daemon gone: the file says knod_up 0, and so does Prometheus ---------------------
echo >&"$b_in" 2>/dev/null
exec {b_in}>&- {b_out}<&-
wait "$b_pid" 2>/dev/null
b_pid=
kill -TERM "$KNOD_DAEMON_PID"
daemon_gone() {
    ! kill -0 "$KNOD_DAEMON_PID" 2>/dev/null ||
        [ "$(cut -d' ' -f3 "/proc/$KNOD_DAEMON_PID/stat" 2>/dev/null)" = Z ]
}
wait_until 60 "knod-policyd to exit" daemon_gone
"$cli" metrics --textfile "$textdir" >"$work/out" 2>&1
check "without the daemon: exit 2, and the file holds knod_up 0 alone" \
    '[ $? -eq 2 ] && [ "$(grep -v "^#" "$textdir/knod-policy.prom")" = "knod_up 0" ]'
down_seen() { [ "$(promql knod_up | python3 -c 'import json,sys; print([json.loads(l)[1] for l in sys.stdin])')" = "['0']" ]; }
wait_until 60 "Prometheus to see knod_up 0" down_seen
check "Prometheus sees knod_up 0" '[ $? -eq 0 ]'

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
