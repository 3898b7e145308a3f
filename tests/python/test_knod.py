"""The knod package against a real knod-policyd (sim driver, private bus): tests/python/run.sh."""
import fcntl
import json
import os
import secrets
import subprocess
import sys
import textwrap

import numpy
import pytest

import knod
import knod.gpu
from conftest import (NETDEV, binding_ids, cli, eventually, flow, journal, run_python,
                      sim_send)


def test_grant_activate_and_the_bytes_land_in_the_sim_buffer(client):
    buf = knod.SimBuffer(4096)
    view = numpy.frombuffer(buf, dtype=numpy.uint8)
    payload = secrets.token_hex(24)  # 48 bytes, different every run
    with client.register_buffer(buf, flow(5100), netdev=NETDEV) as b:
        assert b.rule == "sim-py"
        assert b.id in binding_ids()
        assert b.length == 4096
        assert knod.wait_for_data(b, timeout_ms=50) is None  # nothing sent yet
        sim_send(5100, payload, count=3)
        assert eventually(lambda: (b.wait_for_data(200, seen=0) or 0) >= 3 * len(payload))
        assert bytes(view[: 3 * len(payload)]) == payload.encode() * 3
        assert not view[3 * len(payload):].any()  # nothing past the stream
        c = b.counters()
        assert (c.rx_bytes, c.rx_packets) == (3 * len(payload), 3)
    del view
    buf.close()


def test_the_module_level_calls_of_the_article():
    buf = knod.SimBuffer(256)
    handle = knod.register_buffer(buf, 256, flows=flow(5101), netdev=NETDEV)
    with handle:
        sim_send(5101, "article")
        rx = None
        for _ in range(600):  # 60 s at most; ends at the data
            rx = knod.wait_for_data(handle, timeout_ms=100)
            if rx:
                break
        assert rx == len("article")
        assert bytes(buf[:7]) == b"article"
    assert handle.end_reason == "release"


def test_a_granted_binding_delivers_nothing_before_activation(client):
    buf = knod.SimBuffer(512)
    with client.request_binding(buf, flow(5102), netdev=NETDEV) as b:
        sim_send(5102, "too-early")
        assert b.wait_for_data(100) is None
        assert b.counters().rx_bytes == 0
        b.activate()
        sim_send(5102, "now")
        assert eventually(lambda: b.wait_for_data(100, seen=0) == 3)
        assert bytes(buf[:3]) == b"now"


def test_context_exit_releases_even_on_an_exception(client):
    buf = knod.SimBuffer(512)
    with client.register_buffer(buf, flow(5103), netdev=NETDEV) as b:
        held = b.id
    assert held not in binding_ids()
    assert b.end_reason == "release" and not b.revoked
    with pytest.raises(RuntimeError):
        with client.register_buffer(buf, flow(5103), netdev=NETDEV) as b2:
            raise RuntimeError("the job failed")
    assert b2.id not in binding_ids()
    assert journal(f"select end_reason from sessions where id = '{b2.id}'") == "release"


def test_deny_names_the_deciding_rule_for_a_real_unprivileged_caller():
    code = f"""
        import knod
        try:
            knod.register_buffer(knod.SimBuffer(4096), flows={flow(5104)!r}, netdev={NETDEV!r})
        except knod.Denied as e:
            print(type(e).__name__, e.rule, e.dbus_name, isinstance(e, PermissionError), sep="|")
            print(e)
        """
    rc, out, err = run_python(code, uid=65534)
    assert rc == 0, err
    first, message = out.splitlines()[:2]
    assert first == "Denied|no-nobody|org.knod.Policy1.Error.Denied|True"
    assert "denied by rule 'no-nobody'" in message
    # No rule for the run's third user: a default deny names no rule.
    rc, out, err = run_python(code, uid=int(os.environ['KNOD_TEST_NOBODY_UID']))
    assert rc == 0, err
    assert out.splitlines()[0] == "Denied|None|org.knod.Policy1.Error.Denied|True"
    assert "default deny" in out


