#!/usr/bin/python3
"""The article's second listing on knod-policy: a DDP job whose every rank receives through a
binding the policy granted it (import knod.distributed registers the backend "knod").

One rank (what a cluster's launcher runs on each node)::

    ddp_train.py --rank R --world N --master 10.98.0.2:29500

The whole job on the sim, as root inside the sandbox (each rank a node of its own: a network
namespace registered as a pod of k8s namespace ml-team; examples/sim_nodes.py)::

    scripts/knod-sandbox.sh --policy examples/collectives_policy.toml -- \\
        examples/ddp_train.py --launch 2

It prints each rank's loss, its binding (id, granting rule, flow) and, with --launch, each
rank's journal session (pod, rx bytes, end reason). Exit status 0 when every rank trained.
"""
import argparse
import json
import os
import subprocess
import sys


def rank_main(a):
    import torch
    import torch.distributed as dist

    import knod.distributed  # noqa: F401 (registers backend "knod")

    # The article's call, unchanged.
    dist.init_process_group(backend='knod', init_method=f'tcp://{a.master}',
                            world_size=a.world, rank=a.rank)
    info = dist.distributed_c10d._get_default_group().info
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts them anyway)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(a.rank)
    w = torch.randn(64, 1, generator=torch.Generator().manual_seed(42))
    for step in range(a.steps):
        x = torch.randn(32, 64, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ w)
        opt.zero_grad()
        loss.backward()  # gradients all-reduced through every rank's binding
        opt.step()
        if a.rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            print(f"step {step:3d} loss {loss.item():.4f}", flush=True)
    print(json.dumps({"rank": a.rank, "binding": info["binding"], "rule": info["rule"],
                      "flow": info["flow"], "job": info["job"]}), flush=True)
    dist.destroy_process_group()
    return 0


def launch(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sim_nodes import Nodes

    me = os.path.abspath(__file__)
    with Nodes(a.launch, job=a.job) as nodes:
        procs = nodes.run(lambda r: [sys.executable, me, "--rank", str(r), "--world",
                                     str(a.launch), "--master", f"{nodes.address(0)}:29500",
                                     "--steps", str(a.steps)])
        infos, rc = [], 0
        for p in procs:
            out, _ = p.communicate()
            for line in out.splitlines():
                if line.startswith("{"):
                    infos.append(json.loads(line))
                else:
                    print(line)
            rc = rc or p.returncode
    db = os.path.join(os.environ.get("KNOD_STATE_DIR", "/var/lib/knod-policy"), "journal.db")
    for i in infos:
        print(f"rank {i['rank']}: binding {i['binding']} rule {i['rule']} flow {i['flow']}")
        if os.path.exists(db):
            row = subprocess.run(["sqlite3", db, "select rx_bytes, rx_packets, end_reason from "
                                  f"sessions where id = '{i['binding']}'"],
                                 capture_output=True, text=True).stdout.strip()
            print(f"  journal: rx_bytes|rx_packets|end_reason = {row}")
    return rc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--master", default="10.98.0.2:29500", help="the store's ADDRESS:PORT")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--launch", type=int, metavar="N", help="run a whole N-rank job on the sim")
    p.add_argument("--job", default="ddp-example", help="the job's name (its pods' prefix)")
    a = p.parse_args()
    if a.launch:
        return launch(a)
    if a.rank is None or a.world is None:
        p.error("--rank and --world, or --launch N")
    return rank_main(a)


if __name__ == "__main__":
    sys.exit(main())
