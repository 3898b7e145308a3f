#!/usr/bin/env python3
"""Checks one boot of host_checks.sh: the doctor's JSON (root and unprivileged) against what the
guest's own sysfs and lspci showed (facts.txt, lspci.txt) and against what the topology must give.

Usage: host_checks_verify.py MODE OUT_DIR   (MODE: dma, dma-fq, pt, passthrough, none)
Prints TAP-like "ok - ..." / "not ok - ..." lines; exit 1 when any is not ok.
"""
import json
import os
import re
import sys

mode, out = sys.argv[1], sys.argv[2]
failures = 0


def check(cond, what, detail=""):
    global failures
    if cond:
        print("ok - %s: %s" % (mode, what))
    else:
        failures += 1
        print("not ok - %s: %s" % (mode, what))
        for line in str(detail).splitlines():
            print("#   " + line)


def read(name):
    with open(os.path.join(out, name)) as f:
        return f.read()


# --- what the guest's kernel showed ------------------------------------------------------------
pci, netdevs, channels, groups = {}, {}, {}, {}
cmdline = ""
for line in read("facts.txt").splitlines():
    kind, _, rest = line.partition(" ")
    f = rest.split()
    if kind == "cmdline":
        cmdline = rest
    elif kind == "pci":
        pci[f[0]] = {"class": int(f[1], 16), "path": f[2], "group": f[3], "type": f[4]}
    elif kind == "netdev":
        netdevs[f[0]] = {"path": f[1], "rx": int(f[2])}
    elif kind == "channels":
        as_int = lambda s: int(s) if s.isdigit() else 0
        channels[f[0]] = as_int(f[1]) + as_int(f[2])
    elif kind == "group":
        groups[f[0]] = {"type": f[1], "devices": f[2:]}

