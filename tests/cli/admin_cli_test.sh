#!/usr/bin/env bash
# knod-policy as an admin's daily tool (issue 22), without a daemon: explain says whom it
# evaluated and resolves GPU names as the daemon does, check --host warns about names this host
# does not have, doctor refuses devices it does not have, and both programs keep one exit-code
# convention, stated in every --help.
# Usage: admin_cli_test.sh KNOD_POLICY KNOD_POLICYD SOURCE_DIR
set -u
cli=$(readlink -f "$1") daemon=$(readlink -f "$2") src=$3
work=$(mktemp -d)
veth=
cleanup() {
    [ -n "$veth" ] && ip link del "$veth" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
run() { "$@" >"$work/out" 2>&1; rc=$?; } # run COMMAND...: output in $work/out, exit in $rc
py() { python3 -c "$@"; }
hosts=$src/tests/data/hosts

# --- explain: the caller first, every name of the GPU, a denial without grant fields ---------
cat >"$work/gpu.toml" <<'EOF'
[[rule]]
name = "by-pci"
any_caller = true
gpus = ["0000:03:00.0"]
max_region = "1MiB"
flows = ["udp * -> *:5000"]

[[rule]]
name = "by-node"
any_caller = true
gpus = ["/dev/dri/renderD*"]
max_region = "1MiB"
flows = ["udp * -> *:6000"]
EOF
ex=("$cli" explain --policy "$work/gpu.toml" --host-root "$hosts/mi250x-cx6" --user 65534 --group 65534
    --netdev eth2 --bytes 4096)
run "${ex[@]}" --gpu /dev/dri/renderD128 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
[ "$rc" -eq 0 ] && grep -q "^rule:     by-pci" "$work/out" &&
    ok "explain: a rule naming the GPU by PCI address matches a request by render node" ||
    { not_ok "explain render node vs PCI rule (exit $rc)"; cat "$work/out"; }
run "${ex[@]}" --gpu 0000:03:00.0 --flow 'udp 10.0.0.1:* -> 10.0.0.2:6000'
[ "$rc" -eq 0 ] && grep -q "^rule:     by-node" "$work/out" &&
    grep -q "^gpu:      0000:03:00.0, /dev/dri/renderD128 (this host's GPU 0000:03:00.0" "$work/out" &&
    ok "explain: a rule naming the render node matches a request by PCI address, and says so" ||
    { not_ok "explain PCI vs render node rule (exit $rc)"; cat "$work/out"; }
run "${ex[@]}" --gpu 0000:c1:00.0 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
[ "$rc" -eq 1 ] && grep -q "no GPU of this host goes by it: matched as given" "$work/out" &&
    ok "explain: a GPU this host does not have is matched by the name given, and said so" ||
    { not_ok "explain unknown GPU (exit $rc)"; cat "$work/out"; }

run "${ex[@]}" --gpu 0000:c1:00.0 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000' --json
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["decision"]=="deny", d
for k in ("iommu","key_lifetime_s","rule","rule_location"): assert k not in d, k
assert d["caller"]["uid"]==65534 and d["caller"]["uid_source"]=="--user" and "executable" in d["caller"] and "unit" in d["caller"], d
assert d["gpu"]["names"]==["0000:c1:00.0"] and d["gpu"]["host_gpu"] is None, d' "$work/out" && [ "$rc" -eq 1 ] &&
    ok "explain --json: a default denial carries no grant fields and no empty rule" ||
    { not_ok "explain --json denial (exit $rc)"; cat "$work/out"; }
run "${ex[@]}" --gpu /dev/dri/renderD128 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000' --json
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["decision"]=="allow" and d["iommu"]=="translated" and d["key_lifetime_s"]==3600 and d["rule"]=="by-pci", d
assert d["gpu"]["host_gpu"]=="0000:03:00.0" and d["gpu"]["names"]==["0000:03:00.0","/dev/dri/renderD128"], d' "$work/out" && [ "$rc" -eq 0 ] &&
    ok "explain --json: a grant carries the rule, iommu and key lifetime, and the GPU's names" ||
    { not_ok "explain --json grant (exit $rc)"; cat "$work/out"; }
cat >"$work/deny.toml" <<'EOF'
[[rule]]
name = "no-nobody"
action = "deny"
users = ["nobody"]
EOF
run "$cli" explain --policy "$work/deny.toml" --user nobody --netdev eth2 --gpu sim0 --bytes 4096 \
    --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000' --json
py 'import json,sys; d=json.load(open(sys.argv[1])); assert d["rule"]=="no-nobody" and d["rule_location"].endswith(":1:1") and "iommu" not in d and "key_lifetime_s" not in d, d' "$work/out" && [ "$rc" -eq 1 ] &&
    ok "explain --json: a denial by a rule names that rule and nothing it would grant" ||
    { not_ok "explain --json deny rule (exit $rc)"; cat "$work/out"; }

# Without --user: the invoking user, named before anything else; under sudo, SUDO_UID.
run "$cli" explain --policy "$work/gpu.toml" --netdev eth2 --gpu sim0 --bytes 4096 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
head -1 "$work/out" | grep -q "^caller:   uid $(id -u) .*\[you\]" && sed -n 2p "$work/out" | grep -q "^unit:     -  (none; --unit or --cgroup)" &&
    sed -n 3p "$work/out" | grep -q "^exe:      -  (none; --exe)" &&
    sed -n 4p "$work/out" | grep -q "^process:  proven" && sed -n 5p "$work/out" | grep -q "^gpu:      sim0" &&
    ok "explain prints the evaluated caller (uid, groups, unit, executable, process proof) and the GPU first" ||
    { not_ok "explain caller header (exit $rc)"; cat "$work/out"; }

# --unproven: a caller known by its pid alone is granted by no rule naming a unit (issue #32).
cat >"$work/unit.toml" <<'EOF'
[[rule]]
name = "inference"
units = ["inference@*.service"]
netdevs = ["eth2"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.0.0.0/24:* -> 10.0.0.2:5000"]
iommu = "any"
EOF
run "$cli" explain --policy "$work/unit.toml" --unit inference@1.service --netdev eth2 --gpu sim0 \
    --bytes 4096 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
granted=$rc
run "$cli" explain --policy "$work/unit.toml" --unit inference@1.service --netdev eth2 --gpu sim0 \
    --bytes 4096 --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000' --unproven
[ "$granted" -eq 0 ] && [ "$rc" -eq 1 ] && grep -q "^process:  not proven" "$work/out" &&
    grep -q "inference (.*): caller's process is not proven" "$work/out" &&
    ok "explain --unproven: a units rule grants a proven caller only, and says why" ||
    { not_ok "explain --unproven (exit $granted, then $rc)"; cat "$work/out"; }
if [ "$(id -u)" -eq 0 ]; then
    run env SUDO_UID=65534 "$cli" explain --policy "$work/gpu.toml" --netdev eth2 --gpu sim0 --bytes 4096 \
        --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000' --json
    py 'import json,sys; c=json.load(open(sys.argv[1]))["caller"]; assert c["uid"]==65534 and "SUDO_UID" in c["uid_source"], c' "$work/out" &&
        ok "explain under sudo evaluates the person who ran sudo, not root" ||
        { not_ok "explain SUDO_UID (exit $rc)"; cat "$work/out"; }
    run env SUDO_UID=65534 "$cli" explain --policy "$work/gpu.toml" --user 0 --netdev eth2 --gpu sim0 --bytes 4096 \
        --flow 'udp 10.0.0.1:* -> 10.0.0.2:5000'
    grep -q "^caller:   uid 0 (root) \[--user\]" "$work/out" && ok "explain --user wins over SUDO_UID" ||
        { not_ok "explain --user under sudo"; cat "$work/out"; }
fi

# --- check: a policy that can grant nothing; names this host does not have ---------------------
printf '[settings]\nauditor_group = "root"\n' >"$work/empty.toml"
run "$cli" check --no-host "$work/empty.toml"
[ "$rc" -eq 0 ] && grep -q "$work/empty.toml:1:1: warning: the policy has no rules: every request is denied" "$work/out" &&
    ok "check warns about a policy without rules (exit 0)" || { not_ok "check empty policy (exit $rc)"; cat "$work/out"; }
run "$cli" check --no-host "$work/deny.toml"
[ "$rc" -eq 0 ] && grep -q "warning: every rule denies: no request can be granted" "$work/out" &&
    ok "check warns about a deny-only policy (exit 0)" || { not_ok "check deny-only (exit $rc)"; cat "$work/out"; }
nogroup=knod-nogroup-$$ nouser=knod-nouser-$$
cat >"$work/names.toml" <<EOF
[settings]
auditor_group = "root"
admin_group = "$nogroup-admin"

[[rule]]
name = "ml"
groups = ["$nogroup"]
users = ["$nouser", "root"]
netdevs = ["ens9f*"]
gpus = ["0000:c1:00.0", "/dev/dri/renderD128"]
max_region = "1MiB"
flows = ["udp * -> *:5000"]

[[rule]]
name = "known"
groups = ["root"]
netdevs = ["eth2"]
gpus = ["0000:03:00.0"]
iommu = "any"
max_region = "1MiB"
flows = ["udp * -> *:5001"]
EOF
run "$cli" check --host-root "$hosts/mi250x-cx6" "$work/names.toml"
[ "$rc" -eq 0 ] && grep -q "names.toml:5:1: warning: rule 'ml': group '$nogroup' does not exist on this host" "$work/out" &&
    grep -q "warning: rule 'ml': user '$nouser' does not exist on this host" "$work/out" &&
    grep -q "warning: admin_group '$nogroup-admin' is not a group on this host" "$work/out" &&
    grep -q "warning: rule 'ml': netdevs 'ens9f\*' matches no network device on this host (here: eth2, eth3)" "$work/out" &&
    grep -q "warning: rule 'ml': gpus '0000:c1:00.0' matches no GPU on this host (here: 0000:03:00.0, /dev/dri/renderD128)" "$work/out" &&
    ! grep -q "renderD128' matches no GPU\|user 'root'\|'known'" "$work/out" &&
    ok "check --host warns about users, groups, netdevs and GPUs this host does not have, and only those" ||
    { not_ok "check --host names (exit $rc)"; cat "$work/out"; }
run "$cli" check --host-root "$hosts/mi250x-cx6" --json "$work/names.toml"
py 'import json,sys; d=json.load(open(sys.argv[1])); w=[x for x in d["diagnostics"] if x["severity"]=="warning"]
assert d["valid"] and d["host_checked"] and len(w)==5 and all(x["line"] in (1,5) for x in w), d' "$work/out" && [ "$rc" -eq 0 ] &&
    ok "check --host --json: the warnings as diagnostics, valid stays true" || { not_ok "check --host --json (exit $rc)"; cat "$work/out"; }
run "$cli" check --no-host "$work/names.toml"
[ "$rc" -eq 0 ] && ! grep -q "warning" "$work/out" && ok "check --no-host leaves the host out" ||
    { not_ok "check --no-host (exit $rc)"; cat "$work/out"; }
run "$cli" check --host-root "$hosts/no-iommu" "$work/names.toml"
grep -q "rule 'ml': iommu = 'translated', but this host has no IOMMU" "$work/out" && ! grep -q "rule 'known': iommu" "$work/out" &&
    ok "check --host warns about an IOMMU requirement a host without an IOMMU never meets" ||
    { not_ok "check --host no IOMMU (exit $rc)"; cat "$work/out"; }
printf '[[rule]]\nname = "bad"\nmax_region = "1MiB"\nflows = ["udp * -> *:5000"]\ngroups = ["%s"]\nbogus = 1\n' "$nogroup" >"$work/bad.toml"
run "$cli" check --host "$work/bad.toml"
[ "$rc" -eq 1 ] && grep -q "error" "$work/out" && ok "check --host: errors stay errors (exit 1)" ||
    { not_ok "check --host with errors (exit $rc)"; cat "$work/out"; }

# --- doctor: devices the host does not have are errors, virtual netdevs are what they are -----
run "$cli" doctor --host-root "$hosts/mi250x-cx6" --gpu 0000:c1:00.0
[ "$rc" -eq 2 ] && grep -q "no GPU named 0000:c1:00.0 on this host; GPUs here: 0000:03:00.0 (/dev/dri/renderD128)" "$work/out" &&
    ! grep -q 'iommu = "any"' "$work/out" &&
    ok "doctor --gpu of an absent GPU: exit 2 naming the GPUs it has, no security advice" ||
    { not_ok "doctor absent GPU (exit $rc)"; cat "$work/out"; }
run "$cli" doctor --host-root "$hosts/mi250x-cx6" --nic ens9f0
[ "$rc" -eq 2 ] && grep -q "no netdev or PCI NIC named ens9f0 on this host; netdevs here: .*eth2 (0000:04:00.0)" "$work/out" &&
    ok "doctor --nic typo: exit 2 naming the netdevs it has" || { not_ok "doctor --nic typo (exit $rc)"; cat "$work/out"; }
run "$cli" doctor --gpu 0000:ff:1f.7
[ "$rc" -eq 2 ] && ! grep -q 'iommu = "any"' "$work/out" && ok "doctor on this machine: an absent GPU is exit 2" ||
    { not_ok "doctor live absent GPU (exit $rc)"; cat "$work/out"; }
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null; then
    veth=kadm$$
    if ip link add "$veth" type veth peer name "${veth}p" 2>/dev/null; then
        run "$cli" doctor --nic "$veth" --json
        py 'import json,sys; d=json.load(open(sys.argv[1])); c=[x for x in d["checks"] if x["id"]=="nic.virtual"]
assert len(c)==1 and c[0]["subject"]==sys.argv[2] and "veth" in c[0]["message"] and c[0]["status"]=="info", c
assert not any(x["id"].startswith("pair.") for x in d["checks"]), d["checks"]' "$work/out" "$veth" && [ "$rc" -le 1 ] &&
            ok "doctor --nic VETH reports a virtual netdev for what it is" || { not_ok "doctor veth (exit $rc)"; cat "$work/out"; }
        ip link del "$veth" 2>/dev/null
    fi
    veth=
fi

# --- one exit-code convention, stated everywhere -------------------------------------------------
for sub in "" check explain status bindings revoke reload doctor sim-send audit "audit verify" \
    "audit sessions" "audit events" "audit show" "audit report" "audit export" "audit policy"; do
    # shellcheck disable=SC2086
    "$cli" $sub --help >"$work/out" 2>&1
    grep -q "Exit codes: 0" "$work/out" || { not_ok "knod-policy $sub --help states no exit codes"; continue; }
    ok "knod-policy $sub --help states the exit codes"
done
run "$cli" status --bogus
[ "$rc" -eq 2 ] && ok "knod-policy: an unknown option is exit 2" || { not_ok "knod-policy unknown option (exit $rc)"; cat "$work/out"; }
run "$cli" bindings --count 2
[ "$rc" -eq 2 ] && grep -q "requires --watch" "$work/out" && ok "bindings --count without --watch is exit 2" || { not_ok "bindings --count alone (exit $rc)"; cat "$work/out"; }
run "$daemon" --version
[ "$rc" -eq 0 ] && grep -qx "knod-policyd [0-9][0-9.]*" "$work/out" && ok "knod-policyd --version" ||
    { not_ok "knod-policyd --version (exit $rc)"; cat "$work/out"; }
run "$daemon" --bogus
[ "$rc" -eq 2 ] && ok "knod-policyd: an unknown option is exit 2 (not CLI11's 109)" || { not_ok "knod-policyd unknown option (exit $rc)"; cat "$work/out"; }
run "$daemon" --help
[ "$rc" -eq 0 ] && grep -q "^Exit codes: 0" "$work/out" && ok "knod-policyd --help states the exit codes" ||
    { not_ok "knod-policyd --help (exit $rc)"; cat "$work/out"; }
run "$daemon" --bus-address "unix:path=$work/no-bus" --policy "$src/packaging/policy.toml" --state-dir "$work/state" \
    --driver sim --sim-datapath false --journald false --linux-audit false
[ "$rc" -eq 2 ] && grep -qF "$work/no-bus" "$work/out" && ok "knod-policyd: an unreachable bus is exit 2 naming the address" ||
    { not_ok "knod-policyd unreachable bus (exit $rc)"; cat "$work/out"; }
printf '[[rule]]\nname = "x"\nbogus = 1\n' >"$work/invalid.toml"
run "$daemon" --bus-address "unix:path=$work/no-bus" --policy "$work/invalid.toml" --state-dir "$work/state2" --driver sim
[ "$rc" -eq 78 ] && ok "knod-policyd: an invalid policy is exit 78 (EX_CONFIG)" || { not_ok "knod-policyd invalid policy (exit $rc)"; cat "$work/out"; }
if command -v dbus-daemon >/dev/null; then
    bus_addr=$(dbus-daemon --session --fork --print-address=1 --print-pid=3 3>"$work/bus.pid" | head -1)
    for sub in status bindings reload "revoke b1 --reason x"; do
        # shellcheck disable=SC2086
        run "$cli" $sub --bus-address "$bus_addr"
        [ "$rc" -eq 2 ] && grep -q "knod-policyd is not running" "$work/out" && grep -qF "$bus_addr" "$work/out" &&
            ok "$sub without the daemon: exit 2, says the daemon is missing and names the bus" ||
            { not_ok "$sub without the daemon (exit $rc)"; cat "$work/out"; }
    done
    kill "$(cat "$work/bus.pid")" 2>/dev/null
fi
for sub in status bindings reload; do
    run "$cli" $sub --bus-address "unix:path=$work/no-bus"
    [ "$rc" -eq 2 ] && grep -qF "cannot connect to the bus at unix:path=$work/no-bus" "$work/out" &&
        ok "$sub without a bus: exit 2, says the bus is missing and names it" ||
        { not_ok "$sub without a bus (exit $rc)"; cat "$work/out"; }
done

# Files that are not regular files: a FIFO is refused at once (it waited for a writer), a read
# error is an error (/proc/self/mem read as an empty, valid policy), for the policy and the
# journal alike. A 100 KB bus address is cut in the message, not echoed whole.
mkfifo "$work/fifo"
for args in "check $work/fifo" "audit events --db $work/fifo" "audit verify --db $work/fifo" \
    "check /proc/self/mem"; do
    # shellcheck disable=SC2086
    timeout 10 "$cli" $args >"$work/out" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -Eq "not a regular file|read failed" "$work/out" &&
        ok "$args: refused at once, saying why (exit $rc)" ||
        { not_ok "$args (exit $rc)"; cat "$work/out"; }
done
long=$(printf 'a%.0s' $(seq 100000))
"$cli" status --bus-address "$long" >"$work/out" 2>&1
[ "$(wc -c <"$work/out")" -lt 2000 ] && grep -q "100000 bytes" "$work/out" &&
    ok "a 100 KB bus address is cut in the error, with its length" ||
    not_ok "a 100 KB bus address: $(wc -c <"$work/out") bytes of error"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
