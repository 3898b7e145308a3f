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
    against shrinking (what the daemon requires of a sim region), mapped read-write. Byte i of a
    binding's stream lands at offset + (i mod length).

    Views, safest first: buf.tensor() (or knod.sim_tensor(n)) and numpy.frombuffer(buf,
    dtype=numpy.uint8) hold the buffer's export, as a memoryview does, and so does a binding of
    the buffer (or of a tensor or array in it) until it is released or closed: close() raises
    BufferError, naming the bindings, while any of them lives. torch.frombuffer(buf) works too,
    but torch keeps a reference to the buffer, not an export, so close() cannot see its tensor:
    that is why close() and leaving a `with` block never unmap the memory, which goes when the
    last reference to the buffer does (mmap unmaps it then). No view outlives the memory.

    close() closes the memfd and marks the buffer closed (it can no longer be bound or give a
    tensor). Leaving a `with` block closes it the same way even while views or bindings hold it
    (an exception there would replace the block's own): the memory waits for them.
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
        self._closed = False
        # Bindings that hold this buffer's export, to name them when close() is refused (the
        # refusal itself is mmap's export count, which no caller can bypass).
        self._bindings: "weakref.WeakSet[Any]" = weakref.WeakSet()
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

    @property
    def closed(self) -> bool:
        """Whether close() (or the end of a `with` block) closed it."""
        return self._closed

    def close(self) -> None:
        """Closes the buffer: refused (BufferError, naming what holds it) while a binding or a
        view holding its export lives; again, does nothing. The memory stays mapped until the
        last reference to this object goes (a torch.frombuffer tensor keeps one)."""
        if self._closed:
            return
        if _exported(self):
            raise BufferError(self._in_use())
        self._close()

    def __exit__(self, *exc: object) -> None:
        # Never raises: a BufferError here would replace the block's own exception, and the
        # memory waits for the views and bindings still holding it anyway.
        self._close()

    def _close(self) -> None:
        # Never super().close(): that unmaps whenever no export lives, and a tensor from
        # torch.frombuffer(self) holds a reference, not an export. mmap unmaps when the
        # object goes, after every holder of either kind.
        self._closed = True
        if self._fd >= 0:
            self._close_fd()
            self._fd = -1

    def _in_use(self) -> str:
        bound = sorted(b.id for b in list(self._bindings) if b._holds(self))
        what = (f"bound by binding{'s' if len(bound) > 1 else ''} {', '.join(bound)} (release "
                "or close them first: Binding.close(), or leave their with block)"
                if bound else
                "views of its memory still live (a memoryview, a numpy array, buf.tensor() or a "
                "slice of one): delete them first")
        return f"this {len(self)}-byte SimBuffer is still in use, so it cannot close: {what}"

    def _require_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {len(self)}-byte SimBuffer is closed: make a new one")

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

        self._require_open()
        dtype = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if len(self) % itemsize:
            raise ValueError(f"{len(self)} bytes are not a whole number of {dtype} elements "
                             f"({itemsize} bytes each)")
        # Bytes first, then a view as `dtype`: also for types numpy lacks (bfloat16).
        return torch.from_numpy(numpy.frombuffer(self, dtype=numpy.uint8)).view(dtype)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<knod.SimBuffer {len(self)} bytes{state} fd={self._fd}>"


def _exported(buf: mmap.mmap) -> bool:
    """Whether anything holds an export of `buf`'s memory, by mmap's own count: resize()
    checks it before anything else and changes nothing when refused, and -1 is refused by the
    next check (ValueError) when no export lives."""
    try:
        mmap.mmap.resize(buf, -1)
    except BufferError:
        return True
    except ValueError:
        return False
    return True  # resized to -1: cannot happen; count it as held


def _mapping_address(buf: mmap.mmap) -> int:
    """Where `buf` is mapped in this process (a transient export of its buffer)."""
    import ctypes

    probe = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


def sim_region(address: int, nbytes: int) -> Optional[Tuple[SimBuffer, int]]:
    """The SimBuffer whose mapping holds [address, address + nbytes) (closed ones too: a view
    can outlive the close), and the offset of `address` in it; None when no SimBuffer does."""
    for buf in list(_live):
        if mmap.mmap.closed.__get__(buf):  # unmapped behind our back: its address is free
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
