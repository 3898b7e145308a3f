#!/usr/bin/env bash
# The Python package's tests (ctest python.knod): pytest, Debian's python3-pytest under
# /usr/bin/python3, against a real knod-policyd with the sim data path on a private bus
# (scripts/knod-sandbox.sh), with names of this run's own so parallel runs never collide. The
# package is imported from the source tree and binds the build tree's libknod-client.so.1.
# Afterwards nothing the daemon made may be left.
# Usage: run.sh SOURCE_DIR BUILD_DIR [PYTEST_ARGS...]
set -uo pipefail
src=$(cd "${1:?usage: run.sh SOURCE_DIR BUILD_DIR}" && pwd)
build=$(cd "${2:?usage: run.sh SOURCE_DIR BUILD_DIR}" && pwd)
shift 2
[ "$(id -u)" -eq 0 ] || { echo "python tests: need root (the sim's veth, setpriv)"; exit 77; }
/usr/bin/python3 -c 'import pytest, numpy' 2>/dev/null ||
    { echo "python tests: python3-pytest or python3-numpy missing (scripts/install-deps.sh)"; exit 77; }
n=$(($$ % 100000))
export KNOD_SIM_NETDEV=knodsimp$n KNOD_SIM_NETNS=knod-simp$n
pins=/sys/fs/bpf/knodpy$n
export KNOD_CLIENT_LIBRARY=$build/client/libknod-client.so.1 PYTHONPATH=$src/python
export KNOD_CLI=$build/cli/knod-policy KNOD_CNI=$build/cni/knod-cni PYTHONDONTWRITEBYTECODE=1
# Callers that really are other users, with names of this run's own: a holder, a user with a
# quota of one binding, a user no rule names. (The daemon must find a user name for a caller.)
work=$(mktemp -d /tmp/knod-pytest.XXXXXX)
users=()
cleanup() {
    for u in "${users[@]}"; do userdel "$u" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
for role in holder quota nobody; do
    name=knodpy-$role-$n
    useradd --system --no-create-home --user-group --shell /usr/sbin/nologin "$name" ||
        { echo "python tests: cannot make user $name"; exit 1; }
    users+=("$name")
    export "KNOD_TEST_${role^^}_UID=$(id -u "$name")"
done
sed -e "s/@HOLDER_USER@/knodpy-holder-$n/" -e "s/@QUOTA_USER@/knodpy-quota-$n/" \
    "$src/tests/python/policy.toml" >"$work/policy.toml"
chmod 755 "$work"
"$src/scripts/knod-sandbox.sh" --build "$build" --policy "$work/policy.toml" \
    --daemon-arg "--sim-netdev=$KNOD_SIM_NETDEV" --daemon-arg "--sim-netns=$KNOD_SIM_NETNS" \
    --daemon-arg "--bpf-pin-root=$pins" --daemon-arg --sim-queues=8 --daemon-arg --journald=false \
    --daemon-arg --linux-audit=false -- \
    /usr/bin/python3 -m pytest -p no:cacheprovider -q -rs "$src/tests/python" "$@"
rc=$?
left=
[ -e "/sys/class/net/$KNOD_SIM_NETDEV" ] && left="$left link $KNOD_SIM_NETDEV"
[ -e "/run/netns/$KNOD_SIM_NETNS" ] && left="$left namespace $KNOD_SIM_NETNS"
[ -e "$pins" ] && left="$left pins $pins"
if [ -n "$left" ]; then
    echo "python tests: left behind:$left"
    exit 1
fi
exit $rc
