"""knod.distributed: the torch.distributed backend ``knod`` (issue #53).

``import knod.distributed`` registers the backend, so the article's call works unchanged::

    import knod.distributed  # noqa: F401 (registers backend "knod")
    import torch.distributed as dist
    dist.init_process_group(backend="knod", init_method="tcp://master:2345",
                            world_size=8, rank=local_rank)

Every rank is a principal: at init it asks knod-policyd (through this package) for a receive
binding of the sim NIC to a region of its own (a SimBuffer), for the flow
``udp PEERS:* -> ADDRESS:PORT`` (its port: KNOD_DIST_PORT_BASE + 100 x group id + global rank),
and activates it. A denied rank raises knod.Denied naming the rule, after telling the others
through the store, which then raise PeerFailed naming that rank and rule; a rank that never comes
makes the others fail when the init deadline passes. Nobody waits for ever.

Payload goes through the granted binding: a peer sends a message to a rank as fixed-size UDP
chunks (FRAME bytes: a 16-byte header, magic, message number, sequence number, length and
source rank, then up to PAYLOAD bytes; one datagram of 3,500 bytes with its IPv4 and UDP
headers, so every link on the way needs that MTU, as the sim's veths have) to the rank's flow;
the sim delivers them into the rank's region (a ring of RING_FRAMES chunks: byte i of the
stream lands at i mod its length), and the rank reduces or copies them into place from there.
Flow control: a sender sends only chunks the receiver granted (credits, over a TCP side channel
between every pair of ranks), at most WINDOW ahead of what the receiver consumed, so the ring
never overflows and the sim's queues never drop. Every chunk's header is checked against what
the receiver expects; a lost, foreign or reordered chunk is an error (ChunkError), never a wrong
tensor. A peer whose side channel closes (its process died) fails the operations waiting on it
(PeerFailed naming the rank).

The hot path is libknod-client's C API where the library has it: knod_chunks_send (the chunks
of a message with sendmmsg, up to 18 a message with UDP GSO) and knod_chunks_receive (every
header checked, then the payloads copied or reduced into place on raw pointers); float16,
bfloat16 and bool are reduced with torch, and KNOD_DIST_DATAPATH=python does all of it with
numpy and torch. Python orchestrates: credits, waits, the ring's position. Operations:
send/recv (and isend/irecv), broadcast, all_reduce (SUM, PRODUCT, MIN, MAX, AVG), all_gather,
reduce_scatter, barrier, new_group, on CPU tensors; any other operation fails with torch's
own "does not support" error, and a GPU tensor is refused. destroy_process_group() and the
process's exit release the bindings.

Configuration (environment, read at init):
  KNOD_DIST_NETDEV     the sim NIC (default knodsim0)
  KNOD_DIST_ADDRESS    the NIC's address peers send to (default 10.99.0.2)
  KNOD_DIST_PEERS      the source prefix of the rank's flow (default 10.99.0.0/24)
  KNOD_DIST_PORT_BASE  the first rank's port (default 8000)
  KNOD_DIST_JOB        the job's name (default: the store's job key, made by rank 0); each
                       rank tags its binding with it, the group id and its rank (SetJob):
                       1 to 64 bytes of letters, digits and . _ : @ / -
  KNOD_DIST_WINDOW     chunks in flight to one receiver (default 128)
  KNOD_DIST_INIT_TIMEOUT  seconds init waits for every rank (default: the group's timeout)
  KNOD_DIST_LOSS_GRACE    seconds a receiver waits for chunks its sender says it sent (10)
  KNOD_DIST_DATAPATH      "python": no C hot path
  KNOD_DIST_IFADDR        this rank's side-channel address (default: the route's source
                          address towards KNOD_DIST_ADDRESS)
  KNOD_DIST_TRANSPORT     "sim" (default: the above) or "devmem": on a devmem NIC, the binding
                          is of a dma-buf (a udmabuf) for ``tcp PEERS:* -> ADDRESS:PORT``, every
                          peer opens a TCP stream to it, and the NIC places the payload in the
                          dma-buf (knod._dist_devmem; docs/collectives.md)
  KNOD_DIST_GPU           the binding's GPU id (default sim0)
  KNOD_DIST_DMABUF_BYTES  devmem: the dma-buf's size (default 16 MiB)
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import datetime
import json
import os
import queue
import socket
import struct
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional

import numpy
import torch
import torch.distributed as dist

import knod
import knod._capi
from knod import _dist_devmem

__all__ = ["PeerFailed", "ChunkError", "ProcessGroupKnod", "BACKEND", "HEADER", "PAYLOAD",
           "FRAME", "RING_FRAMES"]

BACKEND = "knod"
MAGIC = 0x444F4E4B  # "KNOD" little-endian
HEADER = 16
PAYLOAD = 3456  # a multiple of 16: every dtype's elements stay whole in a chunk
FRAME = HEADER + PAYLOAD  # one UDP datagram, 3,500 bytes with IPv4 and UDP: the sim's MTU
RING_FRAMES = 302  # 1,048,544 bytes: the tests' policy grants at most 1 MiB a region
_CTRL = struct.Struct("<cxxxIQ")  # kind, message number, value


class PeerFailed(RuntimeError):
    """Another rank failed: denied at init, never came, or died (its side channel closed).
    .rank: that rank (None when unknown)."""

    def __init__(self, message: str, rank: Optional[int] = None) -> None:
        super().__init__(message)
        self.rank = rank


class ChunkError(RuntimeError):
    """A chunk that arrived is not the one expected (lost, reordered or foreign), or chunks
    never came though the sender said it sent them: the operation fails, no tensor is wrong."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _seconds(timeout: Any) -> float:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


