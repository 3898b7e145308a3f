"""#52 item 6: no view outlives a SimBuffer's memory. Every buffer export (a memoryview, a numpy
array, buf.tensor(), a binding) makes close() refuse, naming what holds it; torch.frombuffer(buf)
holds the buffer object and no export, so the mapping stays until that object goes; leaving a
`with` block never unmaps under a view. The crash cases run in a child process: before the fix
the child died of SIGSEGV."""
import signal
import textwrap

import numpy
import pytest

import knod
from conftest import NETDEV, flow, run_python

# In the child: the memfd's mappings in this process ("knod-sim-buffer" in /proc/self/maps).
MAPPED = """
def mapped():
    with open("/proc/self/maps") as f:
        return sum("knod-sim-buffer" in line for line in f)
"""


def run_child(code):
    rc, out, err = run_python(MAPPED + textwrap.dedent(code))
    assert rc != -signal.SIGSEGV, f"the child died of SIGSEGV:\n{err}"
    assert rc == 0, (rc, out, err)
    return out


def test_torch_frombuffer_then_close_never_unmaps_under_the_tensor():
    pytest.importorskip("torch")
    out = run_child("""
        import gc, torch, knod
        buf = knod.SimBuffer(1 << 20)
        t = torch.frombuffer(buf, dtype=torch.uint8)
        buf[:4] = b"abcd"
        buf.close()          # torch holds the object, not an export: the mapping stays
        assert buf.closed and buf.fileno() == -1
        t[4] = 101           # written and read after close(): still mapped
        assert bytes(t[:5].numpy()) == b"abcde" and t.sum().item() == sum(b"abcde")
        try:
            buf.tensor()
        except ValueError as e:
            assert "closed" in str(e), e
        else:
            raise AssertionError("a closed SimBuffer made a tensor")
        del buf
        gc.collect()
        assert mapped() == 1, "unmapped while a tensor from torch.frombuffer lives"
        assert t[4].item() == 101
        del t
        gc.collect()
        assert mapped() == 0, "the mapping outlived its last user"
        print("ok")
    """)
    assert out.strip() == "ok"


def test_leaving_a_with_block_under_live_views_does_not_unmap():
    torch = pytest.importorskip("torch")
    out = run_child("""
        import gc, numpy, torch, knod
        with knod.SimBuffer(4096) as buf:
            alone = torch.frombuffer(buf, dtype=torch.uint8)
            buf[:2] = b"ok"
        assert bytes(alone[:2].numpy()) == b"ok"     # the crash before #52: unmapped
        del alone
        with knod.SimBuffer(4096) as buf:
            t = torch.frombuffer(buf, dtype=torch.uint8)   # a reference, no export
            a = numpy.frombuffer(buf, dtype=numpy.uint8)   # an export
            u = buf.tensor()                               # an export, through numpy
            buf[:3] = b"xyz"
        # No BufferError from the block's end (it would replace the block's own exception),
        # no unmapping under the views: the buffer is closed, its mapping waits for them.
        assert buf.closed
        assert bytes(t[:3].numpy()) == bytes(a[:3]) == bytes(u[:3].numpy()) == b"xyz"
        del buf, a, u
        gc.collect()
        assert mapped() == 1 and bytes(t[:3].numpy()) == b"xyz"
        del t
        gc.collect()
        assert mapped() == 0
        # Inside a block that raised, the block's own exception is what propagates.
        try:
            with knod.SimBuffer(4096) as buf:
                keep = numpy.frombuffer(buf, dtype=numpy.uint8)
                raise KeyError("the block's own")
        except KeyError:
            pass
        assert keep[0] == 0
        print("ok")
    """)
    assert out.strip() == "ok"
    del torch


