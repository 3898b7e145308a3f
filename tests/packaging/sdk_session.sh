#!/usr/bin/env bash
# The SDK packages as a new user meets them, after package_test.sh's dpkg -i: programs of one's
# own built outside the source tree against the installed files only (a C and a C++ program with
# `pkg-config --cflags --libs knod-client`, a CMake project with find_package(knod-client)) and
# the installed Python example, each run against the installed knod-policyd with the sim driver
# on a private bus that loads the installed bus policies: data lands byte-exact, the binding is
# released, a denial names its rule. Prints TAP-like ok/not ok lines.
# Usage: sdk_session.sh SOURCE_DIR WORK_DIR
set -uo pipefail
src=$1 work=$2
. "$src/scripts/wait-lib.sh"
passed=0 failed=0
# Returns the check's verdict, so that `check ... || show-why` prints why a check failed.
check() { if eval "$2"; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; return 1; fi; }
pids=()
n=$(($$ % 100000))
netdev=knodsimk$n netns=knod-simk$n pins=/sys/fs/bpf/knodpk$n
cleanup() {
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; wait "${pids[i]}" 2>/dev/null; done
}
trap cleanup EXIT

# --- what the -dev package gives a build --------------------------------------------------
sdk=$work/sdk
mkdir -p "$sdk" && cp "$src"/tests/packaging/sdk/* "$sdk/" && chmod -R a+rX "$work"
cd "$sdk" || exit 1
check "pkg-config knows knod-client 0.1.0" '[ "$(pkg-config --modversion knod-client)" = 0.1.0 ]'
check "the C program builds with pkg-config --cflags --libs knod-client" \
    'cc -std=c11 -Wall -Wextra -Werror receive.c $(pkg-config --cflags --libs knod-client) -o c-receive'
check "the C++ program builds with pkg-config --cflags --libs knod-client" \
    'c++ -std=c++17 -Wall -Wextra -Werror receive.cpp $(pkg-config --cflags --libs knod-client) -o cpp-receive'
check "a CMake project finds knod-client and builds" \
    'cmake -S . -B cmake-build >cmake.log 2>&1 && cmake --build cmake-build >>cmake.log 2>&1' || cat cmake.log
# Captured first: grep -q closing the pipe at its match would fail the pipeline under pipefail.
links=$(ldd c-receive)
check "the programs link libknod-client.so.1 from the package" \
    'grep -Eq "libknod-client.so.1 => (/usr)?/lib/[^ ]*/libknod-client.so.1" <<<"$links"'
check "the D-Bus interface XML is installed" \
    'grep -q "interface name=\"org.knod.Policy1.Manager\"" /usr/share/dbus-1/interfaces/org.knod.Policy1.xml'
check "python3 imports knod from the package" \
    '[ "$(cd / && env -u PYTHONPATH -u KNOD_CLIENT_LIBRARY /usr/bin/python3 -c "import knod; print(knod.__file__, knod.library_version())")" = "/usr/lib/python3/dist-packages/knod/__init__.py 0.1.0" ]'

# --- the installed daemon with the sim, on a private bus ------------------------------------
mkdir -m 0755 "$work/sdkbus"
# scripts/private-bus.conf.in, with the installed bus policy.
sed -e "s|@SOCKET@|$work/sdkbus/socket|" \
    -e "s|@POLICY_CONF@|/usr/share/dbus-1/system.d/org.knod.Policy1.conf|" \
    "$src/scripts/private-bus.conf.in" >"$work/sdkbus/bus.conf"
dbus-daemon --config-file="$work/sdkbus/bus.conf" --nofork --nopidfile &
pids+=($!)
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/sdkbus/socket
wait_until 60 "the bus socket" test -S "$work/sdkbus/socket"
cat >"$work/sdkbus/policy.toml" <<'POLICY'
[[rule]]
name = "no-nobody"
action = "deny"
users = ["nobody"]