class _Peer:
    """The side channel to one other rank: credits and end-of-message notes, both ways. A
    reader thread files what arrives; EOF or an error marks the peer dead. A peer that said
    goodbye first (B: its group was destroyed) has left, not failed: only what still needs it
    fails, never the whole group (a ring's last step lets a rank finish before its
    neighbours)."""

    def __init__(self, rank: int, sock: socket.socket, owner: "ProcessGroupKnod") -> None:
        self.rank, self.sock = rank, sock
        self.cond = threading.Condition()
        self.credit: Dict[int, int] = {}  # message -> chunks granted
        self.done: Dict[int, int] = {}  # message -> chunks the peer sent
        self.dead: Optional[str] = None
        self.left = False  # said goodbye (B) before its side channel closed
        self.send_lock = threading.Lock()
        self._owner = weakref.ref(owner)
        # The reader starts now (a thread's start can take milliseconds on a busy machine) but
        # reads only once init has had the peer's ready note off the socket (reading()).
        self._reading = threading.Event()
        self.thread = threading.Thread(target=self._read, name=f"knod-peer-{rank}", daemon=True)
        self.thread.start()

    def reading(self) -> None:
        self._reading.set()

    def _read(self) -> None:
        why = "closed its side channel (it exited or was killed)"
        buf = b""
        self._reading.wait()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= _CTRL.size:
                    kind, msg, value = _CTRL.unpack_from(buf)
                    buf = buf[_CTRL.size:]
                    with self.cond:
                        if kind == b"C":
                            self.credit[msg] = max(self.credit.get(msg, 0), value)
                        elif kind == b"D":
                            self.done[msg] = value
                        elif kind == b"X":
                            why = "failed an operation and closed its side channel"
                            self.left = False  # a failure said after a goodbye still counts
                        elif kind == b"B" and why.startswith("closed"):
                            self.left = True
                            why = "left the group (destroy_process_group) and closed its side " \
                                "channel"
                        self.cond.notify_all()
        except OSError as e:
            why = f"side channel failed: {e}"
        with self.cond:
            if self.dead is None:
                self.dead = f"rank {self.rank} {why}"
            self.cond.notify_all()
        owner = self._owner()
        if owner is not None and not self.left:
            owner._peer_died(self)

    def send(self, kind: bytes, msg: int, value: int) -> None:
        with self.send_lock:
            try:
                self.sock.sendall(_CTRL.pack(kind, msg, value))
            except OSError as e:
                raise PeerFailed(f"rank {self.rank}: side channel failed: {e}") from None

    def wait_credit(self, msg: int, above: int, deadline: float) -> int:
        with self.cond:
            while True:
                granted = self.credit.get(msg, 0)
                if granted > above:
                    if granted >= 0:
                        return granted
                if self.dead is not None:
                    raise PeerFailed(self.dead, self.rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rank {self.rank} granted no credit for message {msg} "
                                       "within the group's timeout")
                self.cond.wait(min(left, 1.0))

    def forget_credit(self, msg: int) -> None:
        with self.cond:
            self.credit.pop(msg, None)

    def forget_done(self, msg: int) -> None:
        with self.cond:
            self.done.pop(msg, None)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reading.set()


class _Sender:
    """One thread that sends messages in the order they were handed to it (the order the
    receivers expect them), each only as far as its receiver's credits allow."""

    def __init__(self, pg: "ProcessGroupKnod") -> None:
        self._pg = weakref.ref(pg)
        self._jobs: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="knod-sender", daemon=True)
        self._thread.start()

    def submit(self, dst: int, data: numpy.ndarray, fut: torch.futures.Future,
               result: Any) -> None:
        self._jobs.put((dst, data, fut, result))

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            dst, data, fut, result = job
            pg = self._pg()
            if pg is None:
                return
            try:
                pg._send_message(dst, data)
            except BaseException as e:  # noqa: B902 (handed to the waiter)
                pg._fail(e)
                fut.set_exception(e)
            else:
                fut.set_result(result)
            del pg