@pytest.mark.parametrize("view", ["numpy", "memoryview", "tensor", "slice"])
def test_close_is_refused_while_an_export_lives_and_works_after(view):
    buf = knod.SimBuffer(4096)
    if view == "numpy":
        v = numpy.frombuffer(buf, dtype=numpy.uint8)
    elif view == "memoryview":
        v = memoryview(buf)
    else:
        pytest.importorskip("torch")
        v = buf.tensor() if view == "tensor" else buf.tensor()[100:200]
    buf[100:102] = b"\x05\x06"
    with pytest.raises(BufferError, match="still in use.*views of its memory"):
        buf.close()
    assert not buf.closed and buf.fileno() >= 0
    assert bytes(v[:2] if view == "slice" else v[100:102]) == b"\x05\x06"  # still mapped
    del v
    buf.close()
    assert buf.closed and buf.fileno() == -1
    buf.close()  # again: nothing


def test_close_is_refused_while_bound_naming_the_binding(client):
    buf = knod.SimBuffer(4096)
    b = client.register_buffer(buf, flow(5160), netdev=NETDEV)
    with pytest.raises(BufferError, match=f"bound by binding {b.id}"):
        buf.close()
    assert not buf.closed
    b.release()  # no longer bound: its memory may go
    buf.close()
    assert buf.closed
    b.close()
    with pytest.raises(ValueError, match="closed"):
        client.request_binding(buf, flow(5160), netdev=NETDEV)


def test_a_binding_of_a_tensor_or_array_holds_its_sim_buffer(client):
    torch = pytest.importorskip("torch")
    buf = knod.SimBuffer(4096)
    for view in (torch.frombuffer(buf, dtype=torch.uint8)[:1024],
                 numpy.frombuffer(buf, dtype=numpy.uint8)[1024:2048]):
        with client.register_buffer(view, flow(5161), netdev=NETDEV) as b:
            del view  # the binding alone holds the memory now
            with pytest.raises(BufferError, match=f"bound by binding {b.id}"):
                buf.close()
    buf.close()
    assert buf.closed
    # A binding over a closed buffer's view is refused, naming why.
    with knod.SimBuffer(4096) as other:
        arr = numpy.frombuffer(other, dtype=numpy.uint8)
    with pytest.raises(ValueError, match="closed"):
        client.request_binding(arr, flow(5161), netdev=NETDEV)


def test_a_forked_child_is_told_to_make_its_own_client():
    """#52 minor: a child using the client its parent made was told "No child processes"
    (sd-bus's fork check, ECHILD); it is told what happened. The parent's client still works."""
    rc, out, err = run_python(f"""
        import os, knod, numpy
        client = knod.Client()
        assert knod.default_client() is knod.default_client()
        parent = os.getpid()
        buf = knod.SimBuffer(4096)
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                client.request_binding(buf, {flow(5162)!r}, netdev={NETDEV!r})
                msg = "granted"
            except knod.Error as e:
                msg = type(e).__name__ + ": " + str(e)
            # The module's own client is per process: the child's first use makes its own.
            try:
                with knod.register_buffer(knod.SimBuffer(64), flows={flow(5163)!r},
                                          netdev={NETDEV!r}) as b:
                    msg += "\\nchild bound " + str(b.length)
            except knod.Error as e:
                msg += "\\nchild's default client: " + str(e)
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        told = os.read(r, 4096).decode()
        assert os.waitpid(child, 0)[1] == 0
        print(told)
        print(f"parent={{parent}} child={{child}}")
        with client.register_buffer(buf, {flow(5162)!r}, netdev={NETDEV!r}) as b:
            print("parent still bound", b.length)
    """)
    assert rc == 0, (rc, out, err)
    told, child_bound, pids, bound = out.strip().splitlines()
    assert child_bound == "child bound 64", child_bound
    parent, child = (p.split("=")[1] for p in pids.split())
    assert "No child processes" not in told, told
    assert (f"created in process {parent}" in told and f"process {child}" in told
            and "forked child must create its own knod client" in told), told
    assert bound == "parent still bound 4096"
