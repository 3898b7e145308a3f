"""Helpers for the knod package's tests; tests/python/run.sh starts the daemon they talk to."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

NETDEV = os.environ.get("KNOD_SIM_NETDEV", "knodsim0")
NETNS = os.environ.get("KNOD_SIM_NETNS", "knod-sim")
CLI = os.environ.get("KNOD_CLI", "knod-policy")


def flow(port):
    return f"udp 10.99.0.0/24:* -> 10.99.0.2:{port}"


def sim_send(port, data, count=1):
    """UDP from the sim's wire side, as `knod-policy sim-send` sends it."""
    subprocess.run([CLI, "sim-send", "--netns", NETNS, "--to", f"10.99.0.2:{port}", "--count",
                    str(count), "--data", data], check=True, capture_output=True)


def cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True)


def binding_ids():
    out = cli("bindings", "--json")
    assert out.returncode == 0, out.stderr
    return {b["id"] for b in json.loads(out.stdout)}


# A wait's floor: a neighbour's load makes these machines ten times slower, and a condition
# that holds ends the wait at once (docs/testing.md).
MIN_WAIT_S = 60.0


def eventually(pred, seconds=MIN_WAIT_S):
    """Waits until pred() holds (polling every 20 ms); never less than MIN_WAIT_S."""
    end = time.monotonic() + max(seconds, MIN_WAIT_S)
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def run_python(code, uid=0, timeout=30):
    """Runs `code` in a fresh /usr/bin/python3, as `uid` (setpriv, no groups) unless 0;
    returns (returncode, stdout, stderr)."""
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    if uid:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def journal(sql):
    db = os.path.join(os.environ["KNOD_STATE_DIR"], "journal.db")
    out = subprocess.run(["sqlite3", db, sql], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def client():
    import knod

    with knod.Client() as c:
        yield c