def test_quota_and_flow_conflict_are_their_own_exceptions():
    code = f"""
        import knod
        c = knod.Client()
        first = c.register_buffer(knod.SimBuffer(4096), {flow(6001)!r}, netdev={NETDEV!r})
        try:
            c.register_buffer(knod.SimBuffer(4096), {flow(6002)!r}, netdev={NETDEV!r})
        except knod.QuotaExceeded as e:
            print("quota", e.rule, e.dbus_name)
        first.release()
        """
    rc, out, err = run_python(code, uid=int(os.environ['KNOD_TEST_QUOTA_UID']))
    assert rc == 0, err
    assert out.strip() == "quota one-each org.knod.Policy1.Error.QuotaExceeded"
    with knod.Client() as c, c.register_buffer(knod.SimBuffer(512), flow(5105), netdev=NETDEV):
        with pytest.raises(knod.FlowConflict) as e:
            c.register_buffer(knod.SimBuffer(512), flow(5105), netdev=NETDEV)
        assert e.value.dbus_name == "org.knod.Policy1.Error.FlowConflict"
        assert e.value.rule is None
    with knod.Client() as c, pytest.raises(knod.InvalidArgument):
        c.register_buffer(knod.SimBuffer(512), "not a flow", netdev=NETDEV)


def test_holder_exit_frees_the_binding():
    code = f"""
        import os, knod
        b = knod.register_buffer(knod.SimBuffer(4096), flows={flow(5106)!r}, netdev={NETDEV!r})
        print(b.id, flush=True)
        os._exit(0)  # no release, no cleanup: the process is simply gone
        """
    rc, out, err = run_python(code, uid=int(os.environ['KNOD_TEST_HOLDER_UID']))
    assert rc == 0, err
    held = out.strip()
    assert held
    assert eventually(lambda: held not in binding_ids())
    # Nobody waits for this end: it is committed by the journal's writer a moment after the
    # binding leaves the list (a loaded machine made that moment visible).
    assert eventually(lambda: journal(f"select end_reason from sessions where id = '{held}'") in (
        "process-exit", "disconnect"))
    # Its flow is free again.
    with knod.Client() as c, c.register_buffer(knod.SimBuffer(512), flow(5106), netdev=NETDEV):
        pass


def test_renew_and_a_revocation_seen_by_the_holder(client):
    import time

    buf = knod.SimBuffer(512)
    with client.register_buffer(buf, flow(5107), netdev=NETDEV) as b:
        expires = b.renew()
        assert expires > time.time() * 1e6 + 3000e6  # the rule's key lifetime is 1h
        assert b.end_reason is None
        out = cli("revoke", b.id, "--reason", "maintenance")
        assert out.returncode == 0, out.stderr
        with pytest.raises(knod.BindingEnded) as e:
            for _ in range(600):  # 60 s at most; ends at the revocation
                b.wait_for_data(100)
        assert e.value.reason == "revoke: maintenance"
        assert e.value.revoked
    # Leaving the block after a revocation does not fail: nothing is left to release.


def test_set_job_tags_once_and_refuses_bad_strings(client):
    # Issue #53: the holder tags its binding with the job it serves; the daemon checks the
    # strings, tags once, journals it (job-tagged) and the CLI lists it under --job.
    buf = knod.SimBuffer(512)
    with client.register_buffer(buf, flow(5170), netdev=NETDEV) as b:
        for job, group, rank in [("", "", 0), ("a b", "", 0), ("j" * 65, "", 0),
                                 ("job", "g$", 0), ("job", "g" * 65, 0), ("job", "", 65536)]:
            with pytest.raises(knod.InvalidArgument):
                b.set_job(job, group, rank)
        with pytest.raises(ValueError):
            b.set_job("job\0x")  # a NUL never reaches the C API
        with pytest.raises(TypeError):
            b.set_job("job", rank="1")
        with pytest.raises(ValueError):
            b.set_job("job", rank=-1)
        assert journal(f"select count(*) from events where kind = 'job-tagged' "
                       f"and session_id = '{b.id}'") == "0"
        b.set_job("10.0.0.1:29500", group="0", rank=3)
        with pytest.raises(knod.InvalidArgument) as e:
            b.set_job("job-2")
        assert "already tagged" in str(e.value)
        assert eventually(lambda: journal(
            "select json_extract(detail, '$.job') || '|' || json_extract(detail, '$.group') || "
            f"'|' || json_extract(detail, '$.rank') from events where kind = 'job-tagged' and "
            f"session_id = '{b.id}'") == "10.0.0.1:29500|0|3")
        out = cli("bindings", "--json", "--job", "10.0.0.1:29500")
        assert out.returncode == 0, out.stderr
        assert [(x["id"], x["job"], x["group"], x["rank"]) for x in json.loads(out.stdout)] == \
            [(b.id, "10.0.0.1:29500", "0", 3)]


