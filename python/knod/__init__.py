"""knod: register GPU buffers with knod-policyd and wait for the NIC's data to land in them.

The article's example, on this package::

    import knod
    buffer = knod.sim_tensor(4096)   # a torch tensor the sim's NIC writes (on a GPU:
                                     # knod.gpu.export_dmabuf(tensor))
    with knod.register_buffer(buffer, flows="udp 10.99.0.0/24:* -> 10.99.0.2:5000") as handle:
        rx = knod.wait_for_data(handle, timeout_ms=100)   # RxBytes, or None after 100 ms
        print(buffer.sum().item())
    # leaving the block releases the binding

numpy works the same way (numpy.frombuffer(knod.SimBuffer(4096), dtype=numpy.uint8)). No view
outlives a SimBuffer's memory: see knod.SimBuffer for what close() refuses and what waits.

Everything goes through libknod-client.so.1 (the C API, loaded with ctypes); nothing of the
D-Bus protocol is in Python. A Client and its Bindings are for one thread at a time (a lock
enforces it). Byte counts are bytes, times microseconds since the Unix epoch, timeouts ms.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, List, NamedTuple, Optional, Sequence, Union

from . import _capi
from ._errors import (BindingEnded, BusError, Denied, DriverFailure, Error, ExportUnavailable,
                      Failed, FlowConflict, InvalidArgument, InvalidPolicy, IsolationViolation,
                      JournalUnavailable, LimitsExceeded, NoSuchBinding, OutOfResources,
                      QuotaExceeded, Unavailable)
from ._errors import BY_CODE as _BY_CODE
from ._errors import KNOD_ERR_ENDED as _ENDED
from ._errors import KNOD_ERR_TIMEOUT as _TIMEOUT
from .buffers import DmaBuf, SimBuffer, sim_region

__all__ = [
    "Client", "Binding", "Counters", "Buffer", "Flows", "sim_tensor", "DevmemReceiver",
    "Fragment", "Received", "SimBuffer", "DmaBuf", "register_buffer", "wait_for_data",
    "default_client", "library_version", "Error", "Denied", "InvalidArgument", "NoSuchBinding",
    "QuotaExceeded", "LimitsExceeded", "OutOfResources", "IsolationViolation", "DriverFailure",
    "JournalUnavailable", "InvalidPolicy", "FlowConflict", "Failed", "Unavailable", "BindingEnded",
    "BusError", "ExportUnavailable",
]

class Counters(NamedTuple):
    """A binding's counters, from the daemon: bytes and packets that landed, packets dropped."""
    rx_bytes: int
    rx_packets: int
    dropped_packets: int


# What a binding can cover: a SimBuffer (the sim), a DmaBuf (a GPU's dma-buf export), a
# dma-buf fd (an int, with a length), or a torch tensor or numpy array whose memory lies in a
# SimBuffer (knod.sim_tensor, SimBuffer.tensor(), numpy.frombuffer(sim_buffer)).
Buffer = Union[SimBuffer, DmaBuf, int, Any]
Flows = Union[str, Sequence[str]]


def library_version() -> str:
    """The loaded libknod-client's version string."""
    return _capi.text(_capi.lib().knod_version())


def _raise(code, err):
    """Turns a knod_errc and its knod_error into the exception named after it (frees err)."""
    lib = _capi.lib()
    try:
        message = _capi.text(lib.knod_error_message(err)) if err else "out of memory"
        dbus_name = _capi.text(lib.knod_error_dbus_name(err)) if err else None
        rule = _capi.text(lib.knod_error_rule(err)) if err else None
    finally:
        if err:
            lib.knod_error_free(err)
    cls = _BY_CODE.get(code, Error)
    raise cls(message, code=code, dbus_name=dbus_name, rule=rule)


def _call(fn, *args):
    err = ctypes.c_void_p()
    code = fn(*args, ctypes.byref(err))
    if code != 0:
        _raise(code, err.value)