[[rule]]
name = "sdk-sim"
users = ["root"]
netdevs = ["knodsim*"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
POLICY
mkdir -m 0700 "$work/sdkstate"
/usr/sbin/knod-policyd --bus-address="$DBUS_SYSTEM_BUS_ADDRESS" --policy "$work/sdkbus/policy.toml" \
    --state-dir "$work/sdkstate" --driver=sim --sim-netdev="$netdev" --sim-netns="$netns" \
    --bpf-pin-root="$pins" --journald=false --linux-audit=false 2>"$work/sdkbus/daemon.log" &
daemon=$!
pids+=($daemon)
up=no
daemon_answers() { knod-policy status >/dev/null 2>&1; }
wait_until 120 "the installed daemon to answer status" daemon_answers && up=yes
check "the installed daemon serves the sim on the private bus" '[ $up = yes ]' || cat "$work/sdkbus/daemon.log"

# Starts PROGRAM..., waits for its "bound" line, sends DATA twice to PORT from the wire side,
# waits for it to exit; its output is in $work/out.
receive() {
    local port=$1 data=$2
    shift 2
    # Emptied here, not by the redirection below: that runs in the child, and a wait that read
    # the file first found the previous program's "bound" line and sent before this program had
    # bound (its datagrams went to the stack; one session in two under load, a soak flake).
    : >"$work/out"
    "$@" >"$work/out" 2>&1 &
    local pid=$!
    # A Python start on a loaded machine takes seconds: traffic sent before the binding is
    # active is the stack's, and the client would wait for ever.
    wait_until 120 "$1 to print bound or activated" grep -qE '^(bound|activated)' "$work/out"
    knod-policy sim-send --netns "$netns" --to "10.99.0.2:$port" --count 2 --data "$data" >/dev/null
    wait "$pid"
    echo "exit $?" >>"$work/out"
}
# What a receive check that failed saw: the program's output and exit, the daemon's last words.
receive_failed() {
    sed 's/^/# program: /' "$work/out"
    tail -20 "$work/sdkbus/daemon.log" | sed 's/^/# daemon: /'
    # Where the datagrams went: the binding's journal row (its counters once it ended), the sim
    # NIC's per-queue counters (XDP redirects and drops, nonzero only) and the wire end's.
    sqlite3 "$work/sdkstate/journal.db" "select id, ended_us is not null, end_reason, rx_bytes,
        rx_packets, dropped_packets from sessions order by started_us desc limit 1" 2>&1 |
        sed 's/^/# session: /'
    ethtool -S "$netdev" 2>&1 | grep -v ': 0$' | sed 's/^/# nic: /'
    ip -n "$netns" -s link show 2>&1 | sed 's/^/# wire: /'
    knod-policy status 2>&1 | sed 's/^/# status: /' # the sim's counters (delivered, undeliverable)
}
payload=sdk-$RANDOM-$RANDOM
receive 5301 "$payload" ./c-receive "$netdev" "udp 10.99.0.0/24:* -> 10.99.0.2:5301" $((2 * ${#payload}))
check "C: granted by rule sdk-sim, the bytes landed, released" \
    'grep -q "^bound b[0-9a-f]* sdk-sim$" $work/out && grep -qx "received $((2 * ${#payload})) $payload$payload" $work/out && grep -qx "ended 1 release" $work/out' ||
    receive_failed
receive 5302 "$payload" ./cpp-receive "$netdev" "udp 10.99.0.0/24:* -> 10.99.0.2:5302" $((2 * ${#payload}))
check "C++: granted by rule sdk-sim, the bytes landed, released" \
    'grep -q "^bound b[0-9a-f]* sdk-sim$" $work/out && grep -qx "received $((2 * ${#payload})) $payload$payload" $work/out && grep -qx "ended 1 release" $work/out' ||
    receive_failed
receive 5303 "$payload" ./cmake-build/receive-cmake "$netdev" "udp 10.99.0.0/24:* -> 10.99.0.2:5303" ${#payload}
check "the CMake-built program receives too" 'grep -q "^received " $work/out' || receive_failed
for prog in c-receive cpp-receive; do
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "./$prog" --deny "$netdev" "udp 10.99.0.0/24:* -> 10.99.0.2:5304" 2>&1)
    check "$prog as nobody: denied, with the D-Bus name and the deciding rule" \
        '[ "$out" = "denied denied org.knod.Policy1.Error.Denied no-nobody" ]' || echo "$out"
done
example=/usr/share/doc/python3-knod/examples/receive.py
receive 5305 "$payload" env -u PYTHONPATH -u KNOD_CLIENT_LIBRARY -C / /usr/bin/python3 "$example" \
    --netdev "$netdev" --flow "udp 10.99.0.0/24:* -> 10.99.0.2:5305" --packets 2 --timeout-ms 10000
check "the article's Python example, installed, receives and releases" \
    'grep -q "by rule .sdk-sim." $work/out && grep -qx "buffer holds $((2 * ${#payload})) byte(s) from 2 packet(s): \"$payload$payload\"" $work/out && grep -q "^released b[0-9a-f]* (release)$" $work/out' ||
    receive_failed
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$example" --netdev "$netdev" \
    --flow "udp 10.99.0.0/24:* -> 10.99.0.2:5306" 2>&1)
rc=$?
check "the Python example as nobody: exit 1 naming the rule" \
    '[ $rc -eq 1 ] && grep -qx "deciding rule: no-nobody" <<<"$out"' || echo "$out"
check "no bindings left" '[ "$(knod-policy bindings --json)" = "[]" ]'
kill -TERM "$daemon" && wait "$daemon"
check "the daemon stopped cleanly and removed its sim" \
    '[ ! -e /sys/class/net/$netdev ] && [ ! -e /run/netns/$netns ] && [ ! -e $pins ]'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