def test_a_sim_binding_has_no_dmabuf_id(client):
    # Binding.DmabufId: the kernel's id of a devmem binding's dma-buf, which its fragments carry;
    # the sim binds no dma-buf of the kernel's, so 0.
    buf = knod.SimBuffer(512)
    with client.register_buffer(buf, flow(5171), netdev=NETDEV) as b:
        assert b.dmabuf_id == 0

        class OlderLibrary:  # a libknod-client from before knod_binding_dmabuf_id
            def __init__(self, lib):
                self._real = lib

            def __getattr__(self, name):
                if name == "knod_binding_dmabuf_id":
                    raise AttributeError(name)
                return getattr(self._real, name)

        real, b._lib = b._lib, OlderLibrary(b._lib)
        try:
            with pytest.raises(knod.Error) as e:
                b.dmabuf_id
            assert "knod_binding_dmabuf_id" in str(e.value)
        finally:
            b._lib = real
        assert b.dmabuf_id == 0
    # An ordinary user's holder reads it through the shipped bus policy, as a rank does.
    code = f"""
        import knod
        with knod.Client() as c:
            with c.register_buffer(knod.SimBuffer(512), {flow(5172)!r}, netdev={NETDEV!r}) as b:
                print(b.dmabuf_id)
        """
    rc, out, err = run_python(code, uid=int(os.environ['KNOD_TEST_HOLDER_UID']))
    assert rc == 0, err
    assert out.strip() == "0", out


def test_no_daemon_on_the_bus_is_unavailable(tmp_path):
    with pytest.raises(knod.Unavailable) as e:
        knod.Client(f"unix:path={tmp_path}/no-bus")
    assert f"{tmp_path}/no-bus" in str(e.value)


def test_sim_buffer_is_a_sealed_shared_memfd():
    buf = knod.SimBuffer(8192)
    seals = fcntl.fcntl(buf.fileno(), fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and not seals & fcntl.F_SEAL_WRITE
    os.pwrite(buf.fileno(), b"\x01\x02", 100)  # what the daemon does, seen through the map
    assert bytes(numpy.frombuffer(buf, dtype=numpy.uint8)[100:102]) == b"\x01\x02"
    assert len(buf) == buf.nbytes == 8192
    buf.close()
    buf.close()
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError):
            knod.SimBuffer(bad)


def test_bad_buffers_are_refused_before_the_daemon_is_asked(client):
    with pytest.raises(TypeError, match="export_dmabuf"):
        client.register_buffer(type("T", (), {"data_ptr": lambda s: 1})(), flow(5108))
    with pytest.raises(ValueError, match="length"):
        client.register_buffer(3, flow(5108))
    r, w = os.pipe()
    os.close(r)
    os.close(w)  # a number that is no open file now
    with pytest.raises(knod.InvalidArgument, match=f"region_fd {r} is not an open file"):
        client.register_buffer(r, flow(5108), length=4096)


