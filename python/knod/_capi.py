"""The C API of libknod-client.so.1 (knod/client.h), declared for ctypes.

Loaded on first use, not at import: KNOD_CLIENT_LIBRARY names the library file if set (tests
use the build tree's), otherwise the dynamic linker finds libknod-client.so.1 (the
libknod-client1 package). ctypes releases the GIL during each call.
"""
import ctypes
import os
import threading

_lib = None
_lock = threading.Lock()

c_char_pp = ctypes.POINTER(ctypes.c_char_p)
c_void_pp = ctypes.POINTER(ctypes.c_void_p)
u64p = ctypes.POINTER(ctypes.c_uint64)
u32p = ctypes.POINTER(ctypes.c_uint32)
intp = ctypes.POINTER(ctypes.c_int)
sizep = ctypes.POINTER(ctypes.c_size_t)


class DevmemFragment(ctypes.Structure):
    """struct knod_devmem_fragment."""
    _fields_ = [("offset", ctypes.c_uint64), ("size", ctypes.c_uint32),
                ("token", ctypes.c_uint32), ("dmabuf_id", ctypes.c_uint32)]


fragp = ctypes.POINTER(DevmemFragment)

# name: (restype, argtypes)
_PROTOTYPES = {
    "knod_version": (ctypes.c_char_p, []),
    "knod_errc_name": (ctypes.c_char_p, [ctypes.c_int]),
    "knod_error_code": (ctypes.c_int, [ctypes.c_void_p]),
    "knod_error_message": (ctypes.c_char_p, [ctypes.c_void_p]),
    "knod_error_dbus_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "knod_error_rule": (ctypes.c_char_p, [ctypes.c_void_p]),
    "knod_error_free": (None, [ctypes.c_void_p]),
    "knod_client_connect": (ctypes.c_int, [ctypes.c_char_p, c_void_pp, c_void_pp]),
    "knod_client_unref": (None, [ctypes.c_void_p]),
    "knod_request_binding": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
         ctypes.c_uint64, ctypes.c_uint64, c_char_pp, ctypes.c_size_t, c_void_pp, c_void_pp],
    ),
    "knod_binding_activate": (ctypes.c_int, [ctypes.c_void_p, c_void_pp]),
    "knod_binding_wait_for_data": (
        ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, u64p, c_void_pp]),
    "knod_binding_renew": (ctypes.c_int, [ctypes.c_void_p, u64p, c_void_pp]),
    "knod_binding_release": (ctypes.c_int, [ctypes.c_void_p, c_void_pp]),
    # Since job tags (#53); an older library lacks it (Binding.set_job says so).
    "knod_binding_set_job": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, c_void_pp]),
    "knod_binding_counters": (ctypes.c_int, [ctypes.c_void_p, u64p, u64p, u64p, c_void_pp]),
    # Since the dma-buf id (Binding.DmabufId); an older library lacks it (Binding.dmabuf_id
    # says so).
    "knod_binding_dmabuf_id": (ctypes.c_int, [ctypes.c_void_p, u32p, c_void_pp]),
    "knod_binding_end": (
        ctypes.c_int, [ctypes.c_void_p, intp, c_char_pp, intp, c_void_pp]),
    "knod_binding_id": (ctypes.c_char_p, [ctypes.c_void_p]),
    "knod_binding_key_id": (ctypes.c_char_p, [ctypes.c_void_p]),
    "knod_binding_rule": (ctypes.c_char_p, [ctypes.c_void_p]),
    "knod_binding_length": (ctypes.c_uint64, [ctypes.c_void_p]),
    "knod_binding_free": (None, [ctypes.c_void_p]),
    # Since the devmem receive loop (#36); an older library lacks them (knod.DevmemReceiver
    # says so).
    "knod_devmem_rx_new": (ctypes.c_int, [ctypes.c_int, c_void_pp, c_void_pp]),
    "knod_devmem_rx_free": (None, [ctypes.c_void_p]),
    "knod_devmem_rx_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, c_void_pp]),
    "knod_devmem_rx_receive": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, sizep, fragp, ctypes.c_size_t, sizep,
         c_void_pp]),
    "knod_devmem_rx_release": (ctypes.c_int, [ctypes.c_void_p, fragp, ctypes.c_size_t, c_void_pp]),
    # Since knod.distributed's chunks (#53); without them it builds chunks in Python.
    "knod_chunks_send": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint16, ctypes.c_void_p, ctypes.c_uint64,
         ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, c_void_pp]),
    "knod_chunks_receive": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
         ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int,
         ctypes.c_int, c_void_pp]),
    # Since knod.distributed's devmem path (#53); without them KNOD_DIST_TRANSPORT=devmem says so.
    "knod_stream_send": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
         ctypes.c_int, ctypes.c_int, c_void_pp]),
    "knod_devmem_stream_receive": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p,
         ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int, ctypes.c_int,
         ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), c_void_pp]),
}
OPTIONAL = {name for name in _PROTOTYPES
            if name.startswith(("knod_devmem_rx_", "knod_chunks_", "knod_stream_",
                                "knod_devmem_stream_"))} | {"knod_binding_set_job",
                                                             "knod_binding_dmabuf_id"}


def lib():
    """The loaded library, its functions declared; OSError naming the file if it cannot load."""
    global _lib
    with _lock:
        if _lib is None:
            path = os.environ.get("KNOD_CLIENT_LIBRARY") or "libknod-client.so.1"
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise OSError(
                    f"cannot load {path} ({e}); install the libknod-client1 package "
                    "or set KNOD_CLIENT_LIBRARY to the library's path") from None
            for name, (restype, argtypes) in _PROTOTYPES.items():
                if name in OPTIONAL and not hasattr(handle, name):
                    continue
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = handle
        return _lib


def text(value):
    """A C string from the library as str (None stays None); undecodable bytes escaped."""
    return None if value is None else value.decode("utf-8", "backslashreplace")
