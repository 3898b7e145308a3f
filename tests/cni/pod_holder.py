"""A pod's worker, as the Python SDK's user writes it: asks knod-policyd for a binding of the
sim netdev to a buffer of its own, writes what it got to a result file, and holds the binding
until it is killed or the binding ends. Run inside a container by tests/cni/podman_test.sh and
tests/cni/containerd_test.sh.

  pod_holder.py RESULT NETDEV GPU FLOW

RESULT gets one line: "ok ID RULE" (then "ended REASON" once the daemon ends it), or
"error CLASS RULE: MESSAGE" when refused.
"""
import sys

import knod


def main():
    result, netdev, gpu, flow = sys.argv[1:5]
    buf = knod.SimBuffer(4096)
    out = open(result, "w", buffering=1)
    try:
        client = knod.Client()
        binding = client.request_binding(buf, flow, netdev=netdev, gpu=gpu)
    except knod.Error as e:
        out.write(f"error {type(e).__name__} {e.rule}: {e.message}\n")
        return 1
    out.write(f"ok {binding.id} {binding.rule}\n")
    # Holds until the daemon ends the binding (the caller is told why) or the process is killed.
    try:
        while True:
            binding.wait_for_data(timeout_ms=1000)
    except knod.BindingEnded as e:
        out.write(f"ended {e.reason}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
