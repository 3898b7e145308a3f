#!/usr/bin/env bash
# The Cockpit page (cockpit/knod, issue 37) in a real browser against the real parts:
# knod-policyd with the sim driver on a private bus (scripts/knod-sandbox.sh), Cockpit 287's
# cockpit-ws with a local session (no login) for an admin (uid 1 in the policy's admin group,
# which is also the state dir's group: it reads the published journal snapshot) and for a plain
# user (nobody), and headless Chromium driven over the DevTools protocol by page_test.py.
# Exit 77 (skipped) only where cockpit-ws, chromium or python3-websocket cannot be found; the
# README's test command installs them.
#
# Usage: cockpit_page_test.sh BUILD_DIR SOURCE_DIR KNOD_TEST_CLIENT [SCREENSHOT.png]
set -u
if [ "${1-}" != --inside ]; then
    build=$(readlink -f "$1") src=$(readlink -f "$2") client=$(readlink -f "$3")
    shot=${4:-$build/tests/cockpit-knod.png}
    browser=$(command -v chromium || command -v chromium-browser || true)
    ws=/usr/lib/cockpit/cockpit-ws
    for need in "$browser" "$ws" "$(command -v cockpit-bridge || true)"; do
        [ -n "$need" ] && [ -x "$need" ] ||
            { echo "SKIP: cockpit-ws, cockpit-bridge or chromium is not installed (scripts/install-deps.sh)"; exit 77; }
    done
    /usr/bin/python3 -c 'import websocket, PIL' 2>/dev/null ||
        { echo "SKIP: python3-websocket or python3-pil is not installed (scripts/install-deps.sh)"; exit 77; }
    work=$(mktemp -d /tmp/knod-cockpit.XXXXXX)
    chmod 0755 "$work"
    trap 'rm -rf "$work"' EXIT
    # A gid no group has, as the policy's admin group (a number: docs/policy.md).
    admin_gid=$((61000 + $$ % 4000))
    cat >"$work/policy.toml" <<EOF
[settings]
admin_group = "$admin_gid"

[[rule]]
name = "no-port-5002"
action = "deny"
any_caller = true
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5002"]

[[rule]]
name = "sim-page"
users = ["root", "nobody"]
netdevs = ["knodsim*"]
gpus = ["sim*"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
EOF
    install -d -m 0750 -g "$admin_gid" "$work/state"
    "$src/scripts/knod-sandbox.sh" --build "$build" --unique-sim --policy "$work/policy.toml" \
        --keep-state "$work/state" --daemon-arg --snapshot-interval=1 -- \
        "$0" --inside "$build" "$src" "$client" "$shot" "$work" "$admin_gid"
    exit $?
fi

shift
build=$1 src=$2 client=$3 shot=$4 work=$5 admin_gid=$6
. "$src/scripts/wait-lib.sh"
browser=$(command -v chromium || command -v chromium-browser)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT

# The page as the package installs it, in a data dir of this run's own (Cockpit finds packages
# in $XDG_DATA_HOME/cockpit/NAME): a copy, so that other uids need not reach the source tree.
mkdir -p "$work/share/cockpit"
cp -r "$src/cockpit/knod" "$work/share/cockpit/knod"
chmod -R a+rX "$work/share"

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# cockpit-ws for one user, on a free port. The bridge of a local session starts a session bus
# and an ssh-agent of its own where none is named, which would outlive the test: both named. (another if a neighbour took it first); writes the
# page's URL to $work/NAME.url. Not in $(...): its pid must reach this shell's cleanup.
start_ws() {
    local name=$1 port
    shift
    mkdir -p "$work/$name"
    chown "$1" "$work/$name"
    for _ in 1 2 3 4 5; do
        port=$(free_port)
        setsid setpriv "${@:2}" env -i PATH="$build/cli:/usr/bin:/bin" HOME="$work/$name" \
            XDG_RUNTIME_DIR="$work/$name" XDG_DATA_HOME="$work/share" \
            DBUS_SYSTEM_BUS_ADDRESS="$DBUS_SYSTEM_BUS_ADDRESS" \
            DBUS_SESSION_BUS_ADDRESS="unix:path=$work/$name/no-session-bus" \
            SSH_AUTH_SOCK="$work/$name/no-agent" \
            /usr/lib/cockpit/cockpit-ws --address 127.0.0.1 --port "$port" \
            --local-session=cockpit-bridge >"$work/$name.log" 2>&1 &
        local pid=$!
        pids+=("$pid")
        if wait_until 60 "cockpit-ws for $name on port $port" bash -c "kill -0 $pid 2>/dev/null || exit 0; curl -sf -o /dev/null http://127.0.0.1:$port/cockpit/@localhost/knod/manifest.json && echo up >$work/$name.up" &&
            [ -s "$work/$name.up" ]; then
            echo "http://127.0.0.1:$port/cockpit/@localhost/knod/index.html" >"$work/$name.url"
            return 0
        fi
        cat "$work/$name.log" >&2
    done
    return 1
}
start_ws admin 1 --reuid=1 --regid=1 --groups="$admin_gid" ||
    { echo "not ok - cockpit-ws did not serve the page for the admin"; exit 1; }
start_ws plain 65534 --reuid=65534 --regid=65534 --clear-groups ||
    { echo "not ok - cockpit-ws did not serve the page for the plain user"; exit 1; }
admin_url=$(cat "$work/admin.url") plain_url=$(cat "$work/plain.url")
echo "# admin page $admin_url, plain user's page $plain_url"

mkdir -p "$work/chrome"
setsid "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --force-device-scale-factor=1 --force-color-profile=srgb --user-data-dir="$work/chrome" \
    --remote-debugging-port=0 --remote-allow-origins='*' about:blank >"$work/chromium.log" 2>&1 &
pids+=("$!")
# Chromium picks its DevTools port and writes it here: no port to race for.
wait_until 120 "Chromium's DevTools port" test -s "$work/chrome/DevToolsActivePort" ||
    { echo "not ok - chromium did not start"; cat "$work/chromium.log"; exit 1; }
cdp_port=$(head -1 "$work/chrome/DevToolsActivePort")

/usr/bin/python3 "$src/tests/cockpit/page_test.py" --cdp-port "$cdp_port" --admin-url "$admin_url" \
    --plain-url "$plain_url" --client "$client" --cli "$build/cli/knod-policy" \
    --netdev "$KNOD_SIM_NETDEV" --netns "$KNOD_SIM_NETNS" --bus "$DBUS_SYSTEM_BUS_ADDRESS" \
    --plain-uid 65534 --screenshot "$shot" --journal "$KNOD_STATE_DIR/journal.db"
rc=$?
if [ "$rc" -ne 0 ]; then
    for log in admin plain; do echo "--- cockpit-ws ($log)"; tail -20 "$work/$log.log"; done
fi
exit $rc
