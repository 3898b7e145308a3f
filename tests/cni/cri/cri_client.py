#!/usr/bin/python3
"""A small CRI client (runtime.v1 over gRPC) for tests/cni/containerd_test.sh: the calls the
kubelet makes to create and delete a pod sandbox, since no kubelet or crictl is packaged in
Debian 12. The proto beside this file is compiled at run time (grpc_tools.protoc, Debian's
python3-grpc-tools) into a temporary directory, or once into --stubs DIR: nothing generated is
kept in the tree.

  cri_client.py --socket PATH [--stubs DIR] COMMAND ...
    version                      prints the runtime's name, version and API version
    ready                        exits 0 once RuntimeReady and NetworkReady hold (a CNI config
                                 is loaded), else prints the conditions that do not and exits 1
    image REF                    prints the image's id; exits 1 while the CRI does not know it
    run --namespace NS --name NAME --uid UID [--annotation K=V]... [--cgroup-parent P]
        [--log-dir DIR]          RunPodSandbox; prints the sandbox id
    status ID                    prints JSON: state, ip, metadata, annotations, and from
                                 containerd's verbose info the pause pid and the netns path
    stop ID | remove ID          StopPodSandbox, RemovePodSandbox
    list                         prints one sandbox id a line

A call the runtime refuses prints "error CODE: MESSAGE" on stdout (the message is what the
kubelet would show) and exits 1; bad usage exits 2.
"""
import argparse
import importlib
import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = "runtime_subset.proto"
MODULE = PROTO[:-len(".proto")]


def load_stubs(out):
    if not os.path.exists(os.path.join(out, MODULE + "_pb2_grpc.py")):
        # Into a fresh name, then renamed: two clients compiling into one dir at once never
        # import a half-written module. The subset imports no other proto.
        tmp = tempfile.mkdtemp(prefix=".protoc.", dir=out)
        rc = protoc.main(["protoc", "-I" + HERE, "--python_out=" + tmp,
                          "--grpc_python_out=" + tmp, os.path.join(HERE, PROTO)])
        if rc != 0:
            sys.exit("cri_client: protoc failed on %s (exit %d)" % (PROTO, rc))
        for suffix in ("_pb2.py", "_pb2_grpc.py"):  # the module the other imports goes first
            os.rename(os.path.join(tmp, MODULE + suffix), os.path.join(out, MODULE + suffix))
        os.rmdir(tmp)
    sys.path.insert(0, out)
    return importlib.import_module(MODULE + "_pb2"), importlib.import_module(MODULE + "_pb2_grpc")


def key_value(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected K=V, got %r" % text)
    return key, value


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the runtime's gRPC unix socket")
    p.add_argument("--stubs", help="a directory to compile the proto into once and reuse")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for one call")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("version")
    sub.add_parser("ready")
    sub.add_parser("image").add_argument("ref")
    run = sub.add_parser("run")
    run.add_argument("--namespace", required=True)
    run.add_argument("--name", required=True)
    run.add_argument("--uid", required=True)
    run.add_argument("--attempt", type=int, default=0)
    run.add_argument("--annotation", type=key_value, action="append", default=[])
    run.add_argument("--label", type=key_value, action="append", default=[])
    run.add_argument("--cgroup-parent", default="")
    run.add_argument("--log-dir", default="")
    for name in ("status", "stop", "remove"):
        sub.add_parser(name).add_argument("id")
    sub.add_parser("list")
    return p.parse_args()


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="cri-client.") as tmp:
        if args.stubs:
            os.makedirs(args.stubs, exist_ok=True)
        pb, pb_grpc = load_stubs(args.stubs or tmp)
        with grpc.insecure_channel("unix://" + os.path.abspath(args.socket)) as channel:
            try:
                return call(args, pb, pb_grpc.RuntimeServiceStub(channel),
                            pb_grpc.ImageServiceStub(channel))
            except grpc.RpcError as e:
                print("error %s: %s" % (e.code().name, e.details()))
                return 1


def call(args, pb, rt, img):
    t = args.timeout
    if args.command == "version":
        r = rt.Version(pb.VersionRequest(version="v1"), timeout=t)
        print(r.runtime_name, r.runtime_version, r.runtime_api_version)
    elif args.command == "ready":
        r = rt.Status(pb.StatusRequest(), timeout=t)
        conditions = {c.type: c for c in r.status.conditions}
        unmet = ["%s: %s %s" % (n, conditions[n].reason, conditions[n].message)
                 if n in conditions else n + ": not reported"
                 for n in ("RuntimeReady", "NetworkReady")
                 if n not in conditions or not conditions[n].status]
        if unmet:
            print("; ".join(unmet))
            return 1
    elif args.command == "image":
        r = img.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=args.ref)), timeout=t)
        if not r.HasField("image"):
            print("no image %s" % args.ref)
            return 1
        print(r.image.id)
    elif args.command == "run":
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=args.name, uid=args.uid, namespace=args.namespace,
                                           attempt=args.attempt),
            hostname=args.name[:63],
            log_directory=args.log_dir,
            labels=dict(args.label),
            annotations=dict(args.annotation),
            # As the kubelet sends for a pod without hostNetwork: namespaces of the pod's own.
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=args.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.POD,
                                                         ipc=pb.POD))))
        r = rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=t)
        print(r.pod_sandbox_id)
    elif args.command == "status":
        r = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=args.id, verbose=True),
                                timeout=t)
        out = {"id": r.status.id, "state": pb.PodSandboxState.Name(r.status.state),
               "ip": r.status.network.ip, "namespace": r.status.metadata.namespace,
               "name": r.status.metadata.name, "uid": r.status.metadata.uid,
               "annotations": dict(r.status.annotations), "netns": "", "pid": 0}
        # containerd's verbose info: {"pid": ..., "runtimeSpec": {"linux": {"namespaces":
        # [{"type": "network", "path": ".../netns/cni-..."}, ...]}}, ...}.
        info = json.loads(r.info.get("info") or "{}")
        out["pid"] = info.get("pid", 0)
        for ns in ((info.get("runtimeSpec") or {}).get("linux") or {}).get("namespaces") or []:
            if ns.get("type") == "network":
                out["netns"] = ns.get("path", "")
        print(json.dumps(out, sort_keys=True))
    elif args.command == "stop":
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=args.id), timeout=t)
    elif args.command == "remove":
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=args.id), timeout=t)
    elif args.command == "list":
        for item in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=t).items:
            print(item.id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