# lspci -vvv: per function, the PCIe port type and the ACS capability/control bits.
ports = {}
current = None
for line in read("lspci.txt").splitlines():
    m = re.match(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
    if m:
        current = "0000:" + m.group(1)
        ports[current] = {"type": None, "acscap": None, "acsctl": None}
        continue
    if current is None:
        continue
    m = re.search(r"Express \(v\d\) (Root Port|Downstream Port|Upstream Port|Endpoint|Legacy Endpoint)", line)
    if m:
        ports[current]["type"] = m.group(1)
    for key, tag in (("acscap", "ACSCap:"), ("acsctl", "ACSCtl:")):
        if tag in line:
            ports[current][key] = set(re.findall(r"(\w+)\+", line.split(tag, 1)[1]))

ISOLATING = {"SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"}


def slot(a):
    return a.rsplit(".", 1)[0]


def multifunction(a):
    return any(slot(b) == slot(a) and b != a for b in pci)


def acs_isolates(a):
    """Linux's pci_acs_enabled() for the isolating flags, from lspci's view of the port."""
    p = ports.get(a, {})
    t = p.get("type")
    if t in ("Root Port", "Downstream Port") or (t in ("Upstream Port", "Endpoint") and multifunction(a)):
        if p.get("acscap") is None:
            return False
        needed = ISOLATING & p["acscap"]  # capabilities a port lacks count as hard-wired on
        return needed <= p["acsctl"]
    return t is not None  # single-function upstream ports and endpoints: not applicable


def upstream(a):
    """The bridges above a function, nearest first (from its sysfs path)."""
    parts = [p for p in pci[a]["path"].split("/") if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:", p)]
    return list(reversed(parts[:-1]))


def path(a, b):
    """Bridges crossed from a to b and the turnaround bridge (None: the root complex)."""
    ua, ub = upstream(a), upstream(b)
    for i, x in enumerate(ua):
        if x in ub:
            j = ub.index(x)
            return ua[: i + 1] + list(reversed(ub[:j])), x
    return ua + list(reversed(ub)), None


def isolation(a):
    g = pci[a]["group"]
    if g == "-":
        return None, None, []
    peers = sorted(d for d in groups[g]["devices"] if slot(d) != slot(a))
    return g, groups[g]["type"], peers


def expect_pair_iommu(req, nic, gpu):
    """(pass?, words the reason must contain) from the sysfs facts, as the rule semantics say."""
    for dev, role in ((nic, "NIC"), (gpu, "GPU")):
        g, t, peers = isolation(dev)
        if g is None:
            return False, [role + " " + dev, "not behind an IOMMU"]
        if peers:
            return False, [role + " " + dev, "IOMMU group " + g, "shares its group with"] + peers
        if t in ("DMA", "DMA-FQ"):
            continue
        if t == "identity" and req == "passthrough-ok":
            continue
        return False, [role + " " + dev, "IOMMU group " + g, "identity" if t == "identity" else t]
    if pci[nic]["group"] == pci[gpu]["group"]:
        return False, ["share IOMMU group " + pci[nic]["group"]]
    return True, []


# --- the kernel is what the topology says --------------------------------------------------------
iommu_on = mode != "none"
want_type = {"dma": "DMA", "dma-fq": "DMA-FQ", "pt": "identity", "passthrough": "identity"}.get(mode)
check(("knod.mode=" + mode) in cmdline, "booted in mode " + mode, cmdline)
if iommu_on:
    types = {g["type"] for g in groups.values()}
    check(types == {want_type}, "every IOMMU group is %s" % want_type, types)
else:
    check(not groups, "no IOMMU groups without an IOMMU", groups)

pairs = {}
for line in read("pairs.txt").splitlines():
    name, nic, nic_pci, gpu_pci = line.split()
    pairs[name] = {"nic": nic, "nic_pci": nic_pci, "gpu": gpu_pci}
check(set(pairs) == {"acs", "noacs", "switch", "cross"}, "the guest found all four pairs", pairs)

if iommu_on and len(pairs) == 4:
    acs, noacs, sw = pairs["acs"], pairs["noacs"], pairs["switch"]
    check(isolation(acs["nic_pci"])[2] == [] and isolation(acs["gpu"])[2] == [],
          "ACS root ports give the acs pair groups of their own")
    check(isolation(noacs["nic_pci"])[2] == ["0000:00:05.0"] and isolation(noacs["gpu"])[2] == ["0000:00:04.0"],
          "disable-acs root ports share a group with their endpoint",
          (isolation(noacs["nic_pci"]), isolation(noacs["gpu"])))
    check(isolation(sw["nic_pci"])[2] == [upstream(sw["nic_pci"])[0]]
          and isolation(sw["gpu"])[2] == [upstream(sw["gpu"])[0]],
          "endpoints behind the switch share a group with their downstream port")


# --- the doctor's verdicts -----------------------------------------------------------------------
def load(who, name):
    try:
        j = json.loads(read("doctor-%s-%s.json" % (who, name)))
    except (OSError, ValueError) as e:
        err = ""
        try:
            err = read("doctor-%s-%s.err" % (who, name))
        except OSError:
            pass
        check(False, "doctor as %s for %s printed JSON" % (who, name), "%s\n%s" % (e, err))
        return None, None
    return j, int(read("doctor-%s-%s.rc" % (who, name)).strip())


def find(j, cid, subject=None):
    hits = [c for c in j["checks"] if c["id"] == cid and (subject is None or c["subject"].startswith(subject))]
    return hits[0] if len(hits) == 1 else None


def verdict(j, cid, subject, status, words=(), absent=(), what=""):
    c = find(j, cid, subject)
    if c is None:
        check(False, what + ": exactly one %s check" % cid, json.dumps(j["checks"], indent=1))
        return
    missing = [w for w in words if w not in c["message"]]
    present = [w for w in absent if w in c["message"]]
    check(c["status"] == status and not missing and not present,
          "%s: %s is %s%s" % (what, cid, status, (" naming " + ", ".join(words)) if words else ""),
          "got %s: %s\nmissing: %s\nmust not say: %s" % (c["status"], c["message"], missing, present))


for who in ("root", "user"):
    j, rc = load(who, "all")
    if j is None:
        continue
    check(rc == (1 if j["result"] == "fail" else 0), who + ": exit status matches the result",
          "rc %d, result %s" % (rc, j["result"]))
    # --nic/--gpu select exactly one pair, with the verdicts the whole report gives it.
    sel, src = load(who, "acs")
    if sel is not None and "acs" in pairs:
        p = pairs["acs"]
        subject = p["nic"] + " (" + p["nic_pci"] + ") -> " + p["gpu"]
        mine = lambda r: [(c["id"], c["status"], c["message"]) for c in r["checks"] if c["subject"] == subject]
        others = [c for c in sel["checks"] if c["id"].startswith("pair.") and c["subject"] != subject]
        check(not others and mine(sel) and mine(sel) == mine(j),
              who + ": --nic %s --gpu %s checks that pair alone, as the whole report does" % (p["nic"], p["gpu"]),
              (others, mine(sel), mine(j)))
    for name, p in sorted(pairs.items()):
        what = "%s, pair %s (%s -> %s)" % (who, name, p["nic_pci"], p["gpu"])
        subject = p["nic"] + " (" + p["nic_pci"] + ") -> " + p["gpu"]
        check(j["iommu_groups"] == len(groups), what + ": counts %d IOMMU groups" % len(groups),
              j["iommu_groups"])
        if iommu_on:
            verdict(j, "iommu", "host", "pass", ["%d groups" % len(groups)], what=what)
        else:
            verdict(j, "iommu", "host", "fail", ["no IOMMU groups"], what=what)
        # Item 4: the real default domain, not the command line's iommu=pt alone.
        if mode in ("pt", "passthrough"):
            verdict(j, "kernel.iommu_pt", "host", "warn", ["identity"], ["DMA is translated"], what=what)
        elif mode == "none":
            verdict(j, "kernel.iommu_pt", "host", "warn", ["no IOMMU"], ["DMA is translated"], what=what)
        else:
            verdict(j, "kernel.iommu_pt", "host", "pass", [want_type], what=what)
        check(j["kernel"]["iommu_pt"] == (mode in ("pt", "passthrough")),
              what + ": kernel.iommu_pt is %s" % (mode in ("pt", "passthrough")), j["kernel"])

        for req in ("translated", "passthrough-ok"):
            ok, words = expect_pair_iommu(req, p["nic_pci"], p["gpu"])
            verdict(j, "pair.iommu." + req, subject, "pass" if ok else "fail", words, what=what)
        # Fixed expectations per topology, whatever the sysfs said.
        if name == "acs" and mode in ("dma", "dma-fq"):
            verdict(j, "pair.iommu.translated", subject, "pass", what=what + " [topology]")
        if name == "acs" and iommu_on:
            verdict(j, "pair.iommu.passthrough-ok", subject, "pass", what=what + " [topology]")
        if name in ("noacs", "switch") and iommu_on:
            verdict(j, "pair.iommu.translated", subject, "fail", ["shares its group with"],
                    what=what + " [topology]")

        bridges, turn = path(p["nic_pci"], p["gpu"])
        check((turn is None) == (name != "switch"), what + ": the path turns around where expected",
              (bridges, turn))
        label = "PIX" if name == "switch" else "PHB"
        verdict(j, "pair.p2p", subject, "pass", [label + ":"] + [b for b in bridges], what=what)

        # ACS: the ports Linux would call not isolating, named; the others (a single-function
        # switch upstream port, item 7) not named.
        off = [b for b in bridges if b != turn and not acs_isolates(b)]
        fine = [b for b in bridges if b != turn and acs_isolates(b)]
        if who == "user":
            # Config space past 64 bytes is root's: the unprivileged doctor cannot tell.
            verdict(j, "pair.acs", subject, "warn", ["CAP_SYS_ADMIN"], what=what)
        elif off:
            verdict(j, "pair.acs", subject, "fail", off, fine, what=what)
        else:
            verdict(j, "pair.acs", subject, "pass", what=what)
        if who == "root" and name == "cross":
            up = [b for b in bridges if ports.get(b, {}).get("type") == "Upstream Port"]
            check(len(up) == 1, what + ": the cross pair crosses one switch upstream port", bridges)
            if up:
                c = find(j, "pair.acs", subject)
                check(c is not None and up[0] not in c["message"],
                      what + ": pair.acs does not blame the single-function upstream port " + up[0],
                      c and c["message"])

# --- the whole report: inventory against sysfs ---------------------------------------------------
j, rc = load("root", "all")
if j is not None:
    display = sorted(a for a, d in pci.items() if d["class"] >> 16 == 0x03)
    check(sorted(g["pci"] for g in j["gpus"]) == display,
          "every display-class PCI function is listed as a GPU, bound or not",
          (display, j["gpus"]))
    for n in j["netdevs"]:
        if n["name"] not in netdevs:
            continue
        # Item 5: active queues (real_num_rx_queues: sysfs queues/rx-*, ethtool channels), not
        # the allocated IFLA_NUM_RX_QUEUES.
        want = netdevs[n["name"]]["rx"]
        check(n["rx_queues"] == want, "%s: %d active RX queues reported" % (n["name"], want), n)
        if n["name"] in channels and channels[n["name"]]:
            check(channels[n["name"]] == want, "%s: ethtool channels agree with sysfs" % n["name"],
                  (channels[n["name"]], want))
    nsim = [n for n in j["netdevs"] if n["driver"] == "netdevsim"]
    check(len(nsim) == 1 and nsim[0]["rx_queues"] == 2,
          "netdevsim with 4 queues allocated and 2 active shows 2", nsim)
    for n in j["netdevs"]:
        if not n["pci"]:
            continue
        c = find(j, "netdev", n["name"] + " (")
        if netdevs.get(n["name"], {}).get("rx") == 1:
            # Item 6: a one-queue NIC is named as such: nothing can be isolated on it.
            check(c is not None and c["status"] == "warn" and "one RX queue" in c["message"],
                  "%s: a one-queue NIC is reported as one RX queue" % n["name"], c)
    nics = [n for n in j["netdevs"] if n["pci"]]
    acs_checks = [c for c in j["checks"] if c["id"] == "pair.acs"]
    check(len(acs_checks) == len(nics) * len(display),
          "the full report checks every PCI NIC with every GPU (%d x %d)" % (len(nics), len(display)),
          len(acs_checks))

print("# %s: %d failed" % (mode, failures))
sys.exit(1 if failures else 0)
