"""knod.distributed's devmem data path (KNOD_DIST_TRANSPORT=devmem, issue #53) between two ranks
in this process: their streams are real TCP on the loopback, received with
recvmsg(MSG_SOCK_DEVMEM) through libknod-client (no devmem NIC here: every byte comes back
linear, so the dma-buf's mapping is ordinary memory), applied by the backend's own copy and
reduction closures. The header checks, fragments and a hostile kernel's answers are
DevmemStream.* (C++); the bind and the udmabuf on a live kernel, the VM's devmem test and
test_collectives.py's devmem init."""
import mmap
import socket
import threading

import numpy
import pytest

pytest.importorskip("torch", reason="knod.distributed needs torch (Debian's python3-torch)")

import torch  # noqa: E402

import knod  # noqa: E402
from knod import _dist_devmem  # noqa: E402
from knod.distributed import ChunkError, PeerFailed, _copy_into, _reduce_into  # noqa: E402


class Store:
    """The part of a torch Store the path uses."""

    def __init__(self):
        self.kv = {}

    def set(self, key, value):
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.kv[key]

    def check(self, keys):
        return all(k in self.kv for k in keys)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def both_ranks(fn):
    """fn(0) and fn(1) on threads of their own, at once; what either raised."""
    errors = []

    def run(r):
        try:
            fn(r)
        except BaseException as e:  # noqa: B902 (the caller reports it)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture
def pair():
    """Two ranks' paths, connected both ways; closed afterwards."""
    store = Store()
    ports = [free_port(), free_port()]
    paths = [_dist_devmem.DevmemPath(r, 2, 30.0, ChunkError, PeerFailed) for r in range(2)]
    maps = [mmap.mmap(-1, 1 << 16) for _ in range(2)]
    for r, p in enumerate(paths):
        p.use_mapping(maps[r])
        p.listen("127.0.0.1", ports[r])
    import time
    deadline = time.monotonic() + 60
    errors = both_ranks(lambda r: paths[r].connect(store, {1 - r: ("127.0.0.1", ports[1 - r])},
                                                   deadline))
    assert not errors, errors
    yield paths
    for p in paths:
        p.close()
        p.close_region()


def exchange(paths, sends, receives):
    """Rank 0 and 1 each send `sends[r]` and receive with `receives[r]` = (total, apply), at once
    (the sender on a thread of its own, as the backend's sender thread)."""
    def run(r):
        t = threading.Thread(target=paths[r].send, args=(1 - r, 0, sends[r]))
        t.start()
        paths[r].receive(1 - r, 0, *receives[r])
        t.join()
    return both_ranks(run)


def test_a_sum_both_ways_equals_the_elementwise_sum(pair):
    a = torch.arange(300_000, dtype=torch.float32)
    b = torch.full((300_000,), 0.5, dtype=torch.float32)
    mine = [a.clone(), b.clone()]
    views = [m.view(torch.uint8).numpy() for m in mine]
    sends = [a.view(torch.uint8).numpy().copy(), b.view(torch.uint8).numpy().copy()]
    receives = [(views[r].size, _reduce_into(views[r], torch.float32, "sum")) for r in range(2)]
    assert exchange(pair, sends, receives) == []
    assert torch.equal(mine[0], a + b) and torch.equal(mine[1], a + b)


def test_dtypes_without_a_c_reduction_go_through_torch(pair):
    # bfloat16 has no C reduction: the message is copied whole, then reduced with torch.
    a = torch.linspace(-4, 4, 5000).to(torch.bfloat16)
    b = torch.linspace(1, 2, 5000).to(torch.bfloat16)
    mine = [a.clone(), b.clone()]
    views = [m.view(torch.uint8).numpy() for m in mine]
    sends = [a.view(torch.uint8).numpy().copy(), b.view(torch.uint8).numpy().copy()]
    apply = [_reduce_into(views[r], torch.bfloat16, "max") for r in range(2)]
    assert not hasattr(apply[0], "c")
    assert exchange(pair, sends, [(views[r].size, apply[r]) for r in range(2)]) == []
    assert torch.equal(mine[0], torch.maximum(a, b)) and torch.equal(mine[1], mine[0])


def test_an_out_of_step_message_is_a_chunk_error_and_nothing_is_returned(pair):
    got = numpy.zeros(64, dtype=numpy.uint8)
    pair[1].send(0, 5, numpy.full(64, 7, dtype=numpy.uint8))  # message 5, not 0
    with pytest.raises(ChunkError, match="does not carry message 0"):
        pair[0].receive(1, 0, 64, _copy_into(got))
    assert not got.any()


def test_a_sender_that_closes_mid_message_fails_the_receive_naming_it(pair):
    got = numpy.zeros(1 << 20, dtype=numpy.uint8)
    # Half a message (a header for 1 MiB, then 1 KiB), then the sender's streams close.
    import struct
    pair[1]._out[0].sendall(struct.pack("<IIIIQ", 0x444F4E4B, 0, 1, 0, 1 << 20) + b"x" * 1024)
    pair[1].close()
    with pytest.raises(PeerFailed, match=r"rank 1 closed its stream after 1048 of 1048600 bytes"):
        pair[0].receive(1, 0, 1 << 20, _copy_into(got))


def test_no_udmabuf_names_the_fix(monkeypatch):
    import os
    real_open = os.open

    def fake_open(path, *a, **kw):
        if path == "/dev/udmabuf":
            raise FileNotFoundError(2, "No such file or directory")
        return real_open(path, *a, **kw)
    monkeypatch.setattr(os, "open", fake_open)
    with pytest.raises(knod.Unavailable, match="modprobe udmabuf"):
        _dist_devmem.HostDmabuf(1 << 20)


def test_a_cancel_ends_a_blocked_receive_but_not_the_dead_peers_own_stream(pair):
    # The group failed because rank 1 died: waits on other streams end, but what rank 1 sent
    # before is still read whole from its stream (here: sent after the cancel, as a late byte).
    got = numpy.zeros(64, dtype=numpy.uint8)
    done = []
    t = threading.Thread(target=lambda: done.append(
        pair[0].receive(1, 0, 64, _copy_into(got))))
    t.start()
    pair[0].cancel(keep=1)
    pair[1].send(0, 0, numpy.full(64, 3, dtype=numpy.uint8))
    t.join()
    assert done == [0] and (got == 3).all()
    # A cancel of everything ends a receive that waits for a message nobody sends.
    errors = []

    def wait():
        try:
            pair[0].receive(1, 1, 64, _copy_into(got))
        except BaseException as e:  # noqa: B902
            errors.append(e)
    t = threading.Thread(target=wait)
    t.start()
    pair[0].cancel()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], _dist_devmem.Cancelled), errors


def test_a_dmabuf_size_that_is_not_whole_pages_names_the_fix(monkeypatch):
    monkeypatch.setenv("KNOD_DIST_DMABUF_BYTES", "1000")
    with pytest.raises(ValueError, match="multiple of the page size"):
        _dist_devmem.dmabuf_bytes()
