"""knod.distributed (issue #53) against a real knod-policyd on the sim: every rank runs in a
network namespace of its own (a node), routed to the sim's wire namespace (the switch), gets a
binding of the sim NIC for its own port, and receives what its peers send through it. Each
operation is compared with Gloo in the same processes. Skipped when /usr/bin/python3 has no
torch (Debian's python3-torch)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import NETNS, binding_ids, cli, eventually, journal

pytest.importorskip("torch", reason="knod.distributed needs torch (Debian's python3-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "collectives_worker.py")
RUN = os.getpid() % 100000
MTU = "3500"  # a chunk whole (examples/sim_nodes.py), as on the sim's own pair
PORT_BASE = 8000  # the tests' policy: rule "collectives", udp 10.98.0.0/16:* -> 10.99.0.2:8000-8999


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def cni(command, ns, pod_namespace, pod):
    """knod-cni as a runtime runs it: registers (ADD) or unregisters (DEL) the node's network
    namespace as pod `pod_namespace/pod` with the daemon."""
    config = json.dumps({"cniVersion": "1.0.0", "name": "knod-collectives", "type": "knod-cni",
                         "spoolDir": f"/tmp/knod-collectives-spool-{RUN}"})
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=f"sandbox-{ns}",
               CNI_NETNS=f"/var/run/netns/{ns}" if command == "ADD" else "", CNI_IFNAME="knr0",
               CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_namespace};K8S_POD_NAME={pod};"
                        f"K8S_POD_UID=uid-{ns};K8S_POD_INFRA_CONTAINER_ID=x", CNI_PATH="/usr/lib/cni")
    out = subprocess.run([os.environ["KNOD_CNI"]], input=config, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"knod-cni {command} {ns}: {out.stdout} {out.stderr}"


class Nodes:
    """`n` network namespaces, one per rank, each with a veth to the sim's wire namespace
    (which forwards between them and onto the sim NIC), each registered as a pod of the job
    (k8s namespace `team`, pod JOB-rankR: what the journal and `knod-policy bindings` name);
    names of this run's own. `teams` gives some ranks another namespace."""

    def __init__(self, n, tag, team="ml-team", teams=None):
        self.n, self.tag = n, tag
        self.names = [f"knodc{RUN}{tag}r{r}" for r in range(n)]
        self.wires = [f"kc{RUN}{tag}{r}" for r in range(n)]
        self.teams = [(teams or {}).get(r, team) for r in range(n)]
        self.pods = [f"job{RUN}{tag}-rank{r}" for r in range(n)]
        self.made = []
        self.registered = []

    def __enter__(self):
        try:
            ip("netns", "exec", NETNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            for r, (ns, wire) in enumerate(zip(self.names, self.wires)):
                ip("netns", "add", ns)
                self.made.append(ns)
                ip("link", "add", wire, "mtu", MTU, "type", "veth", "peer", "name", "knr0", "mtu",
                   MTU, "netns", ns)
                ip("link", "set", wire, "netns", NETNS)
                ip("-n", NETNS, "addr", "add", f"10.98.{r}.1/24", "dev", wire)
                ip("-n", NETNS, "link", "set", wire, "up")
                ip("-n", ns, "addr", "add", f"10.98.{r}.2/24", "dev", "knr0")
                ip("-n", ns, "link", "set", "knr0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "route", "add", "default", "via", f"10.98.{r}.1")
                cni("ADD", ns, self.teams[r], self.pods[r])
                self.registered.append(r)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for r in self.registered:
            cni("DEL", self.names[r], self.teams[r], self.pods[r])
        self.registered = []
        subprocess.run(["rm", "-rf", f"/tmp/knod-collectives-spool-{RUN}"])
        for ns in self.made:  # the veth pair goes with its namespace
            ip("netns", "del", ns, check=False)
        self.made = []

    def start(self, scenario, world=None, extra_env=None, uids=None):
        world = world or self.n
        env = dict(os.environ, KNOD_DIST_NETDEV=os.environ["KNOD_SIM_NETDEV"],
                   KNOD_DIST_PEERS="10.98.0.0/16", KNOD_DIST_PORT_BASE=str(PORT_BASE),
                   GLOO_SOCKET_IFNAME="knr0", KNOD_TEST_PG_TIMEOUT="120",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env.update(extra_env or {})
        procs = []
        for r in range(world):
            argv = ["ip", "netns", "exec", self.names[r]]
            uid = (uids or {}).get(r)
            if uid:
                argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            argv += [sys.executable, WORKER, scenario, str(r), str(world), "10.98.0.2:29500"]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        return procs


def finish(procs, timeout=600):
    """Every rank's (returncode, last JSON line, stderr); kills what is left at the end."""
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            results.append((None, None, err))
            continue
        lines = [line for line in out.splitlines() if line.startswith("{")]
        results.append((p.returncode, json.loads(lines[-1]) if lines else None, err))
    return results


def assert_every_rank_ok(results):
    """Every rank exited 0; otherwise names every rank that did not, with its own stderr, so the
    rank that failed first (not only the peers it took down) is in the report."""
    bad = [f"rank {r}: rc={rc} {out} {err[-2500:]}" for r, (rc, out, err) in enumerate(results)
           if rc != 0]
    assert not bad, "\n---\n".join(bad)


@pytest.mark.parametrize("world", [2, 4])
def test_every_operation_equals_gloo(world):
    with Nodes(world, "o") as nodes:
        results = finish(nodes.start("ops"))
    assert_every_rank_ok(results)
    for r, (rc, out, err) in enumerate(results):
        assert out["checked"] > 20
        assert out["info"]["rule"] == "ml-team-ranks"
        assert out["info"]["rank"] == r
        assert out["released"]  # destroy_process_group released the binding
    jobs = {out["info"]["job"] for _, out, _ in results}
    assert len(jobs) == 1
    # One journal session per rank, for its own flow, ended by the group's destroy (release).
    for r, (_, out, _) in enumerate(results):
        b = out["info"]["binding"]
        assert b not in binding_ids()
        assert eventually(lambda: journal(
            f"select end_reason from sessions where id = '{b}'") == "release")
        flows = journal(f"select flows from sessions where id = '{b}'")
        assert f":{PORT_BASE + r}" in flows
        # The grant names the rank's pod: the job's ranks together under their namespace.
        pod = journal("select json_extract(detail, '$.pod.namespace') || '/' || "
                      "json_extract(detail, '$.pod.name') from events where kind = "
                      f"'request-granted' and session_id = '{b}'")
        assert pod == f"ml-team/job{RUN}o-rank{r}", pod
        # Issue #53: each rank tagged its binding with the job, the group and its rank, once.
        tag = journal("select json_extract(detail, '$.job') || '|' || "
                      "json_extract(detail, '$.group') || '|' || json_extract(detail, '$.rank') "
                      f"from events where kind = 'job-tagged' and session_id = '{b}'")
        assert tag == f"{out['info']['job']}|{out['info']['group']}|{r}", tag
    # The job's world group: exactly one tag per rank, ranks 0..world-1, all one job.
    job = results[0][1]["info"]["job"]
    ranks = journal("select group_concat(r) from (select json_extract(detail, '$.rank') as r "
                    "from events where kind = 'job-tagged' and json_extract(detail, '$.job') = "
                    f"'{job}' and json_extract(detail, '$.group') = '0' order by r)")
    assert ranks == ",".join(str(r) for r in range(world)), ranks


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_and_sgd_steps_equal_gloo(world):
    # Bit for bit at 2 ranks (a + b either way); at 4 the ring sums in another order.
    with Nodes(world, "t") as nodes:
        results = finish(nodes.start("train"))
    assert_every_rank_ok(results)
    for r, (rc, out, err) in enumerate(results):
        assert out["bitwise"] if world == 2 else out["maxdiff"] <= 1e-6, out


def test_journal_rx_bytes_are_what_the_peers_sent():
    from knod.distributed import FRAME, PAYLOAD

    with Nodes(2, "j") as nodes:
        results = finish(nodes.start("sent"))
    assert_every_rank_ok(results)
    # 100,000 floats in two halves: reduce-scatter then all-gather, each a half to each rank
    # (and the new Gloo group's init sends nothing through knod).
    half = 200_000
    frames = -(-half // PAYLOAD)
    want = 2 * frames * FRAME
    for r, (_, out, _) in enumerate(results):
        b = out["info"]["binding"]
        assert eventually(lambda: journal(
            f"select rx_bytes from sessions where id = '{b}' and ended_us is not null") ==
            str(want)), journal(f"select rx_bytes, end_reason from sessions where id = '{b}'")
    db = os.path.join(os.environ["KNOD_STATE_DIR"], "journal.db")
    out = cli("audit", "verify", "--db", db, "--no-system-journal")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_job_name_the_daemon_refuses_leaves_the_ranks_untagged_and_the_job_runs():
    # The tag is a label: a KNOD_DIST_JOB outside the daemon's alphabet warns, never fails.
    with Nodes(2, "n") as nodes:
        results = finish(nodes.start("sent", extra_env={"KNOD_DIST_JOB": "not a job name"}))
    assert_every_rank_ok(results)
    for _, out, err in results:
        assert out["ok"], out
        assert "stays untagged" in err and "InvalidArgument" in err, err[-3000:]
        b = out["info"]["binding"]
        assert journal(f"select count(*) from events where session_id = '{b}' and "
                       "kind = 'job-tagged'") == "0"


def test_a_denied_rank_raises_and_nobody_hangs():
    # Rank 1's node is a pod of namespace ml-banned, which the policy denies by name.
    with Nodes(2, "d", teams={1: "ml-banned"}) as nodes:
        results = finish(nodes.start("ops", extra_env={"KNOD_TEST_PG_TIMEOUT": "60"}),
                         timeout=300)
    (rc0, out0, err0), (rc1, out1, err1) = results
    assert rc1 == 2, err1
    assert out1["denied"] and out1["rule"] == "no-banned-team", out1
    assert rc0 == 3, err0
    assert "rank 1" in out0["peer_failed"] and "no-banned-team" in out0["peer_failed"], out0


def test_the_devmem_transport_where_no_rank_can_receive_fails_every_init():
    # KNOD_DIST_TRANSPORT=devmem on the sim: a rank's receive buffer must be a dma-buf (a
    # udmabuf, which this kernel may lack) bound to a devmem NIC, which the sim is not. Every
    # rank's init raises, naming why (its own) or the rank that could not (a peer's); nobody
    # hangs.
    with Nodes(2, "v") as nodes:
        results = finish(nodes.start("ops", extra_env={"KNOD_DIST_TRANSPORT": "devmem",
                                                       "KNOD_TEST_PG_TIMEOUT": "60"}),
                         timeout=300)
    assert [rc for rc, _, _ in results] != [0, 0]
    own = [out for rc, out, _ in results if rc == 4]
    assert own, results
    for rc, out, err in results:
        assert rc in (2, 3, 4), f"rc={rc} {out} {err[-2000:]}"
    if not os.path.exists("/dev/udmabuf"):
        for out in own:
            assert out["error"] == "Unavailable" and "modprobe udmabuf" in out["message"], out


def test_a_killed_rank_makes_the_others_fail_fast():
    with Nodes(3, "k") as nodes:
        results = finish(nodes.start("die"))
    rc1 = results[1][0]
    assert rc1 == -9
    for r in (0, 2):
        rc, out, err = results[r]
        assert rc == 0, err[-3000:]
        # Its death, seen on the side channel, not the group's 120 s timeout (the message says
        # which; no clock is asserted).
        assert "rank 1" in out["failed"] and "side channel" in out["failed"], out
        assert "timeout" not in out["failed"], out
    b = results[1][1]["info"]["binding"]
    assert eventually(lambda: journal(
        f"select end_reason from sessions where id = '{b}'") in ("process-exit", "disconnect"))


def test_a_rank_that_leaves_cleanly_fails_only_what_needs_it():
    # A rank's destroy_process_group is not a failure of the others: ranks 0 and 1 go on
    # between themselves; a send to the rank that left fails, naming it.
    with Nodes(3, "l") as nodes:
        results = finish(nodes.start("leave"))
    assert_every_rank_ok(results)
    for r, (_, out, _) in enumerate(results):
        assert out["released"], out
    for r in (0, 1):
        assert results[r][1]["after"], results[r][1]
    out = results[0][1]
    assert out["to_left"].startswith("PeerFailed") and "rank 2 left" in out["to_left"], out


def test_a_foreign_chunk_fails_the_operation_never_a_wrong_tensor():
    with Nodes(2, "f") as nodes:
        results = finish(nodes.start("foreign"))
    (rc0, out0, err0), (rc1, out1, err1) = results
    assert rc0 == 0 and rc1 == 0, err0[-3000:] + err1[-3000:]
    assert "returned" not in out0 and "returned" not in out1, (out0, out1)
    # Which check sees it first depends on how much has arrived when rank 0 looks: a chunk
    # that is not the one expected, or more bytes than rank 1 was granted. Both name it.
    assert out0["failed"].startswith("ChunkError") and (
        "not the one expected" in out0["failed"] or "foreign traffic" in out0["failed"]), out0
    assert "rank 0" in out1["failed"], out1


def test_a_sender_that_exits_after_sending_still_delivers_whole():
    with Nodes(2, "x") as nodes:
        results = finish(nodes.start("send-exit"))
    assert results[0][0] == 0, results[0][2][-3000:]
    rc, out, err = results[1]
    assert rc == 0, f"{out} {err[-3000:]}"
    assert out["equal"]


def test_steering_drift_ends_the_bindings_and_the_job_fails_loudly():
    with Nodes(2, "s") as nodes:
        procs = nodes.start("drift")
        ready = procs[0].stdout.readline()  # rank 0's first line: the job runs
        assert json.loads(ready) == {"ready": True}, ready + procs[0].stderr.read()[-3000:]
        # A stray steering rule, as a misconfigured NIC would have: a flow nobody holds, put
        # on every offload queue (the sim runs 8: 1..7 may be bound).
        for q in range(1, 8):
            out = cli("sim-send", "--netns", NETNS, "--to", "10.99.0.2:5999", "--data", "STRAY",
                      "--queue", str(q))
            assert out.returncode == 0, out.stderr
        results = finish(procs)
    assert_every_rank_ok(results)
    for r, (rc, out, err) in enumerate(results):
        assert "returned" not in out and "failed" in out, out
    ended = [journal(f"select end_reason from sessions where id = '{out['info']['binding']}'")
             for _, out, _ in results]
    assert any(e.startswith("steering-drift") for e in ended), ended


def test_a_lost_or_reordered_chunk_is_an_error_and_nothing_is_applied():
    """knod_chunks_receive (libknod-client) and the Python path on a ring built here: chunks
    0, 1, 3 of a message (2 was lost), then 0, 2, 1 (reordered), then a foreign one."""
    import ctypes

    import numpy

    import knod
    import knod._capi
    from knod.distributed import FRAME, HEADER, MAGIC, PAYLOAD, ChunkError, ProcessGroupKnod

    lib = knod._capi.lib()
    total = 5 * PAYLOAD
    msg, src = 7, 1
    data = numpy.arange(total, dtype=numpy.uint8)

    def frame(seq, magic=MAGIC, source=src):
        f = numpy.zeros(FRAME, dtype=numpy.uint8)
        f[:HEADER] = numpy.array([magic, msg, seq, PAYLOAD | (source << 16)],
                                 dtype="<u4").view(numpy.uint8)
        f[HEADER:] = data[seq * PAYLOAD:(seq + 1) * PAYLOAD]
        return f

    def receive_c(seqs, **kw):
        ring = numpy.stack([frame(s, **kw) for s in seqs])
        dst = numpy.zeros(total, dtype=numpy.uint8)
        err = ctypes.c_void_p()
        code = lib.knod_chunks_receive(dst.ctypes.data, ring.ctypes.data, len(seqs), 0,
                                       len(seqs), 0, total, msg, src, 0, 0, ctypes.byref(err))
        text = knod._capi.text(lib.knod_error_message(err.value)) if code else None
        if code:
            lib.knod_error_free(err.value)
        return code, text, dst

    def receive_py(seqs, **kw):
        ring = numpy.stack([frame(s, **kw) for s in seqs])
        pg = ProcessGroupKnod.__new__(ProcessGroupKnod)  # only its header check: no group
        pg._rank = 0
        try:
            pg._check_headers(ring, src, msg, 0, 5, total)
        except ChunkError as e:
            return str(e)
        return None

    if hasattr(lib, "knod_chunks_receive"):
        code, text, dst = receive_c([0, 1, 2])
        assert code == 0 and bytes(dst[:3 * PAYLOAD]) == bytes(data[:3 * PAYLOAD])
        for seqs, kw, expected in (([0, 1, 3], {}, "chunk 2 of message 7 from rank 1"),
                                   ([0, 2, 1], {}, "chunk 1 of message 7 from rank 1"),
                                   ([0, 1, 2], {"source": 2}, "chunk 0 of message 7"),
                                   ([0, 1, 2], {"magic": 0}, "chunk 0 of message 7")):
            code, text, dst = receive_c(seqs, **kw)
            assert code == 10  # KNOD_ERR_FAILED
            assert expected in text and "lost, reordered or foreign" in text, text
            assert not dst.any()  # nothing applied
    assert "chunk 2 of message 7 from rank 1" in receive_py([0, 1, 3])
    assert "chunk 1 of message 7 from rank 1" in receive_py([0, 2, 1])
    assert receive_py([0, 1, 2, 3, 4]) is None
