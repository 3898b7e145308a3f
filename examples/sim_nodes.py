"""Nodes for knod.distributed on the sim: one network namespace per rank (a node), a veth from
each to the sim's wire namespace (the switch: it forwards between nodes and onto the sim NIC),
each registered with knod-policyd as a pod (k8s namespace TEAM, pod JOB-rankR) by knod-cni, as
a cluster's runtime would. Root only. Used by examples/ddp_train.py --launch and
bench/collectives_bench.py; tests/python/test_collectives.py builds the same by hand.

Inside the sandbox (scripts/knod-sandbox.sh) the sim's names come from $KNOD_SIM_NETNS and
$KNOD_SIM_NETDEV; knod-cni is $KNOD_CNI, or on PATH, or /usr/lib/cni/knod-cni."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

PORT_BASE = 8000
# The nodes' veths take a knod.distributed chunk whole (3,472 bytes + IPv4 and UDP headers), as
# the sim's own pair does.
MTU = "3500"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Nodes:
    """`n` nodes of job `job`, pods of k8s namespace `team`; a context manager that removes
    what it made (unregistering the pods ends their bindings as pod-deleted)."""

    def __init__(self, n, job, team="ml-team"):
        tag = os.getpid() % 100000
        self.n, self.job, self.team = n, job, team
        self.sim_netns = os.environ.get("KNOD_SIM_NETNS", "knod-sim")
        self.netdev = os.environ.get("KNOD_SIM_NETDEV", "knodsim0")
        self.cni_path = (os.environ.get("KNOD_CNI") or shutil.which("knod-cni") or
                         "/usr/lib/cni/knod-cni")
        self.names = [f"knodn{tag}r{r}" for r in range(n)]
        self.wires = [f"kn{tag}w{r}" for r in range(n)]
        self.pods = [f"{job}-rank{r}" for r in range(n)]
        self.spool = tempfile.mkdtemp(prefix="knod-nodes-spool.")
        self.made, self.registered = [], []

    def address(self, r):
        return f"10.98.{r}.2"

    def _cni(self, command, r):
        ns = self.names[r]
        config = json.dumps({"cniVersion": "1.0.0", "name": "knod-nodes", "type": "knod-cni",
                             "spoolDir": self.spool})
        env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=f"sandbox-{ns}",
                   CNI_NETNS=f"/var/run/netns/{ns}" if command == "ADD" else "",
                   CNI_IFNAME="knr0", CNI_PATH="/usr/lib/cni",
                   CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.team};"
                            f"K8S_POD_NAME={self.pods[r]};K8S_POD_UID=uid-{ns};"
                            "K8S_POD_INFRA_CONTAINER_ID=x")
        out = subprocess.run([self.cni_path], input=config, env=env, capture_output=True,
                             text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"knod-cni {command} {ns}: {out.stdout} {out.stderr}")

    def __enter__(self):
        try:
            _ip("netns", "exec", self.sim_netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            for r, (ns, wire) in enumerate(zip(self.names, self.wires)):
                _ip("netns", "add", ns)
                self.made.append(ns)
                _ip("link", "add", wire, "mtu", MTU, "type", "veth", "peer", "name", "knr0", "mtu",
                    MTU, "netns", ns)
                _ip("link", "set", wire, "netns", self.sim_netns)
                _ip("-n", self.sim_netns, "addr", "add", f"10.98.{r}.1/24", "dev", wire)
                _ip("-n", self.sim_netns, "link", "set", wire, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(r)}/24", "dev", "knr0")
                _ip("-n", ns, "link", "set", "knr0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", f"10.98.{r}.1")
                self._cni("ADD", r)
                self.registered.append(r)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for r in self.registered:
            try:
                self._cni("DEL", r)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(e, file=sys.stderr)
        self.registered = []
        for ns in self.made:  # the veth pair goes with its namespace
            _ip("netns", "del", ns, check=False)
        self.made = []
        shutil.rmtree(self.spool, ignore_errors=True)

    def env(self, extra=None):
        """What a rank needs: the sim NIC, its flows' source prefix and ports, Gloo's NIC."""
        env = dict(os.environ, KNOD_DIST_NETDEV=self.netdev, KNOD_DIST_PEERS="10.98.0.0/16",
                   KNOD_DIST_PORT_BASE=str(PORT_BASE), KNOD_DIST_JOB=self.job,
                   GLOO_SOCKET_IFNAME="knr0")
        env.update(extra or {})
        return env

    def run(self, argv_of_rank, extra_env=None):
        """Starts argv_of_rank(r) in node r for every rank; returns the Popen objects."""
        env = self.env(extra_env)
        return [subprocess.Popen(["ip", "netns", "exec", self.names[r], *argv_of_rank(r)],
                                 env=env, stdout=subprocess.PIPE, text=True)
                for r in range(self.n)]
