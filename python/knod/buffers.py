"""Receive buffers a binding can cover: a dma-buf (GPU memory) or, for the sim driver, a sealed
memfd mapped into this process."""
from __future__ import annotations

import fcntl
import mmap
import os
import weakref
from typing import Any, Optional, Tuple


# Every SimBuffer not yet collected: a tensor or array handed to register_buffer() is bound by
# finding the SimBuffer whose mapping holds its memory.
_live: "weakref.WeakSet[SimBuffer]" = weakref.WeakSet()


class SimBuffer(mmap.mmap):
    """`nbytes` bytes of shared memory standing in for VRAM with the sim driver: a memfd sealed
    against shrinking (what the daemon requires of a sim region), mapped read-write. It is an
    mmap, so it has the buffer protocol: numpy.frombuffer(buf, dtype=numpy.uint8) or
    torch.frombuffer(buf, dtype=torch.uint8) is a view that sees the bytes the daemon writes.
    Byte i of a binding's stream lands at offset + (i mod length).

    close() unmaps and closes the fd (views must be gone first: mmap's BufferError otherwise).
    """

    def __new__(cls, nbytes: int) -> SimBuffer:
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"SimBuffer needs a positive byte count, not {nbytes!r}")
        fd = os.memfd_create("knod-sim-buffer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            self = super().__new__(cls, fd, nbytes, flags=mmap.MAP_SHARED,
                                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        # The memfd is ours, not mmap's (it maps a dup): closed with the buffer, or when the
        # buffer is collected (a sim_tensor() whose tensor went), never left open.
        self._close_fd = weakref.finalize(self, os.close, fd)
        self._address = _mapping_address(self)
        _live.add(self)
        return self

    def __init__(self, nbytes: int) -> None:  # mmap has no __init__ of its own to call
        pass

    def fileno(self) -> int:
        """The memfd (the region the daemon is handed); it stays this buffer's."""
        return self._fd

    @property
    def nbytes(self) -> int:
        """The buffer's size in bytes."""
        return len(self)

    def close(self) -> None:
        if not self.closed:
            super().close()
        if self._fd >= 0:
            self._close_fd()
            self._fd = -1

    def resize(self, newsize: int) -> None:
        """Refused: the region the daemon was handed has this size (sealed against shrinking),
        and a moved mapping would no longer be where bound tensors say it is."""
        raise OSError("a SimBuffer cannot be resized: make a new one")

    def tensor(self, dtype: Any = None) -> Any:
        """A torch tensor over the whole buffer (torch.uint8 unless `dtype`; the size must be a
        multiple of its element size), sharing its memory: the bytes the daemon writes appear
        in it, and knod.register_buffer(tensor) binds this buffer. The tensor holds the buffer's
        export (through numpy), so close() raises BufferError while it or any view of it lives:
        the memory cannot be unmapped under a tensor."""
        import numpy
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if len(self) % itemsize:
            raise ValueError(f"{len(self)} bytes are not a whole number of {dtype} elements "
                             f"({itemsize} bytes each)")
        # Bytes first, then a view as `dtype`: also for types numpy lacks (bfloat16).
        return torch.from_numpy(numpy.frombuffer(self, dtype=numpy.uint8)).view(dtype)

    def __repr__(self) -> str:
        return f"<knod.SimBuffer {len(self) if not self.closed else 'closed'} bytes fd={self._fd}>"


def _mapping_address(buf: mmap.mmap) -> int:
    """Where `buf` is mapped in this process (a transient export of its buffer)."""
    import ctypes

    probe = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


def sim_region(address: int, nbytes: int) -> Optional[Tuple[SimBuffer, int]]:
    """The live SimBuffer whose mapping holds [address, address + nbytes), and the offset of
    `address` in it; None when no SimBuffer does."""
    for buf in list(_live):
        if buf.closed:
            continue
        start = buf._address
        if start <= address and address + nbytes <= start + len(buf):
            return buf, address - start
    return None


class DmaBuf:
    """A dma-buf fd and the byte range of it to bind: what knod.gpu's export helpers return,
    or one made by hand from any exporter. `owned`: close() closes the fd."""

    def __init__(self, fd: int, offset: int, length: int, owned: bool = True) -> None:
        if fd < 0 or offset < 0 or length <= 0:
            raise ValueError(f"bad dma-buf range fd={fd} offset={offset} length={length}")
        self.fd, self.offset, self.length, self.owned = fd, offset, length, owned

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> DmaBuf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<knod.DmaBuf fd={self.fd} offset={self.offset} length={self.length}>"
