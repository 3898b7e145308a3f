"""knod.distributed's data path on a devmem NIC (KNOD_DIST_TRANSPORT=devmem; docs/collectives.md).

A rank's binding is of the NIC to a dma-buf of its own, for the flow ``tcp PEERS:* ->
ADDRESS:PORT``. Every other rank opens one TCP stream to that address and port and sends each
message on it as a header and the payload (libknod-client's knod_stream_send). The NIC places
the payload in the receiver's dma-buf and the receiver reads it there:
knod_devmem_stream_receive checks the header against the message it expects, reduces or copies
the payload into place, and gives every fragment back to the NIC.

TCP is the flow control, and what keeps a byte from being lost or reordered; the header is the
check against a foreign or out-of-step stream, and every fragment's dma-buf id the check against
a flow that reached another binding's queue. Unlike the sim's path there are no credits and no
ring: a receiver that has not yet reached a message leaves it in the socket (each stream's
receive buffer is capped so that unread streams cannot hold the whole dma-buf), and the sender
waits in the kernel. Every wait has the whole message's budget (the group's timeout) and ends at
once when the group fails (an eventfd per stream): a peer's death ends the waits on every other
peer's stream, and its own stream's end says whether its last message came whole.

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
# The C API's codes (knod/client.h) a stream call answers with.
_ERR_FAILED, _ERR_TIMEOUT, _ERR_ENDED, _ERR_IO = 10, 12, 13, 14


class Cancelled(Exception):
    """A stream wait ended by DevmemPath.cancel(): the group failed or shut down."""


def dmabuf_bytes() -> int:
    """KNOD_DIST_DMABUF_BYTES, checked: whole pages (udmabuf takes nothing else)."""
    text = os.environ.get("KNOD_DIST_DMABUF_BYTES", str(DMABUF_BYTES))
    page = mmap.PAGESIZE
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0 or n % page:
        raise ValueError(f"KNOD_DIST_DMABUF_BYTES={text!r}: give a positive multiple of the page "
                         f"size ({page} bytes), at most udmabuf's size_limit_mb (64 MiB unless "
                         "the module was loaded with another)")
    return n


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
            hint = (" (more than udmabuf's size_limit_mb? set KNOD_DIST_DMABUF_BYTES lower)"
                    if e.errno == 22 else "")
            raise knod.Unavailable(f"making a {nbytes}-byte udmabuf for the rank's receive "
                                   f"buffer: {e}{hint}") from None
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
        self.dmabuf_id = 0  # the kernel's id of the binding's dma-buf (Binding.dmabuf_id)
        # Readable once cancel() wrote it: one per peer's stream in, one for every send.
        self._cancel_in: Dict[int, int] = {}
        self._cancel_out = os.eventfd(0, os.EFD_CLOEXEC)
        # A call in the C library uses its socket and knod_devmem_rx: close() leaves the closing
        # and freeing to the last call still running.
        self._lock = threading.Lock()
        self._busy = 0
        self._closed = False
        self._released = False

    # -- set-up ---------------------------------------------------------------------------------

    def make_region(self) -> knod.DmaBuf:
        nbytes = dmabuf_bytes()
        self.region = HostDmabuf(nbytes)
        assert self.region.dmabuf is not None
        return self.region.dmabuf

    def use_mapping(self, mapping: Any) -> None:
        """The CPU mapping of the binding's dma-buf (make_region's, or a test's memory)."""
        self._view = numpy.frombuffer(mapping, dtype=numpy.uint8)

    def _dmabuf_size(self) -> int:
        return self._view.size if self._view is not None else DMABUF_BYTES

    def listen(self, address: str, port: int) -> None:
        """The binding's flow's end: peers' streams come to address:port."""
        self._listener = socket.create_server((address, port), backlog=max(1, self.size))
        # Bytes a rank has not read yet hold the NIC's buffers in its dma-buf: no stream may
        # hold more than its share, or unread streams would starve the one being read.
        # (Accepted streams inherit the listener's buffer; the kernel doubles the figure.)
        share = max(1, self.size - 1) * 4
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF,
                                  max(128 << 10, self._dmabuf_size() // share))

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
                while len(pending) > 4 * self.size:  # a flood of strangers: oldest out
                    pending.pop(next(iter(pending))).close()
            except socket.timeout:
                pass
            except OSError as e:  # EMFILE and the like: the ranks' streams come again
                if e.errno not in (23, 24, 103, 105):  # ENFILE EMFILE ECONNABORTED ENOBUFS
                    raise
            for r in dests:
                if r in self._in:
                    continue
                if r not in claims and store.check([f"knod/stream/{r}/{self.rank}"]):
                    claims[r] = store.get(f"knod/stream/{r}/{self.rank}").decode()
                s = pending.pop(claims.get(r, ""), None)
                if s is not None:
                    self._prepare(s)
                    self._in[r] = (s, self._receiver(s))
                    self._cancel_in[r] = os.eventfd(0, os.EFD_CLOEXEC)
        for s in pending.values():
            s.close()
        self._listener.close()
        self._listener = None

    @staticmethod
    def _prepare(s: socket.socket) -> None:
        s.setblocking(True)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _receiver(self, s: socket.socket) -> int:
        lib = knod._capi.lib()
        handle, err = ctypes.c_void_p(), ctypes.c_void_p()
        failed = _check(lib.knod_devmem_rx_new(s.fileno(), ctypes.byref(handle),
                                               ctypes.byref(err)), err)
        if failed:
            raise self._chunk_error(f"rank {self.rank}: {failed[1]}")
        return int(handle.value or 0)

    # -- messages -------------------------------------------------------------------------------

    def _enter(self, table: Dict[int, Any], peer: int) -> Any:
        """The peer's entry, counted as in use until _leave()."""
        with self._lock:
            if self._closed:
                raise Cancelled()
            entry = table[peer]
            self._busy += 1
            return entry

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            if self._closed and not self._busy:
                self._release()

    def _budget_ms(self) -> int:
        return max(0, min(int(self.timeout * 1000), 2**31 - 1))

    def _raise(self, code: int, message: str, peer: int) -> None:
        if code == _ERR_ENDED:
            raise Cancelled(message)
        if code == _ERR_TIMEOUT:
            raise TimeoutError(f"rank {self.rank}: {message} (the group's timeout)")
        if code == _ERR_IO:
            raise self._peer_failed(f"rank {self.rank}: {message}", peer)
        raise self._chunk_error(f"rank {self.rank}: {message}")

    def send(self, dst: int, msg: int, data: numpy.ndarray) -> None:
        """Message `msg` to rank `dst`, whole. Cancelled when the group fails."""
        lib = knod._capi.lib()
        s = self._enter(self._out, dst)
        try:
            err = ctypes.c_void_p()
            failed = _check(lib.knod_stream_send(s.fileno(), data.ctypes.data, data.size, msg,
                                                 self.rank, self._budget_ms(), self._cancel_out,
                                                 ctypes.byref(err)), err)
        finally:
            self._leave()
        if failed:
            self._raise(failed[0], f"sending to rank {dst}: {failed[1]}", dst)

    def receive(self, src: int, msg: int, total: int,
                apply: Callable[[int, numpy.ndarray], None]) -> int:
        """Message `msg` (`total` bytes) from rank `src`, applied as the sim's path applies
        chunks; returns the bytes the NIC placed in the dma-buf. Cancelled when the group
        fails (unless only `src` did: its stream's end says whether the message came)."""
        lib = knod._capi.lib()
        c = getattr(apply, "c", None)
        if c is None:  # float16, bfloat16, bool: copied whole, then reduced with torch
            tmp = numpy.empty(total, dtype=numpy.uint8)
            dst, dtype, op = tmp, 0, 0
        else:
            dst, dtype, op = c
        _, handle = self._enter(self._in, src)
        try:
            view = self._view
            placed, err = ctypes.c_uint64(0), ctypes.c_void_p()
            failed = _check(lib.knod_devmem_stream_receive(
                ctypes.c_void_p(handle), view.ctypes.data if view is not None else None,
                view.size if view is not None else 0, self.dmabuf_id, dst.ctypes.data, total,
                msg, src, dtype, op, self._budget_ms(), self._cancel_in[src],
                ctypes.byref(placed), ctypes.byref(err)), err)
        finally:
            self._leave()
        if failed:
            self._raise(failed[0], failed[1], src)
        if c is None and total:
            apply(0, tmp.reshape(1, total))
        return int(placed.value)

    # -- end --------------------------------------------------------------------------------------

    def cancel(self, keep: Optional[int] = None) -> None:
        """Ends every stream wait, now and later: every send, every receive but those from rank
        `keep` (a peer that died: what it sent before is still read, and its stream's end says
        whether the message came whole)."""
        with self._lock:
            if self._released:  # the fds are closed (their numbers may be another file's)
                return
            for r, fd in list(self._cancel_in.items()) + [(-1, self._cancel_out)]:
                if r != keep or keep is None:
                    os.eventfd_write(fd, 1)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        lib = knod._capi.lib()
        for s, handle in self._in.values():
            lib.knod_devmem_rx_free(ctypes.c_void_p(handle))
            s.close()
        for s in self._out.values():
            s.close()
        for fd in list(self._cancel_in.values()) + [self._cancel_out]:
            os.close(fd)
        self._in.clear()
        self._out.clear()
        self._cancel_in.clear()

    def close(self) -> None:
        """Ends every wait and closes the streams (once no call still uses them)."""
        self.cancel()
        with self._lock:
            self._closed = True
            if not self._busy:
                self._release()
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