def test_hostile_arguments_are_refused_not_truncated_or_wrapped(client):
    # ctypes cuts a str at NUL and wraps ints to their C type: "knodsim0\0junk" would bind
    # knodsim0, fd 2**32 + 5 would be fd 5. Each is refused before the daemon is asked.
    buf = knod.SimBuffer(4096)
    for kw in ({"netdev": NETDEV + "\0junk"}, {"gpu": "sim0\0x"}, {"mode": "rx-only\0"}):
        with pytest.raises(ValueError, match="NUL"):
            client.request_binding(buf, flow(5111), **kw)
    with pytest.raises(ValueError, match="NUL"):
        client.request_binding(buf, flow(5111) + "\0 -> 10.99.0.2:5999")
    with pytest.raises(TypeError, match="netdev must be a str"):
        client.request_binding(buf, flow(5111), netdev=b"knodsim0")
    with pytest.raises(ValueError, match="region fd"):
        client.request_binding(2**32 + buf.fileno(), flow(5111), length=4096)
    with pytest.raises(ValueError, match="length"):
        client.request_binding(buf.fileno(), flow(5111), length=2**64 + 100)
    with pytest.raises(ValueError, match="past the end"):
        client.request_binding(buf, flow(5111), offset=5000)
    with pytest.raises(ValueError, match="past the end"):
        client.request_binding(buf, flow(5111), offset=0, length=8192)
    with pytest.raises(TypeError, match="data_ptr"):
        knod.gpu.export_dmabuf(object())
    with pytest.raises(ValueError, match="device pointer"):
        knod.gpu.cuda_export_dmabuf(2**64, 4096)
    with client.register_buffer(buf, flow(5111), netdev=NETDEV) as b:
        with pytest.raises(ValueError, match="timeout_ms"):
            b.wait_for_data(2**40)  # would wrap to a 0 ms wait
        with pytest.raises(ValueError, match="seen"):
            b.wait_for_data(10, seen=-1)
    assert b.id not in binding_ids()


def _cpu_seconds():
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def test_waiting_sleeps_on_the_daemons_notifier(client):
    import threading

    buf = knod.SimBuffer(512)
    with client.register_buffer(buf, flow(5109), netdev=NETDEV) as b:
        assert b.wait_for_data(10) is None  # asks for the notifier
        # A second of waiting with nothing arriving: poll() on the notifier pipe and the bus, not
        # 500 round trips to the daemon (which polling every 2 ms would cost).
        before = _cpu_seconds()
        assert b.wait_for_data(1000) is None
        assert _cpu_seconds() - before < 0.005  # measured: 0.2 ms; polling: 16 ms and more
        # A payload wakes it, and the count is exact across wakes.
        t = threading.Timer(0.2, sim_send, args=(5109, "wake-up"))
        t.start()
        assert b.wait_for_data(10000) == 7
        t.join()
        sim_send(5109, "again", count=2)
        assert eventually(lambda: b.wait_for_data(100, seen=7) == 17)
        assert bytes(buf[:17]) == b"wake-upagainagain"


def test_only_the_key_holder_gets_the_notifier(client):
    import subprocess

    buf = knod.SimBuffer(512)
    with client.register_buffer(buf, flow(5110), netdev=NETDEV) as b:
        out = subprocess.run(
            ["busctl", "call", f"--address={os.environ['DBUS_SYSTEM_BUS_ADDRESS']}",
             "org.knod.Policy1", f"/org/knod/Policy1/bindings/{b.id}",
             "org.knod.Policy1.Binding", "RxNotifier", "ay", "3", "1", "2", "3"],
            capture_output=True, text=True)
        assert out.returncode != 0
        assert "key refused" in out.stderr


