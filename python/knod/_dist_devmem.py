"""knod.distributed's data path on a devmem NIC (KNOD_DIST_TRANSPORT=devmem; docs/collectives.md).

A rank's binding is of the NIC to a dma-buf of its own, for the flow ``tcp PEERS:* ->
ADDRESS:PORT``. Every other rank opens one TCP stream to that address and port and sends each
message on it as a header and the payload (libknod-client's knod_stream_send). The NIC places
the payload in the receiver's dma-buf and the receiver reads it there:
knod_devmem_stream_receive checks the header against the message it expects, reduces or copies
the payload into place, and gives every fragment back to the NIC.

TCP is the flow control, and what keeps a chunk from being lost or reordered; the header is the
check against a foreign or out-of-step stream. Unlike the sim's path there are no credits and no
ring: a receiver that has not yet reached a message leaves it in the socket, and the sender
waits in the kernel. The side channels (credits' channel on the sim) still carry failures and
goodbyes.

The dma-buf here is host memory (udmabuf over a sealed memfd), mapped for the CPU's reduction.
GPU memory would be a CUDA export read by a GPU kernel; the backend refuses GPU tensors.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy

import knod
import knod._capi

UDMABUF_CREATE = 0x40187542  # _IOW('u', 0x42, struct udmabuf_create)
UDMABUF_FLAGS_CLOEXEC = 0x01
F_ADD_SEALS = 1033
F_SEAL_SHRINK = 0x0002
DMABUF_BYTES = 16 << 20  # KNOD_DIST_DMABUF_BYTES: the NIC's receive buffers come out of it


class HostDmabuf:
    """A dma-buf over host memory (udmabuf over a sealed memfd), and its CPU mapping."""

    def __init__(self, nbytes: int) -> None:
        self.mapping: Optional[mmap.mmap] = None
        self.dmabuf: Optional[knod.DmaBuf] = None
        try:
            dev = os.open("/dev/udmabuf", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise knod.Unavailable(
                f"KNOD_DIST_TRANSPORT=devmem needs a dma-buf for the rank's receive buffer, made "
                f"with /dev/udmabuf: {e.strerror} (`modprobe udmabuf`, or run the rank where "
                "the kernel has CONFIG_UDMABUF)") from None
        memfd = -1
        try:
            memfd = os.memfd_create("knod-dist-devmem", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(memfd, nbytes)
            fcntl.fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)  # udmabuf's condition
            arg = bytearray(struct.pack("<IIQQ", memfd, UDMABUF_FLAGS_CLOEXEC, 0, nbytes))
            fd = fcntl.ioctl(dev, UDMABUF_CREATE, arg, True)
            self.dmabuf = knod.DmaBuf(fd, 0, nbytes)
            self.mapping = mmap.mmap(memfd, nbytes)
        except OSError as e:
            self.close()
            raise knod.Unavailable(f"making a {nbytes}-byte udmabuf for the rank's receive "
                                   f"buffer: {e}") from None
        finally:
            os.close(dev)
            if memfd >= 0:
                os.close(memfd)

    def close(self) -> None:
        if self.dmabuf is not None:
            self.dmabuf.close()
        if self.mapping is not None:
            try:
                self.mapping.close()
            except BufferError:
                pass  # a receive still reads it: the mapping goes with the last view


def _check(code: int, err: ctypes.c_void_p) -> Optional[Tuple[int, str]]:
    if code == 0:
        return None
    lib = knod._capi.lib()
    message = knod._capi.text(lib.knod_error_message(err.value))
    lib.knod_error_free(err.value)
    return code, message


class DevmemPath:
    """One rank's devmem data path: its listening socket, a stream to every other rank and one
    from each, and the mapping of its dma-buf. `chunk_error` and `peer_failed` are the backend's
    exception types (knod.distributed.ChunkError, PeerFailed)."""

    def __init__(self, rank: int, size: int, timeout: float, chunk_error: type,
                 peer_failed: type) -> None:
        lib = knod._capi.lib()
        if not hasattr(lib, "knod_devmem_stream_receive"):
            raise knod.Unavailable("the loaded libknod-client has no devmem stream calls (it "
                                   "is older than knod.distributed's devmem path): upgrade "
                                   "libknod-client1")
        self.rank, self.size, self.timeout = rank, size, timeout
        self._chunk_error, self._peer_failed = chunk_error, peer_failed
        self.region: Optional[HostDmabuf] = None
        self._view: Any = None  # the mapping's bytes, for their address
        self._listener: Optional[socket.socket] = None
        self._out: Dict[int, socket.socket] = {}
        self._in: Dict[int, Tuple[socket.socket, int]] = {}  # src -> (socket, knod_devmem_rx *)
        # A receive in the C library holds its knod_devmem_rx: close() leaves the freeing to the
        # last receive still running.
        self._lock = threading.Lock()
        self._busy = 0
        self._closed = False

    # -- set-up ---------------------------------------------------------------------------------

    def make_region(self) -> knod.DmaBuf:
        nbytes = int(os.environ.get("KNOD_DIST_DMABUF_BYTES", DMABUF_BYTES))
        self.region = HostDmabuf(nbytes)
        assert self.region.dmabuf is not None
        return self.region.dmabuf

    def use_mapping(self, mapping: Any) -> None:
        """The CPU mapping of the binding's dma-buf (make_region's, or a test's memory)."""
        self._view = numpy.frombuffer(mapping, dtype=numpy.uint8)

    def listen(self, address: str, port: int) -> None:
        """The binding's flow's end: peers' streams come to address:port."""
        self._listener = socket.create_server((address, port), backlog=max(1, self.size))

    def connect(self, store: Any, dests: Dict[int, tuple], deadline: float) -> None:
        """A stream to every other rank's flow, and one accepted from each. Which accepted
        stream is whose: each sender puts its stream's local address in the store, so a stream
        nobody claims is closed unread."""
        for r, dest in sorted(dests.items()):
            try:
                s = socket.create_connection(dest, timeout=max(0.1, deadline - time.monotonic()))
            except OSError as e:
                raise self._peer_failed(f"rank {r}: cannot open a stream to its flow "
                                        f"{dest[0]}:{dest[1]}: {e}", r) from None
            self._prepare(s)
            self._out[r] = s
            here = s.getsockname()
            store.set(f"knod/stream/{self.rank}/{r}", f"{here[0]}:{here[1]}")
        assert self._listener is not None
        pending: Dict[str, socket.socket] = {}
        claims: Dict[int, str] = {}
        while len(self._in) < len(dests):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(dests) - set(self._in))
                raise self._peer_failed(f"ranks {missing} never opened their stream to rank "
                                        f"{self.rank}")
            self._listener.settimeout(min(left, 0.5))
            try:
                s, peer = self._listener.accept()
                pending[f"{peer[0]}:{peer[1]}"] = s
            except socket.timeout:
                pass
            for r in dests:
                if r in self._in:
                    continue
                if r not in claims and store.check([f"knod/stream/{r}/{self.rank}"]):
                    claims[r] = store.get(f"knod/stream/{r}/{self.rank}").decode()
                s = pending.pop(claims.get(r, ""), None)
                if s is not None:
                    self._prepare(s)
                    self._in[r] = (s, self._receiver(s))
        for s in pending.values():
            s.close()
        self._listener.close()
        self._listener = None

    def _prepare(self, s: socket.socket) -> None:
        s.setblocking(True)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A peer that stops reading or sending fails the operation after the group's timeout.
        tv = struct.pack("ll", int(self.timeout), int((self.timeout % 1) * 1e6))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)

    def _receiver(self, s: socket.socket) -> int:
        lib = knod._capi.lib()
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        failed = _check(lib.knod_devmem_rx_new(s.fileno(), ctypes.byref(handle),
                                               ctypes.byref(err)), err)
        if failed:
            raise self._chunk_error(f"rank {self.rank}: {failed[1]}")
        return int(handle.value or 0)

    # -- messages -------------------------------------------------------------------------------

    def send(self, dst: int, msg: int, data: numpy.ndarray) -> None:
        lib = knod._capi.lib()
        err = ctypes.c_void_p()
        failed = _check(lib.knod_stream_send(self._out[dst].fileno(), data.ctypes.data,
                                             data.size, msg, self.rank, ctypes.byref(err)), err)
        if failed:
            raise self._peer_failed(f"rank {self.rank}: sending message {msg} to rank {dst}: "
                                    f"{failed[1]}", dst)

    def receive(self, src: int, msg: int, total: int,
                apply: Callable[[int, numpy.ndarray], None]) -> int:
        """Message `msg` (`total` bytes) from rank `src`, applied as the sim's path applies
        chunks; returns the bytes the NIC placed in the dma-buf."""
        lib = knod._capi.lib()
        c = getattr(apply, "c", None)
        if c is None:  # float16, bfloat16, bool: copied whole, then reduced with torch
            tmp = numpy.empty(total, dtype=numpy.uint8)
            dst, dtype, op = tmp, 0, 0
        else:
            dst, dtype, op = c
        with self._lock:
            if self._closed:
                raise self._peer_failed(f"rank {self.rank}: the process group was shut down")
            self._busy += 1
            view, handle = self._view, self._in[src][1]
        placed, err = ctypes.c_uint64(0), ctypes.c_void_p()
        try:
            failed = _check(lib.knod_devmem_stream_receive(
                ctypes.c_void_p(handle), view.ctypes.data if view is not None else None,
                view.size if view is not None else 0, dst.ctypes.data, total, msg, src, dtype,
                op, ctypes.byref(placed), ctypes.byref(err)), err)
        finally:
            with self._lock:
                self._busy -= 1
                if self._closed and not self._busy:
                    self._free_receivers()
        if failed:
            code, message = failed
            if "closed its stream" in message:
                raise self._peer_failed(f"rank {self.rank}: {message}", src)
            if code == 12:  # KNOD_ERR_TIMEOUT
                raise TimeoutError(f"rank {self.rank}: no data from rank {src} within the "
                                   f"group's timeout ({message})")
            raise self._chunk_error(f"rank {self.rank}: {message}")
        if c is None and total:
            apply(0, tmp.reshape(1, total))
        return int(placed.value)

    # -- end --------------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Wakes whatever waits on a stream (shutdown from another thread)."""
        for s in list(self._out.values()) + [s for s, _ in self._in.values()]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _free_receivers(self) -> None:
        lib = knod._capi.lib()
        for s, handle in self._in.values():
            lib.knod_devmem_rx_free(ctypes.c_void_p(handle))
            s.close()
        self._in.clear()

    def close(self) -> None:
        self.interrupt()
        with self._lock:
            self._closed = True
            if not self._busy:
                self._free_receivers()
        for s in self._out.values():
            s.close()
        self._out.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def close_region(self) -> None:
        """After the binding's release: the dma-buf and its mapping (kept while a view of it
        lives)."""
        self._view = None
        if self.region is not None:
            self.region.close()
            self.region = None
