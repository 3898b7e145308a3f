#!/usr/bin/python3
"""busBW of all_reduce and all_gather, knod.distributed against Gloo in the same processes, and
the time init_process_group takes with each (issue #53). Root, inside the sandbox, each rank a
node of its own (examples/sim_nodes.py)::

    scripts/knod-sandbox.sh --unique-sim --policy examples/collectives_policy.toml -- \\
        bench/collectives_bench.py [--ranks 2] [--sizes 65536,1048576,16777216]

busBW as nccl-tests defines it: all_reduce 2(n-1)/n x bytes / time, all_gather (n-1)/n x
n x bytes / time (bytes: one rank's tensor). Prints one line per size with both and the ratio
knod/gloo, and the init times and their ratio. Timings are the median of --iters runs.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(a):
    import torch
    import torch.distributed as dist

    import knod.distributed  # noqa: F401

    # Every rank has imported torch before any starts its clock: a file each, then wait for all
    # (otherwise a rank's init would count its peers' interpreter start-up).
    ready = os.environ["KNOD_BENCH_READY"]
    open(os.path.join(ready, f"{a.backend}-{a.rank}"), "w").close()
    while len([f for f in os.listdir(ready) if f.startswith(a.backend + "-")]) < a.world:
        time.sleep(0.005)
    t0 = time.monotonic()
    dist.init_process_group(backend=a.backend, init_method=f"tcp://{a.master}",
                            world_size=a.world, rank=a.rank)
    dist.barrier()
    init_s = time.monotonic() - t0
    out = {"rank": a.rank, "backend": a.backend, "init_s": init_s, "results": []}
    if a.backend == "knod":
        gloo = dist.new_group(backend="gloo")
        n = a.world
        for size in [int(s) for s in a.sizes.split(",")]:
            x = torch.ones(size // 4, dtype=torch.float32)
            outs = [torch.empty_like(x) for _ in range(n)]
            for name, group in (("knod", None), ("gloo", gloo)):
                for op in ("all_reduce", "all_gather"):
                    times = []
                    for i in range(a.iters + 1):
                        dist.barrier(group=group)
                        t = time.monotonic()
                        if op == "all_reduce":
                            dist.all_reduce(x, group=group)
                        else:
                            dist.all_gather(outs, x, group=group)
                        if i:  # the first is a warm-up
                            times.append(time.monotonic() - t)
                    med = statistics.median(times)
                    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1)
                    out["results"].append({"size": size, "backend": name, "op": op,
                                           "busbw": factor * size / med / 1e9, "s": med})
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


def run_job(nodes, a, backend):
    me = os.path.abspath(__file__)
    procs = nodes.run(lambda r: [sys.executable, me, "--rank", str(r), "--world", str(a.ranks),
                                 "--master", f"{nodes.address(0)}:{29500 + (backend == 'knod')}",
                                 "--backend", backend, "--sizes", a.sizes,
                                 "--iters", str(a.iters)])
    results = []
    for p in procs:
        out, _ = p.communicate()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if p.returncode or not lines:
            raise SystemExit(f"a {backend} rank failed (exit {p.returncode})")
        results.append(json.loads(lines[-1]))
    return results


def launch(a):
    import tempfile

    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from sim_nodes import Nodes

    ready = tempfile.mkdtemp(prefix="knod-bench-ready.")
    os.environ["KNOD_BENCH_READY"] = ready
    try:
        with Nodes(a.ranks, job="bench") as nodes:
            gloo = run_job(nodes, a, "gloo")
            knod = run_job(nodes, a, "knod")
    finally:
        for f in os.listdir(ready):
            os.unlink(os.path.join(ready, f))
        os.rmdir(ready)
    init_g = max(r["init_s"] for r in gloo)
    init_k = max(r["init_s"] for r in knod)
    datapath = os.environ.get("KNOD_DIST_DATAPATH", "c")
    print(f"collectives bench: {a.ranks} ranks, each in a network namespace of its own, "
          f"receiving through its binding on the sim (knod, data path: {datapath}) or over TCP "
          "(Gloo)")
    print(f"{'op':<11}{'bytes':>10}{'knod GB/s':>11}{'gloo GB/s':>11}{'knod/gloo':>11}")
    rows = {}
    for r in knod[0]["results"]:
        rows.setdefault((r["op"], r["size"]), {})[r["backend"]] = r["busbw"]
    for (op, size), bw in sorted(rows.items()):
        print(f"{op:<11}{size:>10}{bw['knod']:>11.3f}{bw['gloo']:>11.3f}"
              f"{bw['knod'] / bw['gloo']:>11.2f}")
    print(f"init_process_group: knod {init_k:.2f} s, gloo {init_g:.2f} s, "
          f"knod/gloo {init_k / init_g:.2f}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="65536,1048576,16777216")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--master")
    p.add_argument("--backend", default="knod")
    a = p.parse_args()
    if a.rank is None:
        return launch(a)
    return rank_main(a)


if __name__ == "__main__":
    sys.exit(main())
