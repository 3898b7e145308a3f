#!/usr/bin/python3
"""The article's example in Python, on knod-policy: register a buffer for a flow, then wait.

    handle = knod.register_buffer(buffer, nbytes, flows=...)   # request_binding + activate
    knod.wait_for_data(handle, timeout_ms=100)                   # RxBytes, or None

The buffer is a torch tensor, as in the article, allocated where the sim driver's NIC writes
(knod.sim_tensor: a sealed memfd standing in for VRAM; the article's one change); without torch,
or with --numpy, a numpy array over a knod.SimBuffer. On hardware it is a GPU tensor bound
through its dma-buf, knod.gpu.export_dmabuf(tensor). buffer.sum().item() shows what landed.

    receive.py --netdev knodsim0 --flow 'udp 10.99.0.0/24:* -> 10.99.0.2:5000' --packets 3

Exit status: 0 after receiving and releasing; 1 on failure (a denial names the deciding rule);
3 when the binding ended under it (revoked, expired, its NIC gone: the reason is printed).
"""
import argparse
import sys
import time

import numpy

import knod


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--netdev", default="knodsim0")
    p.add_argument("--gpu", default="sim0")
    p.add_argument("--bytes", type=int, default=4096, help="buffer size")
    p.add_argument("--flow", required=True, help="flow spec to receive")
    p.add_argument("--packets", type=int, default=1, help="stop after this many packets")
    p.add_argument("--timeout-ms", type=int, default=10000,
                   help="give up after this long without data")
    p.add_argument("--numpy", action="store_true", help="a numpy array, even where torch is")
    a = p.parse_args()

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and not a.numpy:
        buffer = knod.sim_tensor(a.bytes)  # the article: torch.empty(..., device="cuda")
        raw = buffer.numpy()  # the same memory, for printing the bytes
    else:
        buffer = raw = numpy.frombuffer(knod.SimBuffer(a.bytes), dtype=numpy.uint8)
    print(f"buffer: a {type(buffer).__module__.split('.')[0]} {tuple(buffer.shape)} "
          f"{buffer.dtype} in a knod sim buffer", flush=True)
    try:
        handle = knod.register_buffer(buffer, a.bytes, flows=a.flow, netdev=a.netdev, gpu=a.gpu)
    except knod.Error as e:
        print(f"refused: {e}", file=sys.stderr)
        if e.rule:
            print(f"deciding rule: {e.rule}", file=sys.stderr)
        return 1
    print(f"granted binding {handle.id} by rule '{handle.rule}'; key id {handle.key_id}",
          flush=True)
    print("activated with the key; waiting for data", flush=True)
    with handle:
        deadline = time.monotonic() + a.timeout_ms / 1000
        try:
            while time.monotonic() < deadline:
                rx = knod.wait_for_data(handle, timeout_ms=100)
                if rx is None:
                    continue
                deadline = time.monotonic() + a.timeout_ms / 1000
                if handle.counters().rx_packets >= a.packets:
                    break
            else:
                print(f"no more data within {a.timeout_ms} ms", flush=True)
        except knod.BindingEnded as e:
            print(f"binding {handle.id} ended: {e.reason}", flush=True)
            return 3
        # Bytes and packets from one reading: a wake-up's RxBytes can predate the packet count.
        c = handle.counters()
        data = bytes(raw[: min(c.rx_bytes, a.bytes)]).decode(errors="backslashreplace")
        print(f"buffer holds {c.rx_bytes} byte(s) from {c.rx_packets} packet(s): \"{data}\"",
              flush=True)
        print(f"buffer.sum().item() = {buffer.sum().item()}", flush=True)
    print(f"released {handle.id} ({handle.end_reason})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
