"""The time knod-cni's ADD adds to a pod sandbox's start (issue #34), against a baseline from
the same run: the same binary answering VERSION (a process start and exit, the floor any CNI
plugin pays). Run inside scripts/knod-sandbox.sh (bench/cni_bench.sh does), as root: it makes a
network namespace of its own, and runs N rounds of ADD then DEL for it.

Prints p50 and p90 of each, in milliseconds, and the ratios; --json for one object. Exit 1 when
a call fails (the smoke run in the suite checks that, never a time)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--cni", required=True)
ap.add_argument("--rounds", type=int, default=200)
ap.add_argument("--json", action="store_true")
args = ap.parse_args()

netns = f"knodcnib{os.getpid() % 100000}"
subprocess.run(["ip", "netns", "add", netns], check=True)
config = json.dumps({"cniVersion": "1.0.0", "name": "bench", "type": "knod-cni",
                     "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"knod.io/profile": "rx"}},
                     "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.88.0.2/16"}]}}).encode()


def run(command, container):
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=container,
               CNI_NETNS=f"/var/run/netns/{netns}", CNI_IFNAME="eth0", CNI_PATH="/usr/lib/cni",
               CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={container};K8S_POD_UID=u")
    start = time.perf_counter()
    p = subprocess.run([args.cni], input=config, env=env, capture_output=True)
    took = (time.perf_counter() - start) * 1000
    if p.returncode != 0:
        sys.exit(f"cni bench: {command} failed: {p.stdout.decode()} {p.stderr.decode()}")
    return took


try:
    version, add, delete = [], [], []
    for i in range(args.rounds):
        version.append(run("VERSION", f"bench-{i}"))
        add.append(run("ADD", f"bench-{i}"))
        delete.append(run("DEL", f"bench-{i}"))
finally:
    subprocess.run(["ip", "netns", "del", netns])


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


out = {"rounds": args.rounds}
for name, xs in (("version", version), ("add", add), ("del", delete)):
    out[name] = {"p50_ms": round(statistics.median(xs), 3), "p90_ms": round(pct(xs, 0.9), 3)}
out["add_over_version_p50"] = round(out["add"]["p50_ms"] / out["version"]["p50_ms"], 2)
out["del_over_version_p50"] = round(out["del"]["p50_ms"] / out["version"]["p50_ms"], 2)
if args.json:
    print(json.dumps(out))
else:
    print(f"knod-cni, {args.rounds} rounds (ms)      p50      p90   p50 / VERSION")
    for name in ("version", "add", "del"):
        ratio = "" if name == "version" else f"{out[name + '_over_version_p50']:>10.2f}x"
        print(f"  {name:<28} {out[name]['p50_ms']:>8.3f} {out[name]['p90_ms']:>8.3f} {ratio}")