def test_a_process_of_a_unit_is_granted_by_a_units_rule_only_when_proven():
    """Issue #32: a `units` rule grants a process only once its identity is more than a pid. The
    package (through the C library) attests its process on each connection, so a real process
    of a real unit's cgroup, of a user no other rule names, is granted; a hand-written D-Bus
    call from the same process (python3-dbus, which does not attest) is refused as unproven."""
    # Where cgroup v2 is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host.
    root = next((line.split()[4] for line in open("/proc/self/mountinfo")
                 if " - cgroup2 " in line), "")
    if not root or not os.access(os.path.join(root, "cgroup.procs"), os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy")
    unit = os.path.join(root, "system.slice", f"knodpy-unit-{os.getpid()}.service")
    os.makedirs(unit, exist_ok=True)
    uid = int(os.environ["KNOD_TEST_NOBODY_UID"])
    code = f"""
        import os, knod
        b = knod.register_buffer(knod.SimBuffer(4096), flows={flow(7001)!r}, netdev={NETDEV!r})
        print("granted", b.rule)
        b.release()
        try:
            import dbus
        except ImportError:
            print("no python3-dbus")
            raise SystemExit(0)
        bus = dbus.bus.BusConnection(os.environ["DBUS_SYSTEM_BUS_ADDRESS"])
        mgr = dbus.Interface(bus.get_object("org.knod.Policy1", "/org/knod/Policy1"),
                             "org.knod.Policy1.Manager")
        region = os.memfd_create("r", os.MFD_ALLOW_SEALING)
        os.ftruncate(region, 4096)
        import fcntl
        fcntl.fcntl(region, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        try:
            mgr.RequestBinding({NETDEV!r}, "sim0", "rx-only", dbus.types.UnixFd(region),
                               dbus.UInt64(0), dbus.UInt64(4096), [{flow(7002)!r}])
            print("unproven granted")
        except dbus.exceptions.DBusException as e:
            print("unproven", e.get_dbus_name(), e.get_dbus_message())
        """
    argv = ["sh", "-c", f"echo $$ > '{unit}/cgroup.procs' && exec \"$@\"", "sh",
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            sys.executable, "-c", textwrap.dedent(code)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        os.rmdir(unit)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "granted unit-py", p.stdout
    proof = journal("SELECT json_extract(detail, '$.process_proof') FROM events WHERE "
                    "kind = 'request-granted' AND rule = 'unit-py'")
    assert proof.splitlines() == ["attested"]
    if lines[1] != "no python3-dbus":
        assert lines[1].startswith("unproven org.knod.Policy1.Error.Denied"), p.stdout
        assert "not proven" in lines[1], p.stdout


def test_the_public_api_is_typed_and_says_so():
    """#36: a typed package (py.typed beside it) whose public functions and methods annotate
    every parameter and their return, so a type checker sees shapes, not Any."""
    import inspect
    import pathlib
    import typing

    assert (pathlib.Path(knod.__file__).parent / "py.typed").is_file()
    callables = [getattr(knod, n) for n in knod.__all__ if inspect.isfunction(getattr(knod, n))]
    for cls in (knod.Client, knod.Binding, knod.SimBuffer, knod.DmaBuf, knod.DevmemReceiver):
        callables += [m for n, m in vars(cls).items()
                      if inspect.isfunction(m) and (not n.startswith("_") or n == "__init__")]
    callables += [knod.gpu.export_dmabuf, knod.gpu.cuda_export_dmabuf, knod.gpu.hip_export_dmabuf]
    unannotated = []
    for fn in callables:
        hints = typing.get_type_hints(fn)  # also checks that every annotation resolves
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        missing = [p.name for p in params if p.name not in hints] + \
            ([] if "return" in hints else ["return"])
        if missing:
            unannotated.append(f"{fn.__qualname__}: {missing}")
    assert not unannotated, unannotated


def test_python_m_knod_points_at_the_examples():
    r = subprocess.run([sys.executable, "-m", "knod", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "/usr/share/doc/python3-knod/examples/receive.py" in r.stdout
    v = subprocess.run([sys.executable, "-m", "knod", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("libknod-client "), (v.stdout, v.stderr)


def test_a_sim_tensor_is_registered_and_its_sum_shows_the_bytes_that_landed(client):
    """#36: the article's listing with a torch tensor, allocated in a sim buffer."""
    torch = pytest.importorskip("torch")
    buffer = knod.sim_tensor(4096)
    assert buffer.dtype == torch.uint8 and buffer.shape == (4096,)
    payload = secrets.token_hex(16).encode()
    with knod.register_buffer(buffer, flows=flow(5150), netdev=NETDEV, client=client) as handle:
        assert handle.length == 4096
        sim_send(5150, payload.decode(), count=2)
        assert eventually(lambda: (handle.wait_for_data(200, seen=0) or 0) >= 2 * len(payload))
        assert buffer.sum().item() == 2 * sum(payload)
        assert bytes(buffer[: 2 * len(payload)].numpy()) == payload * 2
    # A slice along the first dimension binds that slice; a wider dtype works the same.
    words = knod.sim_tensor(256, dtype=torch.int32)
    with knod.register_buffer(words[64:128], flows=flow(5151), netdev=NETDEV,
                              client=client) as handle:
        assert handle.length == 64 * 4
        sim_send(5151, "abcd", count=1)
        assert eventually(lambda: (handle.wait_for_data(200, seen=0) or 0) >= 4)
        assert words[64].item() == int.from_bytes(b"abcd", "little")
        assert words[:64].sum().item() == 0


def test_a_sim_tensors_memory_cannot_be_unmapped_under_it():
    torch = pytest.importorskip("torch")
    buf = knod.SimBuffer(4096)
    t = buf.tensor()
    view = t[10:20]
    with pytest.raises(BufferError):
        buf.close()
    t[10] = 7  # still mapped
    assert view[0].item() == 7
    del t, view
    buf.close()
    assert buf.closed
    assert knod.sim_tensor(8, dtype=torch.float32).numel() == 8
    assert knod.sim_tensor(8, dtype=torch.bfloat16).numel() == 8  # a type numpy lacks
    with pytest.raises(OSError, match="cannot be resized"):
        knod.SimBuffer(4096).resize(1 << 20)  # a moved mapping would bind the wrong memfd


def test_a_dropped_sim_tensor_leaves_no_fd_open():
    pytest.importorskip("torch")
    import gc

    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        knod.sim_tensor(4096)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_tensors_and_arrays_that_cannot_be_bound_are_refused_naming_the_fix(client):
    torch = pytest.importorskip("torch")
    plain = torch.zeros(4096, dtype=torch.uint8)  # memory torch allocated, not a sim buffer
    with pytest.raises(TypeError, match="knod.sim_tensor"):
        client.request_binding(plain, flow(5152), netdev=NETDEV)
    sim = knod.sim_tensor(4096)
    with pytest.raises(ValueError, match="not contiguous"):
        client.request_binding(sim[::2], flow(5152), netdev=NETDEV)
    with pytest.raises(ValueError, match="offset="):
        client.request_binding(sim, flow(5152), netdev=NETDEV, offset=8)
    with pytest.raises(ValueError, match="no bytes"):
        client.request_binding(sim[:0], flow(5152), netdev=NETDEV)
    with pytest.raises(ValueError, match="out of range"):
        client.request_binding(sim[:16], flow(5152), netdev=NETDEV, length=17)
    with pytest.raises(TypeError, match="not in a knod sim buffer"):
        client.request_binding(numpy.zeros(64, dtype=numpy.uint8), flow(5152), netdev=NETDEV)
    # numpy over a sim buffer binds as the tensor does.
    buf = knod.SimBuffer(4096)
    arr = numpy.frombuffer(buf, dtype=numpy.uint8)[128:256]
    with client.request_binding(arr, flow(5152), netdev=NETDEV) as b:
        assert b.length == 128
    del arr
    buf.close()


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_the_articles_example_prints_the_sum_of_what_landed(kind):
    """examples/receive.py (the main job's Python part): a torch tensor in a sim buffer, or a
    numpy array with --numpy (what runs where torch is absent); buffer.sum().item() is the sum
    of the bytes sent."""
    if kind == "torch":
        pytest.importorskip("torch")
    port = 5153 if kind == "torch" else 5154
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "receive.py")
    argv = [sys.executable, example, "--netdev", NETDEV, "--bytes", "4096", "--flow", flow(port),
            "--packets", "2", "--timeout-ms", "20000"] + (["--numpy"] if kind == "numpy" else [])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("activated"):
                break
        assert any(f"buffer: a {kind} (4096,)" in l for l in lines), lines
        payload = secrets.token_hex(8)
        sim_send(port, payload, count=2)
        out, _ = p.communicate(timeout=60)
        lines += out.splitlines()
    finally:
        p.kill()
    assert p.returncode == 0, lines
    assert f"buffer.sum().item() = {2 * sum(payload.encode())}" in lines, lines
    assert any(l.startswith("buffer holds 32 byte(s) from 2 packet(s)") for l in lines), lines


def test_devmem_receive_from_python_on_a_loopback_stream():
    """#36: knod.DevmemReceiver over the C API on the live kernel's TCP (no devmem NIC here: the
    stream comes back as linear bytes, no fragment); wait_for_data on it; release of a token the
    socket never had names what the kernel freed; the peer's close is an empty Received."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    peer = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    # devmem receive is TCP only: any other socket is refused up front, naming what it is.
    for family, kind, says in ((socket.AF_INET, socket.SOCK_DGRAM, "a UDP socket"),
                               (socket.AF_UNIX, socket.SOCK_STREAM, "a Unix socket")):
        with socket.socket(family, kind) as other:
            # The message names the caller's fd, not a copy's.
            with pytest.raises(knod.InvalidArgument, match=f"fd {other.fileno()} is {says}"):
                knod.DevmemReceiver(other)
    closed = socket.socket()
    number = closed.fileno()
    closed.close()
    with pytest.raises(knod.InvalidArgument, match="the socket is closed"):
        knod.DevmemReceiver(closed)
    if not os.path.exists(f"/proc/self/fd/{number}"):
        with pytest.raises(knod.InvalidArgument, match=f"fd {number} is not open"):
            knod.DevmemReceiver(number)
    for wrong in (True, 3.0, "3", None):
        with pytest.raises(TypeError):
            knod.DevmemReceiver(wrong)
    with knod.DevmemReceiver(conn) as rx:
        assert rx.wait(50) is False  # nothing sent yet
        assert knod.wait_for_data(rx, timeout_ms=50) is None
        peer.sendall(b"devmem-linear")
        assert rx.wait(30000)
        got = knod.wait_for_data(rx, timeout_ms=30000)
        assert got == knod.Received([], b"devmem-linear")
        with pytest.raises(knod.Error, match="freed 0 of 1|Protocol not available"):
            rx.release([knod.Fragment(0, 100, 12345, 0)])
        rx.release([])
        for bad in ({"linear_size": 0}, {"linear_size": -1}, {"max_fragments": 0}):
            with pytest.raises(ValueError):
                rx.receive(**bad)  # no room for either would read as the peer's close
        with pytest.raises(ValueError):
            rx.wait(2**32)
        with pytest.raises(ValueError):
            rx.release([knod.Fragment(0, 100, 2**32 + 5, 0)])  # would free token 5
        # The receiver has a dup of its own: the caller's socket may close.
        conn.close()
        peer.sendall(b"after")
        assert rx.receive() == knod.Received([], b"after")
        # A receive blocked in one thread; close() from another waits for it, never frees the
        # handle under it.
        import threading

        got = []
        reader = threading.Thread(target=lambda: got.append(rx.receive()))
        reader.start()
        assert eventually(rx._lock.locked)  # the reader is inside the C call
        closer = threading.Thread(target=rx.close)
        closer.start()
        peer.sendall(b"late")
        reader.join(30)
        closer.join(30)
        assert got == [knod.Received([], b"late")]
    with pytest.raises(ValueError, match="closed"):
        rx.wait(0)
    # The peer's close, on a fresh receiver: an empty Received.
    peer2 = socket.create_connection(server.getsockname())
    conn2, _ = server.accept()
    with knod.DevmemReceiver(conn2) as rx2:
        peer2.close()
        assert rx2.wait(30000)
        assert rx2.receive() == knod.Received([], b"")
    conn2.close()
    peer.close()
    server.close()