class ProcessGroupKnod(dist.ProcessGroup):
    """A process group whose every rank receives through its own binding (see the module)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any, group_id: str = "0",
                 global_ranks: Optional[List[int]] = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = _seconds(timeout)
        self._store = store
        self._group_id = int(group_id) if str(group_id).isdigit() else 0
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._failed: Optional[BaseException] = None
        self._closed = False
        self._peers: Dict[int, _Peer] = {}
        self._send_msg = [0] * size
        self._recv_msg = [0] * size
        self._pos = 0  # stream bytes consumed from the region
        self._window = max(1, min(_env_int("KNOD_DIST_WINDOW", 128), RING_FRAMES))
        # The hot path in libknod-client (knod_chunks_*) where the library has it, unless
        # KNOD_DIST_DATAPATH=python (the same chunks, built and checked with numpy and torch).
        self._chunks_c = (os.environ.get("KNOD_DIST_DATAPATH", "c") != "python" and
                          hasattr(knod._capi.lib(), "knod_chunks_send"))
        self._transport = os.environ.get("KNOD_DIST_TRANSPORT", "sim")
        if self._transport not in ("sim", "devmem"):
            raise ValueError(f"KNOD_DIST_TRANSPORT={self._transport!r}: use 'sim' (the sim "
                             "NIC's datagrams into a SimBuffer) or 'devmem' (TCP streams "
                             "into a dma-buf on a devmem NIC)")
        self._devmem: Optional[_dist_devmem.DevmemPath] = None
        self._binding: Optional[knod.Binding] = None
        self._client: Optional[knod.Client] = None
        self._udp: Optional[socket.socket] = None
        self._listener: Optional[socket.socket] = None
        self._ops: "queue.Queue[Any]" = queue.Queue()
        self._op_thread: Optional[threading.Thread] = None
        self._sender: Optional[_Sender] = None
        self.info: Dict[str, Any] = {}
        try:
            self._init()
        except BaseException:
            self.shutdown()
            raise
        _live.add(self)

    # -- init ---------------------------------------------------------------------------------

    def _init(self) -> None:
        init_timeout = _env_int("KNOD_DIST_INIT_TIMEOUT", 0) or self._timeout
        deadline = time.monotonic() + init_timeout
        netdev = os.environ.get("KNOD_DIST_NETDEV", "knodsim0")
        address = os.environ.get("KNOD_DIST_ADDRESS", "10.99.0.2")
        peers = os.environ.get("KNOD_DIST_PEERS", "10.99.0.0/24")
        base = _env_int("KNOD_DIST_PORT_BASE", 8000)
        grank = self._global_ranks[self._rank]
        port = base + 100 * self._group_id + grank
        job = os.environ.get("KNOD_DIST_JOB") or self._job_name()
        status_key = f"knod/status/{self._rank}"
        # The side channel first (its address goes out with the status), then the binding.
        here = self._own_address(address)
        self._listener = socket.create_server((here, 0), backlog=self._size)
        ctrl = f"{here}:{self._listener.getsockname()[1]}"
        try:
            self._client = knod.Client()
            if self._transport == "devmem":
                self._devmem = _dist_devmem.DevmemPath(self._rank, self._size, self._timeout,
                                                       ChunkError, PeerFailed)
                region: Any = self._devmem.make_region()
                flow = f"tcp {peers}:* -> {address}:{port}"
            else:
                region = self._region = knod.SimBuffer(RING_FRAMES * FRAME)
                flow = f"udp {peers}:* -> {address}:{port}"
            self._binding = self._client.register_buffer(
                region, flow, netdev=netdev, gpu=os.environ.get("KNOD_DIST_GPU", "sim0"))
            if self._devmem is not None:
                assert self._devmem.region is not None
                self._devmem.use_mapping(self._devmem.region.mapping)
                # The kernel's id of the dma-buf, which every fragment of it carries (0 from a
                # daemon without it: then no fragment is taken).
                self._devmem.dmabuf_id = self._binding.dmabuf_id
                self._devmem.listen(address, port)
            self._tag(job)
        except knod.Error as e:
            self._store.set(status_key, json.dumps({
                "ok": False, "error": type(e).__name__, "rule": e.rule, "message": str(e)}))
            raise
        except BaseException as e:
            self._store.set(status_key, json.dumps({
                "ok": False, "error": type(e).__name__, "rule": None, "message": str(e)}))
            raise
        if self._devmem is None:
            self._ring = numpy.frombuffer(self._region, dtype=numpy.uint8).reshape(RING_FRAMES,
                                                                                   FRAME)
        self.info = {"job": job, "group": self._group_id, "rank": self._rank,
                     "global_rank": grank, "binding": self._binding.id,
                     "rule": self._binding.rule, "flow": flow, "data": f"{address}:{port}",
                     "ctrl": ctrl, "transport": self._transport}
        self._store.set(status_key, json.dumps({"ok": True, **self.info}))
        # Everyone's status, each within the deadline: a denied or failed rank says so at once.
        self._dests: Dict[int, tuple] = {}
        ctrls: Dict[int, str] = {}
        for r in range(self._size):
            if r == self._rank:
                continue
            status = self._wait_key(f"knod/status/{r}", deadline, f"rank {r} to start")
            s = json.loads(status)
            if not s["ok"]:
                rule = f" by rule '{s['rule']}'" if s.get("rule") else ""
                raise PeerFailed(f"rank {r} of job {job} could not get its binding "
                                 f"({s['error']}{rule}): {s['message']}")
            host, p = s["data"].rsplit(":", 1)
            self._dests[r] = (host, int(p))
            ctrls[r] = s["ctrl"]
        self._connect(ctrls, deadline)
        if self._devmem is not None:
            self._devmem.connect(self._store, self._dests, deadline)
        else:
            self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            # Never fragments: a path whose MTU is below a chunk's datagram fails the send at
            # once ("Message too long") instead of losing the chunks on the way.
            self._udp.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_MTU_DISCOVER", 10),
                                 getattr(socket, "IP_PMTUDISC_DO", 2))
        self._sender = _Sender(self)
        self._op_thread = threading.Thread(target=self._run_ops, name="knod-ops", daemon=True)
        self._op_thread.start()
        self._ready(deadline)

    def _tag(self, job: str) -> None:
        """The job's name, the group and this rank on the binding (Binding.SetJob, #53): the
        journal (job-tagged), `knod-policy bindings --job` and the metrics show a job's ranks
        together. Only a label, never decided on: where it cannot be set (a daemon or a bus
        policy from before #53, a KNOD_DIST_JOB outside the daemon's alphabet) the rank warns
        and goes on untagged, rather than failing the job for a label."""
        assert self._binding is not None
        if not hasattr(knod._capi.lib(), "knod_binding_set_job"):
            warnings.warn("knod.distributed: this libknod-client cannot tag bindings with their "
                          "job (SetJob, #53); the binding stays untagged", RuntimeWarning)
            return
        try:
            self._binding.set_job(job, str(self._group_id), self._rank)
        except knod.Error as e:
            warnings.warn(f"knod.distributed: rank {self._rank}'s binding stays untagged: "
                          f"{type(e).__name__}: {e}", RuntimeWarning)

    def _job_name(self) -> str:
        # One name for the whole job: the first rank to ask makes it.
        key = "knod/job"
        if self._store.add("knod/job-claim", 1) == 1:
            self._store.set(key, f"job-{os.getpid()}-{int(time.time())}")
        return self._store.get(key).decode()

    def _wait_key(self, key: str, deadline: float, what: str) -> str:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise RuntimeError("deadline passed")
            self._store.wait([key], datetime.timedelta(seconds=left))
        except RuntimeError as e:
            raise PeerFailed(f"timed out waiting for {what} ({e})") from None
        return self._store.get(key).decode()

    @staticmethod
    def _own_address(address: str) -> str:
        override = os.environ.get("KNOD_DIST_IFADDR")
        if override:
            return override
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((address, 9))  # no packet: only the route's source address
            return probe.getsockname()[0]
        finally:
            probe.close()

    def _connect(self, ctrls: Dict[int, str], deadline: float) -> None:
        """A TCP connection to every other rank: rank r dials the ranks below it and accepts
        the ones above, each saying who it is first."""
        hello = struct.Struct("<II")
        for r in range(self._rank):
            host, p = ctrls[r].rsplit(":", 1)
            left = max(0.1, deadline - time.monotonic())
            try:
                s = socket.create_connection((host, int(p)), timeout=left)
            except OSError as e:
                raise PeerFailed(f"rank {r}: cannot reach its side channel {ctrls[r]}: {e}") \
                    from None
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(hello.pack(MAGIC, self._rank))
            self._peers[r] = _Peer(r, s, self)
        assert self._listener is not None
        while len(self._peers) < self._size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self._size)) - set(self._peers) - {self._rank})
                raise PeerFailed(f"ranks {missing} never connected to rank {self._rank}")
            self._listener.settimeout(min(left, 1.0))
            try:
                s, _ = self._listener.accept()
            except socket.timeout:
                continue
            s.settimeout(max(0.1, left))
            data = b""
            try:
                while len(data) < hello.size:
                    more = s.recv(hello.size - len(data))
                    if not more:
                        break
                    data += more
            except OSError:
                data = b""
            if len(data) != hello.size:
                s.close()
                continue
            magic, r = hello.unpack(data)
            if magic != MAGIC or not self._rank < r < self._size or r in self._peers:
                s.close()
                continue
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._peers[r] = _Peer(r, s, self)
        self._listener.close()
        self._listener = None

    def _ready(self, deadline: float) -> None:
        """The last step of init: a ready note to every peer, then every peer's, read here off
        the side channel before its reader starts. The ranks leave init within a message of
        each other, as Gloo's do after its full mesh: torch's barrier right after init sleeps
        10 ms whenever a rank gets there before the others."""
        note = _CTRL.pack(b"R", 0, 0)
        for p in self._peers.values():
            p.send(b"R", 0, 0)
        for r, p in sorted(self._peers.items()):
            data = b""
            try:
                while len(data) < len(note):
                    p.sock.settimeout(max(0.1, deadline - time.monotonic()))
                    more = p.sock.recv(len(note) - len(data))
                    if not more:
                        break
                    data += more
            except socket.timeout:
                raise PeerFailed(f"rank {r} never said it was ready", r) from None
            except OSError as e:
                raise PeerFailed(f"rank {r}: side channel failed: {e}", r) from None
            finally:
                p.sock.settimeout(None)
            if len(data) < len(note):
                raise PeerFailed(f"rank {r} closed its side channel before it was ready", r)
            if data != note:  # its init failed after the side channel opened (B: goodbye)
                raise PeerFailed(f"rank {r} left the group before it was ready (it sent "
                                 f"{data[:1]!r})", r)
        for p in self._peers.values():
            p.reading()

    # -- life ----------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Ends this rank's part: threads stop, side channels close, the binding is released
        (the daemon journals 'release'). Later operations fail. destroy_process_group() calls
        it, and so does the process's exit."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        clean = self._failed is None
        if clean:
            self._failed = RuntimeError("the knod process group was shut down")
        if self._op_thread is not None:
            self._ops.put(None)
        if self._sender is not None:
            self._sender.stop()
        for p in list(self._peers.values()):
            if clean:  # goodbye: the others go on without this rank (X said it failed)
                try:
                    p.send(b"B", 0, 0)
                except PeerFailed:
                    pass
            p.close()
        for s in (self._udp, self._listener):
            if s is not None:
                s.close()
        if self._devmem is not None:
            self._devmem.close()
        if self._binding is not None:
            try:
                self._binding.close()
            except knod.Error:
                pass
        if self._devmem is not None:
            self._devmem.close_region()
        if self._client is not None:
            self._client.close()

    def _peer_died(self, peer: _Peer) -> None:
        if not self._closed and self._failed is None:
            self._failed = PeerFailed(peer.dead or f"rank {peer.rank} died", peer.rank)
            if self._devmem is not None:  # waits on the others end; its own stream decides
                self._devmem.cancel(keep=peer.rank)

    def _fail(self, e: BaseException) -> None:
        if self._devmem is not None:
            self._devmem.cancel()
        if self._failed is None:
            self._failed = e
            for p in self._peers.values():
                try:
                    p.send(b"X", 0, 0)
                except PeerFailed:
                    pass

    def _check(self) -> None:
        if self._failed is not None:
            raise self._failed

    # -- the data path -------------------------------------------------------------------------

    def _send_message(self, dst: int, data: numpy.ndarray) -> None:
        """Sends `data` (uint8, contiguous) to rank `dst` as chunks, as credits allow."""
        peer = self._peers[dst]
        msg = self._send_msg[dst]
        self._send_msg[dst] = (msg + 1) & 0xFFFFFFFF
        if self._devmem is not None:
            self._check()
            try:
                self._devmem.send(dst, msg, data)
            except _dist_devmem.Cancelled:
                self._check()
                raise RuntimeError("the knod process group was shut down") from None
            return
        total = data.size
        chunks = -(-total // PAYLOAD)
        deadline = time.monotonic() + self._timeout
        dest = self._dests[dst]
        sent = 0
        frames = numpy.zeros((0, FRAME), dtype=numpy.uint8)
        while sent < chunks:
            self._check()
            upto = min(peer.wait_credit(msg, sent, deadline), chunks)
            if self._chunks_c:
                self._send_c(data, dest, msg, sent, upto)
                sent = upto
                continue
            n = upto - sent
            if n > frames.shape[0]:
                frames = numpy.zeros((n, FRAME), dtype=numpy.uint8)
            f = frames[:n]
            hdr = f[:, :HEADER].view("<u4")
            seq = numpy.arange(sent, upto, dtype=numpy.uint32)
            lengths = numpy.full(n, PAYLOAD, dtype=numpy.uint32)
            if upto == chunks:
                lengths[-1] = total - (chunks - 1) * PAYLOAD
            hdr[:, 0] = MAGIC
            hdr[:, 1] = msg
            hdr[:, 2] = seq
            hdr[:, 3] = lengths | (numpy.uint32(self._rank) << numpy.uint32(16))
            full = n if upto < chunks else n - 1
            if full:
                f[:full, HEADER:] = data[sent * PAYLOAD:(sent + full) * PAYLOAD].reshape(full,
                                                                                      PAYLOAD)
            if full < n:
                tail = data[(upto - 1) * PAYLOAD:total]
                f[n - 1, HEADER:HEADER + tail.size] = tail
                f[n - 1, HEADER + tail.size:] = 0
            udp = self._udp
            assert udp is not None
            for k in range(n):
                try:
                    udp.sendto(f[k], dest)
                except OSError as e:
                    raise ChunkError(f"rank {self._rank}: sending to {dest[0]}:{dest[1]}: {e}"
                                     f"{_mtu_hint(str(e))}") from None
            sent = upto
        try:
            # The receiver may have every chunk and be gone already (its group destroyed): then
            # nobody needs the note; a receiver still waiting learns from the closed channel.
            peer.send(b"D", msg, chunks)
        except PeerFailed:
            pass
        peer.forget_credit(msg)

    def _send_c(self, data: numpy.ndarray, dest: tuple, msg: int, first: int, upto: int) -> None:
        """libknod-client's knod_chunks_send: chunks [first, upto) with sendmmsg."""
        lib = knod._capi.lib()
        err = ctypes.c_void_p()
        assert self._udp is not None
        addr = int.from_bytes(socket.inet_aton(dest[0]), "little")  # network order in memory
        code = lib.knod_chunks_send(self._udp.fileno(), addr, dest[1], data.ctypes.data,
                                    data.size, msg, self._rank, first, upto, ctypes.byref(err))
        if code:
            message = knod._capi.text(lib.knod_error_message(err.value))
            lib.knod_error_free(err.value)
            raise ChunkError(f"rank {self._rank}: sending to {dest[0]}:{dest[1]}: {message}"
                             f"{_mtu_hint(message)}")

    def _recv_message(self, src: int, total: int,
                      apply: Callable[[int, numpy.ndarray], None]) -> None:
        """Receives a `total`-byte message from rank `src` through the binding: grants credits,
        waits for chunks in the region, checks each header and hands the payloads to
        apply(byte offset in the message, (n, PAYLOAD)-shaped uint8 payloads or one tail row)."""
        peer = self._peers[src]
        msg = self._recv_msg[src]
        self._recv_msg[src] = (msg + 1) & 0xFFFFFFFF
        if self._devmem is not None:
            failed = self._failed  # but a failure that is only src's: its stream decides
            if failed is not None and not (isinstance(failed, PeerFailed) and failed.rank == src):
                raise failed
            try:
                self._devmem.receive(src, msg, total, apply)
            except _dist_devmem.Cancelled:
                self._check()
                raise RuntimeError("the knod process group was shut down") from None
            return
        chunks = -(-total // PAYLOAD)
        if chunks == 0:
            return
        binding = self._binding
        assert binding is not None
        deadline = time.monotonic() + self._timeout
        granted = min(chunks, self._window)
        peer.send(b"C", msg, granted)
        got = 0
        idle_since = time.monotonic()
        done_seen: Optional[float] = None
        grace = min(self._timeout, float(os.environ.get("KNOD_DIST_LOSS_GRACE", "10")))
        while got < chunks:
            self._check_receiving(peer, msg)
            try:
                rx = binding.wait_for_data(timeout_ms=100, seen=self._pos)
            except knod.BindingEnded as e:
                raise ChunkError(f"rank {self._rank}'s binding ended mid-message: {e.reason}") \
                    from None
            if rx is None:
                now = time.monotonic()
                with peer.cond:
                    sent = peer.done.get(msg)
                    dead = peer.dead
                if sent is not None:
                    done_seen = done_seen or now
                    if now - max(idle_since, done_seen) > grace:
                        raise ChunkError(
                            f"rank {src} sent {sent} chunks of message {msg} to rank "
                            f"{self._rank} but {got} arrived: chunks were lost")
                if dead is not None and sent is None:
                    raise PeerFailed(dead, src)
                if now > deadline:
                    raise TimeoutError(f"rank {self._rank}: no data from rank {src} within the "
                                       "group's timeout")
                continue
            idle_since = time.monotonic()
            arrived = (rx - self._pos) // FRAME
            if not arrived:
                raise ChunkError(f"rank {self._rank}'s region got {rx - self._pos} bytes, not a "
                                 f"whole {FRAME}-byte chunk: foreign traffic")
            if arrived > granted - got:
                raise ChunkError(f"rank {self._rank}'s region got {rx - self._pos} bytes, more "
                                 f"than the {granted - got} chunks granted to rank {src}: "
                                 "foreign traffic")
            c = getattr(apply, "c", None) if self._chunks_c else None
            if c is not None and arrived:
                self._receive_c(c, arrived, got, total, msg, src)
                got += arrived
                self._pos += arrived * FRAME
                arrived = 0
            while arrived:
                slot = (self._pos // FRAME) % RING_FRAMES
                n = min(arrived, RING_FRAMES - slot)
                block = self._ring[slot:slot + n]
                self._check_headers(block, src, msg, got, chunks, total)
                last = got + n == chunks
                full = n - 1 if last else n
                if full:
                    apply(got * PAYLOAD, block[:full, HEADER:])
                if last:
                    size = total - (chunks - 1) * PAYLOAD
                    apply((chunks - 1) * PAYLOAD, block[n - 1:n, HEADER:HEADER + size])
                got += n
                arrived -= n
                self._pos += n * FRAME
            if granted < chunks and got + self._window - granted >= max(1, self._window // 4):
                granted = min(chunks, got + self._window)
                peer.send(b"C", msg, granted)
        peer.forget_done(msg)

    def _receive_c(self, c: tuple, n: int, first: int, total: int, msg: int, src: int) -> None:
        """libknod-client's knod_chunks_receive: checks and applies n chunks in the ring."""
        dst, dtype, op = c
        lib = knod._capi.lib()
        err = ctypes.c_void_p()
        code = lib.knod_chunks_receive(dst.ctypes.data, self._ring.ctypes.data, RING_FRAMES,
                                       (self._pos // FRAME) % RING_FRAMES, n, first, total, msg,
                                       src, dtype, op, ctypes.byref(err))
        if code:
            message = knod._capi.text(lib.knod_error_message(err.value))
            lib.knod_error_free(err.value)
            raise ChunkError(f"rank {self._rank}: {message}")

    def _check_receiving(self, peer: _Peer, msg: int) -> None:
        """Raises the group's failure, unless it is only that the sender exited after sending
        the whole message: what it sent is still coming (a loss is caught by the grace)."""
        failed = self._failed
        if failed is None:
            return
        if isinstance(failed, PeerFailed) and failed.rank == peer.rank:
            with peer.cond:
                if msg in peer.done:
                    return
        raise failed

    def _check_headers(self, block: numpy.ndarray, src: int, msg: int, first: int, chunks: int,
                       total: int) -> None:
        hdr = numpy.ascontiguousarray(block[:, :HEADER]).view("<u4")
        n = block.shape[0]
        seq = numpy.arange(first, first + n, dtype=numpy.uint32)
        lengths = numpy.full(n, PAYLOAD, dtype=numpy.uint32)
        if first + n == chunks:
            lengths[-1] = total - (chunks - 1) * PAYLOAD
        want = lengths | numpy.uint32(src << 16)
        bad = ((hdr[:, 0] != MAGIC) | (hdr[:, 1] != msg) | (hdr[:, 2] != seq) |
               (hdr[:, 3] != want))
        if bad.any():
            i = int(numpy.argmax(bad))
            raise ChunkError(
                f"rank {self._rank}: chunk {first + i} of message {msg} from rank {src} is not "
                f"the one expected (magic {hdr[i, 0]:#x}, message {hdr[i, 1]}, sequence "
                f"{hdr[i, 2]}, length/source {hdr[i, 3]:#x}; expected sequence {first + i}, "
                f"length/source {want[i]:#x}): a chunk was lost, reordered or foreign")

    # -- the operation queue -------------------------------------------------------------------

    def _run_ops(self) -> None:
        while True:
            job = self._ops.get()
            if job is None:
                return
            fn, fut = job
            try:
                self._check()
                result = fn()
            except BaseException as e:  # noqa: B902 (handed to the waiter)
                self._fail(e)
                fut.set_exception(e)
            else:
                if result is not _PENDING:
                    fut.set_result(result)
            del fn, job

    def _submit(self, fn: Callable[[], Any]) -> Any:
        fut: torch.futures.Future = torch.futures.Future()
        if self._closed:
            fut.set_exception(RuntimeError("the knod process group was shut down"))
        else:
            self._ops.put((fn, fut))
        return _work(fut)

    def _send_async(self, dst: int, data: numpy.ndarray) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        assert self._sender is not None
        self._sender.submit(dst, data, fut, None)
        return fut

    # -- operations ------------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def _get_backend_name(self) -> str:
        return BACKEND

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _reduce_op(opts)
        _check_tensors(tensors, "all_reduce")
        return self._submit(lambda: self._allreduce(tensors, op))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _reduce_op(opts)
        _check_tensors(tensors, "all_reduce_coalesced")
        return self._submit(lambda: self._allreduce(tensors, op))

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        _check_tensors(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        return self._submit(lambda: self._broadcast(tensors, root))

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                  opts: Any = None) -> Any:
        _check_tensors(inputs, "all_gather")
        for outs in output_lists:
            _check_tensors(outs, "all_gather")
            if len(outs) != self._size:
                raise ValueError(f"all_gather: {len(outs)} output tensors for {self._size} ranks")
        return self._submit(lambda: self._allgather(output_lists, inputs))

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any = None) -> Any:
        op = _reduce_op(opts)
        _check_tensors(outputs, "reduce_scatter")
        for ins in input_lists:
            _check_tensors(ins, "reduce_scatter")
        return self._submit(lambda: self._reduce_scatter(outputs, input_lists, op))

    def barrier(self, opts: Any = None) -> Any:
        token = torch.zeros(1, dtype=torch.int32)
        return self._submit(lambda: (self._allreduce([token], "sum"), [])[1])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        _check_tensors(tensors, "send")
        self._check_peer(dst, "send to")
        data = [_bytes_of(t, writable=False) for t in tensors]
        payload = numpy.concatenate(data) if len(data) > 1 else data[0]
        fut: torch.futures.Future = torch.futures.Future()

        def run() -> Any:
            # Handed to the sender thread, which completes `fut`: the op queue moves on at
            # once, so a later irecv can grant credits (isend + irecv both ways cannot deadlock).
            assert self._sender is not None
            self._sender.submit(dst, payload, fut, tensors)
            return _PENDING

        if self._closed:
            fut.set_exception(RuntimeError("the knod process group was shut down"))
        else:
            self._ops.put((run, fut))
        return _work(fut)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        _check_tensors(tensors, "recv")
        self._check_peer(src, "receive from")
        return self._submit(lambda: self._recv(tensors, src))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        raise RuntimeError("ProcessGroup knod does not support recv from any source: "
                           "name the sending rank (src=...)")

    def _check_peer(self, peer: int, what: str) -> None:
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"rank {self._rank} cannot {what} rank {peer} (group of "
                             f"{self._size})")

    # -- algorithms (run on the op thread) ------------------------------------------------------

    def _recv(self, tensors: List[torch.Tensor], src: int) -> List[torch.Tensor]:
        views = [_Target(t) for t in tensors]
        total = sum(v.bytes.size for v in views)
        if len(views) == 1:
            self._recv_message(src, total, _copy_into(views[0].bytes))
        else:
            buf = numpy.empty(total, dtype=numpy.uint8)
            self._recv_message(src, total, _copy_into(buf))
            at = 0
            for v in views:
                v.bytes[:] = buf[at:at + v.bytes.size]
                at += v.bytes.size
        for v in views:
            v.finish()
        return tensors

    def _exchange(self, send_to: int, send_data: numpy.ndarray, recv_from: int, total: int,
                  apply: Callable[[int, numpy.ndarray], None]) -> None:
        fut = self._send_async(send_to, send_data)
        try:
            self._recv_message(recv_from, total, apply)
        finally:
            fut.wait()

    def _allreduce(self, tensors: List[torch.Tensor], op: str) -> List[torch.Tensor]:
        for t in tensors:
            target = _Target(t)
            self._ring_allreduce(target, op)
            target.finish()
        return tensors

    def _chunks(self, nelem: int) -> List[tuple]:
        n = self._size
        edges = [nelem * i // n for i in range(n + 1)]
        return [(edges[i], edges[i + 1]) for i in range(n)]

    def _ring_reduce_scatter(self, target: "_Target", bounds: List[tuple], op: str) -> None:
        """Ring reduce-scatter over `target`'s elements cut at `bounds`: rank r ends with the
        reduction of chunk r."""
        n, r = self._size, self._rank
        right, left = (r + 1) % n, (r - 1) % n
        es = target.itemsize
        flat = target.bytes
        for step in range(n - 1):
            cs, cr = (r - step - 1) % n, (r - step - 2) % n
            s0, s1 = bounds[cs]
            q0, q1 = bounds[cr]
            dst = flat[q0 * es:q1 * es]
            self._exchange(right, flat[s0 * es:s1 * es], left, (q1 - q0) * es,
                           _reduce_into(dst, target.dtype, op))

    def _ring_allgather(self, flat: numpy.ndarray, bounds: List[tuple], es: int) -> None:
        """Ring all-gather: rank r holds chunk r; afterwards every rank holds every chunk."""
        n, r = self._size, self._rank
        right, left = (r + 1) % n, (r - 1) % n
        for step in range(n - 1):
            cs, cr = (r - step) % n, (r - step - 1) % n
            s0, s1 = bounds[cs]
            q0, q1 = bounds[cr]
            self._exchange(right, flat[s0 * es:s1 * es], left, (q1 - q0) * es,
                           _copy_into(flat[q0 * es:q1 * es]))

    def _ring_allreduce(self, target: "_Target", op: str) -> None:
        if self._size == 1:
            return
        bounds = self._chunks(target.nelem)
        self._ring_reduce_scatter(target, bounds, "sum" if op == "avg" else op)
        self._ring_allgather(target.bytes, bounds, target.itemsize)
        if op == "avg":
            target.tensor.div_(self._size)

    def _broadcast(self, tensors: List[torch.Tensor], root: int) -> List[torch.Tensor]:
        n, r = self._size, self._rank
        for t in tensors:
            target = _Target(t)
            pos = (r - root) % n  # place in the chain root -> root+1 -> ...
            if pos > 0:
                self._recv_message((r - 1) % n, target.bytes.size, _copy_into(target.bytes))
            if pos < n - 1:
                self._send_async((r + 1) % n, target.bytes).wait()
            target.finish()
        return tensors

    def _allgather(self, output_lists: List[List[torch.Tensor]],
                   inputs: List[torch.Tensor]) -> List[List[torch.Tensor]]:
        n, r = self._size, self._rank
        for outs, t in zip(output_lists, inputs):
            src = _bytes_of(t, writable=False)
            for o in outs:
                if o.numel() * o.element_size() != src.size or o.dtype != t.dtype:
                    raise ValueError("all_gather: every output tensor must match the input's "
                                     "dtype and size")
            buf = numpy.empty(src.size * n, dtype=numpy.uint8)
            buf[r * src.size:(r + 1) * src.size] = src
            bounds = [(i * src.size, (i + 1) * src.size) for i in range(n)]
            self._ring_allgather(buf, bounds, 1)
            for i, o in enumerate(outs):
                target = _Target(o)
                target.bytes[:] = buf[i * src.size:(i + 1) * src.size]
                target.finish()
        return output_lists

    def _reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                        op: str) -> List[torch.Tensor]:
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self._size:
                raise ValueError(f"reduce_scatter: {len(ins)} inputs for {self._size} ranks")
            if any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
                raise ValueError("reduce_scatter: every input must match the output's dtype "
                                 "and size")
            work = torch.cat([i.reshape(-1) for i in ins])
            target = _Target(work)
            m = out.numel()
            bounds = [(i * m, (i + 1) * m) for i in range(self._size)]
            if self._size > 1:
                self._ring_reduce_scatter(target, bounds, "sum" if op == "avg" else op)
            mine = work[self._rank * m:(self._rank + 1) * m]
            if op == "avg":
                mine = mine / self._size
            out.copy_(mine.reshape(out.shape))
        return outputs


def _mtu_hint(message: str) -> str:
    if "too long" not in message:
        return ""
    return (f" (a chunk is a {FRAME + 28}-byte IPv4 datagram: every link on the way needs an MTU "
            "of at least that, as the sim's and examples/sim_nodes.py's veths have)")


class _Work(dist.distributed_c10d.Work):
    """An operation's handle: wait() raises the operation's error. (torch 1.13's
    _create_work_from_future returns a handle whose wait() returns True on a failed future: a
    failed all_reduce would leave the tensor unreduced, silently.) Python keeps every handle
    until long after it completed (_recent): torch 1.13 runs the base class's wait(), which never
    returns, on a Python Work that only C++ still holds (DDP's)."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut
        _recent.append(self)

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()  # raises the operation's error
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
        except BaseException:  # noqa: B902
            return False
        return True

    def exception(self) -> Any:
        try:
            self._fut.wait()
        except BaseException as e:  # noqa: B902
            return e
        return None

    def result(self) -> Any:
        return self._fut.wait()

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def synchronize(self) -> None:
        pass


_recent: "collections.deque[_Work]" = collections.deque(maxlen=1024)


def _work(fut: torch.futures.Future) -> _Work:
    return _Work(fut)


_PENDING = object()
_live: "weakref.WeakSet[ProcessGroupKnod]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for pg in list(_live):
        pg.shutdown()


_OPS = {"SUM": "sum", "PRODUCT": "product", "MIN": "min", "MAX": "max", "AVG": "avg"}


def _reduce_op(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM
    for name, ours in _OPS.items():
        if op == getattr(dist.ReduceOp, name):
            return ours
    raise RuntimeError(f"ProcessGroup knod does not support reduce op {op}: it has "
                       f"{', '.join(_OPS)}")


def _check_tensors(tensors: List[torch.Tensor], what: str) -> None:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected tensors, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise RuntimeError(f"ProcessGroup knod: {what} of a {t.device.type} tensor is not "
                               "supported on the sim (CPU tensors only; docs/collectives.md)")
        if t.is_sparse:
            raise RuntimeError(f"ProcessGroup knod: {what} of a sparse tensor is not supported")


def _bytes_of(t: torch.Tensor, writable: bool) -> numpy.ndarray:
    """The tensor's bytes as a flat uint8 numpy array (a copy when not contiguous)."""
    c = t.detach()
    if not c.is_contiguous():
        c = c.contiguous()
    flat = c.reshape(-1).view(torch.uint8) if c.numel() else torch.empty(0, dtype=torch.uint8)
    return flat.numpy()


class _Target:
    """A tensor to write into: its bytes (a contiguous stand-in if it is not contiguous),
    copied back by finish()."""

    def __init__(self, t: torch.Tensor) -> None:
        self.orig = t
        self.tensor = t.detach() if t.is_contiguous() else t.detach().contiguous()
        self.dtype = t.dtype
        self.itemsize = t.element_size()
        self.nelem = t.numel()
        flat = self.tensor.reshape(-1)
        self.bytes = flat.view(torch.uint8).numpy() if self.nelem else numpy.empty(
            0, dtype=numpy.uint8)

    def finish(self) -> None:
        if self.tensor.data_ptr() != self.orig.data_ptr():
            with torch.no_grad():
                self.orig.copy_(self.tensor)


def _copy_into(dst: numpy.ndarray) -> Callable[[int, numpy.ndarray], None]:
    def apply(at: int, payload: numpy.ndarray) -> None:
        n = payload.shape[0] * payload.shape[1]
        dst[at:at + n].reshape(payload.shape)[...] = payload
    apply.c = (dst, 0, _C_COPY)  # type: ignore[attr-defined]
    return apply


# knod_chunks_receive's element types and operations (knod/client.h); others stay in Python.
_C_COPY = 0
_C_OPS = {"sum": 1, "product": 2, "min": 3, "max": 4}
_C_DTYPES = {torch.uint8: 1, torch.int8: 2, torch.int16: 3, torch.int32: 4, torch.int64: 5,
             torch.float32: 6, torch.float64: 7}


_TORCH_OPS = {
    "sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
}


def _reduce_into(dst: numpy.ndarray, dtype: torch.dtype,
                 op: str) -> Callable[[int, numpy.ndarray], None]:
    fn = _TORCH_OPS[op]

    def apply(at: int, payload: numpy.ndarray) -> None:
        n = payload.shape[0] * payload.shape[1]
        mine = torch.from_numpy(dst[at:at + n].reshape(payload.shape)).view(dtype)
        theirs = torch.from_numpy(payload).view(dtype)
        if dtype == torch.bool and op in ("sum", "max"):
            torch.logical_or(mine, theirs, out=mine)
        elif dtype == torch.bool and op in ("product", "min"):
            torch.logical_and(mine, theirs, out=mine)
        else:
            fn(mine, theirs, out=mine)
    if dtype in _C_DTYPES:
        apply.c = (dst, _C_DTYPES[dtype], _C_OPS[op])  # type: ignore[attr-defined]
    return apply


def _create(*args: Any) -> ProcessGroupKnod:
    """The creator torch calls: (opts, pg_options) with extended_api, else (store, rank, size,
    timeout) [, devices] on torch 2.x."""
    if len(args) == 2 and hasattr(args[0], "store"):
        o = args[0]
        return ProcessGroupKnod(o.store, o.group_rank, o.group_size, o.timeout,
                                str(getattr(o, "group_id", "0")),
                                list(getattr(o, "global_ranks_in_group", []) or []))
    store, rank, size, timeout = args[:4]
    return ProcessGroupKnod(store, rank, size, timeout)


def _hook_destroy() -> None:
    """destroy_process_group() ends the bindings of the knod groups it destroys (torch only
    forgets a group; its threads would hold it, and the binding, until the process exits)."""
    c10d = dist.distributed_c10d
    original = c10d.destroy_process_group
    if getattr(original, "_knod_hooked", False):
        return

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is getattr(c10d, "GroupMember").WORLD:
            doomed = list(_live)
        else:
            doomed = [group] if isinstance(group, ProcessGroupKnod) else []
        original(group)
        for pg in doomed:
            pg.shutdown()

    destroy_process_group._knod_hooked = True  # type: ignore[attr-defined]
    destroy_process_group.__doc__ = original.__doc__
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def _register() -> None:
    _hook_destroy()
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    import inspect

    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:  # torch 2.x
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True)


_register()