def _text(what, value):
    """`value` as the C API's NUL-terminated UTF-8: a str without NUL (ctypes would cut the
    string at a NUL and send a different name)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} contains a NUL character: {value!r}")
    return value.encode()


def _integer(what, value, lo, hi):
    """`value` checked to lie in [lo, hi]: ctypes would wrap it silently (2**32 + 5 as a C int
    is 5: another fd)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} is out of range [{lo}, {hi}]")
    return value


_U64 = 2**64 - 1
_U32 = 2**32 - 1
_INT = 2**31 - 1


def _region(buffer, offset, length):
    """(fd, offset, length) of what a binding should cover, each checked to fit its C type."""
    fd, off, n = _region_unchecked(buffer, offset, length)
    _integer("the region fd", fd, 0, _INT)
    _integer("offset", off, 0, _U64)
    if isinstance(buffer, SimBuffer) and off >= len(buffer):
        raise ValueError(f"offset {off} is past the end of the {len(buffer)}-byte SimBuffer")
    _integer("length", n, 1, _U64)
    if isinstance(buffer, SimBuffer) and off + n > len(buffer):
        raise ValueError(f"offset {off} + length {n} is past the end of the {len(buffer)}-byte "
                         "SimBuffer")
    return fd, off, n


def _array_memory(obj):
    """(address, bytes, contiguous, device) of a torch tensor or numpy array; None for anything
    else. Neither package is imported here: an object of one was made by it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return (obj.data_ptr(), obj.numel() * obj.element_size(), obj.is_contiguous(),
                obj.device.type)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return obj.ctypes.data, obj.nbytes, bool(obj.flags["C_CONTIGUOUS"]), "cpu"
    return None


def _gpu_tensor(obj):
    """Whether `obj` is a GPU tensor (torch's CUDA or ROCm device type: "cuda")."""
    device = getattr(getattr(obj, "device", None), "type", None)
    return device == "cuda" and callable(getattr(obj, "data_ptr", None))


def _export_tensor(tensor, offset, length):
    """The dma-buf of a GPU tensor's pages (knod.gpu.export_dmabuf), and the DmaBuf of the
    tensor's own bytes in it to bind: never the neighbours' bytes on its pages (a caching
    allocator puts other tensors there). devmem binds only whole dma-bufs, so there a tensor must
    start on a page and fill whole pages (the daemon refuses anything else, saying so)."""
    if offset is not None or length is not None:
        raise ValueError("offset= and length= are for a SimBuffer or a DmaBuf; a GPU tensor is "
                         "bound where it lies (slice it instead)")
    if callable(getattr(tensor, "is_contiguous", None)) and not tensor.is_contiguous():
        raise ValueError("this GPU tensor is not contiguous: the NIC writes one byte range")
    from . import gpu

    exported = gpu.export_dmabuf(tensor)
    return exported, DmaBuf(exported.fd, exported.offset, exported.length, owned=False)


def _array_region(array, offset, length):
    """(fd, offset, length) of the SimBuffer bytes a CPU tensor or array views."""
    address, nbytes, contiguous, device = _array_memory(array)
    kind = type(array).__module__.split(".")[0] + "." + type(array).__name__
    if device != "cpu":
        raise TypeError(f"a {device} tensor is bound through its dma-buf: pass "
                        "knod.gpu.export_dmabuf(tensor) (and keep it open while bound)")
    if offset is not None:
        raise ValueError(f"offset= is for a SimBuffer or a DmaBuf; a {kind} is bound where it "
                         "lies (slice it instead)")
    if not contiguous:
        raise ValueError(f"this {kind} is not contiguous: the NIC writes one byte range; bind a "
                         "contiguous one (the whole sim tensor, or a slice along its first "
                         "dimension)")
    if nbytes == 0:
        raise ValueError(f"this {kind} has no bytes to bind")
    found = sim_region(address, nbytes)
    if found is None:
        raise TypeError(f"this {kind}'s memory is not in a knod sim buffer: allocate it with "
                        "knod.sim_tensor(n) or knod.SimBuffer(n).tensor() (numpy: "
                        "numpy.frombuffer(knod.SimBuffer(n))); a GPU tensor is bound through "
                        "knod.gpu.export_dmabuf(tensor)")
    sim, start = found
    if sim.closed:
        raise ValueError(f"the {len(sim)}-byte SimBuffer this {kind} views is closed: bind a "
                         "view of an open one")
    if length is not None:
        _integer("length", length, 1, nbytes)
    return sim.fileno(), start, nbytes if length is None else length


def _sim_buffer_of(buffer):
    """The SimBuffer whose memory a binding of `buffer` covers (itself, or the one a CPU tensor
    or array lies in); None for a dma-buf."""
    if isinstance(buffer, SimBuffer):
        return buffer
    memory = _array_memory(buffer)
    if memory is None or memory[3] != "cpu":
        return None
    found = sim_region(memory[0], max(memory[1], 1))
    return found[0] if found else None


def _region_unchecked(buffer, offset, length):
    if isinstance(buffer, DmaBuf):
        off = buffer.offset if offset is None else offset
        return buffer.fd, off, buffer.length if length is None else length
    if isinstance(buffer, SimBuffer):
        buffer._require_open()
        off = 0 if offset is None else _integer("offset", offset, 0, _U64)
        return buffer.fileno(), off, (len(buffer) - off) if length is None else length
    if _array_memory(buffer) is not None:
        return _array_region(buffer, offset, length)
    if isinstance(buffer, int) and not isinstance(buffer, bool):
        if length is None:
            raise ValueError("a bare fd needs length=")
        return buffer, 0 if offset is None else offset, length
    if hasattr(buffer, "data_ptr"):
        raise TypeError("a GPU tensor is bound through a dma-buf: pass "
                        "knod.gpu.export_dmabuf(tensor) (and keep it open while bound)")
    raise TypeError(f"cannot bind a {type(buffer).__name__}: pass a knod.SimBuffer, a tensor "
                    "or array in one (knod.sim_tensor), a knod.DmaBuf or a dma-buf fd with "
                    "length=")


class Client:
    """A connection to knod-policyd. `address`: a D-Bus address; None means the system bus
    (DBUS_SYSTEM_BUS_ADDRESS is honoured). Raises knod.Unavailable when there is no bus."""

    def __init__(self, address: Optional[str] = None) -> None:
        self._lib = _capi.lib()
        self._lock = threading.RLock()
        handle = ctypes.c_void_p()
        _call(self._lib.knod_client_connect, _text("address", address) if address else None,
              ctypes.byref(handle))
        self._handle = handle.value

    def request_binding(self, buffer: Buffer, flows: Flows, *, netdev: str = "knodsim0",
                        gpu: str = "sim0", mode: str = "rx-only", offset: Optional[int] = None,
                        length: Optional[int] = None) -> Binding:
        """Asks for a binding of `netdev` to `buffer` for `flows` (a flow spec or a list); the
        Binding is granted but inactive until activate(). Raises knod.Denied (.rule: the
        deciding rule, None for a default deny), knod.QuotaExceeded, knod.FlowConflict, ..."""
        exported = None
        region = buffer
        if _gpu_tensor(buffer):  # exported for the caller; the Binding closes it
            exported, region = _export_tensor(buffer, offset, length)
            offset = length = None
        pin = None
        try:
            fd, off, n = _region(region, offset, length)
            sim = _sim_buffer_of(region)
            # The binding holds the buffer's export until it is released or closed: mmap then
            # refuses to unmap it (a tensor from torch.frombuffer holds none of its own).
            pin = memoryview(sim) if sim is not None else None
            if isinstance(flows, str):
                flows = [flows]
            specs = (ctypes.c_char_p * max(1, len(flows)))(*[_text("a flow", f) for f in flows])
            out = ctypes.c_void_p()
            with self._lock:
                _call(self._lib.knod_request_binding, self._handle, _text("netdev", netdev),
                      _text("gpu", gpu), _text("mode", mode), fd, off, n, specs, len(flows),
                      ctypes.byref(out))
        except BaseException:
            if pin is not None:
                pin.release()
            if exported is not None:
                exported.close()
            raise
        binding = Binding(self, out.value, buffer, exported)
        if pin is not None:
            binding._pin = pin
            sim._bindings.add(binding)
        return binding

    def register_buffer(self, buffer: Buffer, flows: Flows, **kw: Any) -> Binding:
        """The article's register_buffer: request_binding(), then activate() (a grant whose
        activation fails is released). The returned Binding releases on `with` exit."""
        b = self.request_binding(buffer, flows, **kw)
        try:
            b.activate()
        except BaseException:
            b.close()
            raise
        return b

    def close(self) -> None:
        """Drops this handle; the connection closes once its bindings are freed too."""
        with self._lock:
            if self._handle:
                self._lib.knod_client_unref(self._handle)
                self._handle = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


class Binding:
    """A granted binding; as a context manager it releases on exit. Attributes: id, key_id,
    rule (the granting rule), length (region bytes), dmabuf (for a GPU tensor: the DmaBuf
    exported for it, closed with the binding; else None)."""

    def __init__(self, client: Client, handle: int, buffer: Buffer,
                 dmabuf: Optional[DmaBuf] = None) -> None:
        self._client, self._handle, self._lib = client, handle, client._lib
        self._buffer = buffer  # kept alive while bound
        self._pin: Optional[memoryview] = None  # a SimBuffer's export, held while bound
        self.dmabuf = dmabuf
        self._seen = 0
        self._final_end = (None, False)
        self.id = _capi.text(self._lib.knod_binding_id(handle))
        self.key_id = _capi.text(self._lib.knod_binding_key_id(handle))
        self.rule = _capi.text(self._lib.knod_binding_rule(handle))
        self.length = self._lib.knod_binding_length(handle)

    def _live(self):
        if not self._handle:
            raise ValueError(f"binding {self.id} is closed")
        return self._handle

    def activate(self) -> None:
        """Presents the key: data starts to land in the buffer."""
        with self._client._lock:
            _call(self._lib.knod_binding_activate, self._live())

    def wait_for_data(self, timeout_ms: int = 100, seen: Optional[int] = None) -> Optional[int]:
        """Waits until RxBytes passes `seen` (default: what the last call returned) for at most
        `timeout_ms`; returns the new RxBytes, or None if nothing came. Raises
        knod.BindingEnded (.reason) if the binding ended."""
        since = _integer("seen", self._seen if seen is None else seen, 0, _U64)
        timeout_ms = _integer("timeout_ms", timeout_ms, 0, _INT)
        rx = ctypes.c_uint64()
        err = ctypes.c_void_p()
        with self._client._lock:
            code = self._lib.knod_binding_wait_for_data(self._live(), since, timeout_ms,
                                                        ctypes.byref(rx), ctypes.byref(err))
        if code == _TIMEOUT:
            self._lib.knod_error_free(err.value)
            return None
        if code == _ENDED:
            self._lib.knod_error_free(err.value)
            reason, revoked = self.end_reason, self.revoked
            raise BindingEnded(f"binding {self.id} ended: {reason}", reason=reason,
                               revoked=revoked, code=code)
        if code != 0:
            _raise(code, err.value)
        self._seen = rx.value
        return rx.value

    def counters(self) -> Counters:
        """Counters(rx_bytes, rx_packets, dropped_packets), from the daemon."""
        v = [ctypes.c_uint64() for _ in range(3)]
        with self._client._lock:
            _call(self._lib.knod_binding_counters, self._live(), *map(ctypes.byref, v))
        return Counters(*(x.value for x in v))

    def renew(self) -> int:
        """Extends the key by the policy's key lifetime from now; returns the new expiry
        (microseconds since the epoch)."""
        until = ctypes.c_uint64()
        with self._client._lock:
            _call(self._lib.knod_binding_renew, self._live(), ctypes.byref(until))
        return until.value

    def set_job(self, job: str, group: str = "", rank: int = 0) -> None:
        """Tags the binding with the job it serves (Binding.SetJob): `job` a torch.distributed
        job's store address or name (1 to 64 bytes), `group` its process group (0 to 64 bytes),
        both only of letters, digits and . _ : @ / -, and this process's `rank` (at most 65535).
        The journal (event job-tagged), `knod-policy bindings` and the metrics then show a job's
        ranks together. Once per binding. Raises knod.InvalidArgument (nothing changed) for a
        bad string or a second call. A label for people: the daemon never decides on it."""
        job_b, group_b = _text("job", job), _text("group", group)
        rank = _integer("rank", rank, 0, _U32)
        if not hasattr(self._lib, "knod_binding_set_job"):
            raise Error("this libknod-client has no knod_binding_set_job (older than job tags)")
        with self._client._lock:
            _call(self._lib.knod_binding_set_job, self._live(), job_b, group_b, rank)

    @property
    def dmabuf_id(self) -> int:
        """The kernel's id of the binding's dma-buf (Binding.DmabufId): what netdev bind-rx
        returned at activation, and what the kernel puts in every devmem fragment of it
        (knod.Fragment.dmabuf_id). A devmem receiver refuses fragments with another id: they
        are another binding's dma-buf, and reading them off this binding's mapping would read
        the wrong bytes. 0 when there is none: not a devmem binding (sim, knod), not active
        yet, or a daemon older than the property. Asked of the daemon at each read. Raises
        knod.Error when the loaded libknod-client is older than knod_binding_dmabuf_id (never
        0 then: 0 would read as "none" and a receiver would check nothing)."""
        if not hasattr(self._lib, "knod_binding_dmabuf_id"):
            raise Error("this libknod-client has no knod_binding_dmabuf_id (older than "
                        "Binding.DmabufId): upgrade libknod-client1 to learn the dma-buf id")
        out = ctypes.c_uint32()
        with self._client._lock:
            _call(self._lib.knod_binding_dmabuf_id, self._live(), ctypes.byref(out))
        return out.value

    def release(self) -> None:
        """Ends the binding (end reason "release"); again, or after it ended, does nothing.
        A SimBuffer it covered may close from then on."""
        with self._client._lock:
            _call(self._lib.knod_binding_release, self._live())
            self._unpin()

    def _unpin(self) -> None:
        if self._pin is not None:
            self._pin.release()
            self._pin = None

    def _holds(self, sim: SimBuffer) -> bool:
        """Whether this binding holds `sim`'s export (for SimBuffer.close()'s refusal)."""
        return self._pin is not None and self._pin.obj is sim

    def _end(self):
        if not self._handle:
            return self._final_end
        ended, revoked = ctypes.c_int(), ctypes.c_int()
        reason = ctypes.c_char_p()
        with self._client._lock:
            _call(self._lib.knod_binding_end, self._live(), ctypes.byref(ended),
                  ctypes.byref(reason), ctypes.byref(revoked))
        return (_capi.text(reason.value) if ended.value else None), bool(revoked.value)

    @property
    def end_reason(self) -> Optional[str]:
        """Why the binding ended ("release", "expire", "revoke: <why>", "process-exit", ...),
        as the daemon told this connection (or "release" after this handle released it);
        None while it lives. Still answers after close()."""
        return self._end()[0]

    @property
    def revoked(self) -> bool:
        """Whether it ended by someone or something other than its holder."""
        return self._end()[1]

    def close(self) -> None:
        """Releases the binding if still held and frees the handle."""
        with self._client._lock:
            if self._handle:
                try:
                    self.release()  # so the end reason is known after close()
                except Error:
                    pass
                try:
                    self._final_end = self._end()
                except Error:
                    pass
                self._lib.knod_binding_free(self._handle)
                self._handle = None
                self._buffer = None  # no longer bound: its memory may go
                self._unpin()
                if self.dmabuf is not None:
                    self.dmabuf.close()

    def __enter__(self) -> Binding:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._handle:
            return
        try:
            if exc[0] is None:
                self.release()  # a failed release is reported when nothing else is
        finally:
            self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()

    def __repr__(self) -> str:
        return f"<knod.Binding {self.id} rule={self.rule!r}>"


def sim_tensor(n: int, dtype: Any = None) -> Any:
    """A torch tensor of `n` elements (torch.uint8 unless `dtype`) in a new knod.SimBuffer: what
    the sim driver's NIC writes into, standing in for a GPU tensor. Its memory stays mapped for
    as long as the tensor (or any view of it) lives; register_buffer(tensor) binds it, and a
    slice along its first dimension binds that slice."""
    import torch

    dtype = torch.uint8 if dtype is None else dtype
    _integer("n", n, 1, _U64)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return SimBuffer(n * itemsize).tensor(dtype)


class Fragment(NamedTuple):
    """Payload the NIC placed in the dma-buf: `size` bytes at byte `offset` of it. `token` is
    what release() gives back to the NIC."""
    offset: int
    size: int
    token: int
    dmabuf_id: int


class Received(NamedTuple):
    """One receive on a devmem socket: fragments in the dma-buf, in stream order, and the bytes
    the NIC could not place there (copied as by recv). Both empty: the peer closed."""
    fragments: List[Fragment]
    linear: bytes


class DevmemReceiver:
    """Receives on a devmem binding (Linux device-memory TCP): the NIC writes the payload of the
    binding's TCP flows into the dma-buf, and the holder's own TCP socket `sock` (a socket or
    its fd; it stays the caller's) says where; any other socket raises InvalidArgument (a
    ValueError: devmem receive is TCP only). Fragments stay the holder's until release():
    the NIC cannot reuse their memory, so a holder that never releases stops its own flow.
    Kernel interface: Documentation/networking/devmem.rst (Linux 6.12)."""

    def __init__(self, sock: Any) -> None:
        if isinstance(sock, int) and not isinstance(sock, bool):
            fd = sock
        elif callable(getattr(sock, "fileno", None)):
            fd = sock.fileno()
            if fd == -1:
                raise InvalidArgument("the socket is closed (devmem receive needs the holder's "
                                      "open TCP socket)", code=2)
        else:
            raise TypeError("sock must be a socket or its fd (an int), not "
                            f"{type(sock).__name__}")
        fd = _integer("the socket fd", fd, 0, _INT)
        self._lib = _capi.lib()
        if not hasattr(self._lib, "knod_devmem_rx_new"):
            raise Unavailable("the loaded libknod-client has no devmem receive (it is older "
                              "than knod.DevmemReceiver): upgrade libknod-client1",
                              code=11)
        # One call at a time: close() during a blocked receive() in another thread would free
        # the C handle under it.
        self._lock = threading.Lock()
        self._handle = None
        # The library keeps a dup of its own: the caller may close its socket (and the number
        # be reused) while this receiver lives.
        handle = ctypes.c_void_p()
        _call(self._lib.knod_devmem_rx_new, fd, ctypes.byref(handle))
        self._handle = handle.value

    def _live(self) -> int:
        if not self._handle:
            raise ValueError("this DevmemReceiver is closed")
        return self._handle

    def wait(self, timeout_ms: int = 100) -> bool:
        """Whether receive() will not block (fragments, bytes, or the peer's close) within
        `timeout_ms` (< 0: wait for ever); on the socket alone, with no daemon round trip."""
        timeout_ms = max(-1, _integer("timeout_ms", timeout_ms, -(2**31), _INT))
        err = ctypes.c_void_p()
        with self._lock:
            code = self._lib.knod_devmem_rx_wait(self._live(), timeout_ms, ctypes.byref(err))
        if code == _TIMEOUT:
            self._lib.knod_error_free(err.value)
            return False
        if code != 0:
            _raise(code, err.value)
        return True

    def receive(self, linear_size: int = 65536, max_fragments: int = 256) -> Received:
        """One recvmsg(MSG_SOCK_DEVMEM) (blocks on a blocking socket). Fragments beyond
        `max_fragments` come with the next call, first."""
        # At least one of each: with no room, "nothing" would read as the peer's close.
        linear_size = _integer("linear_size", linear_size, 1, _INT)
        max_fragments = _integer("max_fragments", max_fragments, 1, 1 << 20)
        linear = ctypes.create_string_buffer(linear_size)
        frags = (_capi.DevmemFragment * max_fragments)()
        nbytes, nfrags = ctypes.c_size_t(), ctypes.c_size_t()
        with self._lock:
            _call(self._lib.knod_devmem_rx_receive, self._live(), linear, linear_size,
                  ctypes.byref(nbytes), frags, max_fragments, ctypes.byref(nfrags))
        return Received([Fragment(f.offset, f.size, f.token, f.dmabuf_id)
                         for f in frags[: nfrags.value]], ctypes.string_at(linear, nbytes.value))

    def release(self, fragments: Sequence[Fragment]) -> None:
        """Gives the fragments' buffers back to the NIC (SO_DEVMEM_DONTNEED)."""
        u32 = 2**32 - 1
        arr = (_capi.DevmemFragment * max(1, len(fragments)))(
            *[_capi.DevmemFragment(_integer("a fragment's offset", f.offset, 0, _U64),
                                   _integer("a fragment's size", f.size, 0, u32),
                                   _integer("a fragment's token", f.token, 0, u32),
                                   _integer("a fragment's dmabuf_id", f.dmabuf_id, 0, u32))
              for f in fragments])
        with self._lock:
            _call(self._lib.knod_devmem_rx_release, self._live(), arr, len(fragments))

    def close(self) -> None:
        """Frees the receiver and its dup of the socket (after any call in flight)."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._handle:
                self._lib.knod_devmem_rx_free(self._handle)
                self._handle = None

    def __enter__(self) -> DevmemReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


_default = None
_default_pid = 0
_inherited: List[Client] = []  # a parent's default clients, kept unused in a forked child
_default_lock = threading.Lock()


def default_client() -> Client:
    """The module's own Client on the system bus, made on first use in each process: a forked
    child's first use makes its own (a connection belongs to the process that opened it)."""
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default_pid != os.getpid():
            if _default is not None:
                # Never freed here: the parent's connection and bindings are the parent's.
                _inherited.append(_default)
            _default = Client()
            _default_pid = os.getpid()
        return _default


def register_buffer(buffer: Buffer, nbytes: Optional[int] = None, *, flows: Flows,
                    netdev: str = "knodsim0", gpu: str = "sim0", offset: Optional[int] = None,
                    client: Optional[Client] = None) -> Binding:
    """The article's knod.register_buffer(buffer, nbytes): binds `buffer` (a SimBuffer, a torch
    tensor or numpy array in one, a DmaBuf, or a dma-buf fd with nbytes) for `flows` and
    activates it; returns the Binding handle (a context manager that releases). `nbytes`:
    the first that many bytes (default: all of the buffer)."""
    return (client or default_client()).register_buffer(
        buffer, flows, netdev=netdev, gpu=gpu, offset=offset, length=nbytes)


def wait_for_data(handle: Union[Binding, DevmemReceiver],
                  timeout_ms: int = 100) -> Union[int, Received, None]:
    """The article's knod.wait_for_data(handle, timeout_ms), on each backend: for a Binding
    (every driver: the daemon's counters), the new RxBytes once more data has landed; for a
    DevmemReceiver (devmem: the holder's socket), what one receive got. None after
    timeout_ms."""
    if isinstance(handle, DevmemReceiver):
        return handle.receive() if handle.wait(timeout_ms) else None
    return handle.wait_for_data(timeout_ms)
