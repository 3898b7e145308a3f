#!/usr/bin/python3
"""Writes a pause image for containerd's CRI plugin as an OCI image-layout tar, with no registry
and no network: one layer holding a static catatonit (the init Debian packages; `-P` makes it
the pause process a pod sandbox needs), its config, its manifest, and an index whose
io.containerd.image.name annotation names it for `ctr images import`.

  make_pause_image.py OUT.tar IMAGE_NAME [CATATONIT]      (default /usr/bin/catatonit)

Exits 1 when the binary is not static: a sandbox has no libraries to load it with.
"""
import hashlib
import io
import json
import platform
import sys
import tarfile

ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def is_static(path):
    # A dynamically linked ELF has a PT_INTERP program header; `readelf` would need binutils,
    # so read the ELF header and program headers ourselves (64-bit little-endian only).
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return False
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(int.from_bytes(table[i * phentsize:i * phentsize + 4], "little") != 3
               for i in range(phnum))


def blob(files, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    files["blobs/sha256/" + digest[7:]] = data
    return {"digest": digest, "size": len(data)}


def tar_bytes(members):
    """members: (name, bytes or None for a directory, mode). Fixed times and owners: the same
    binary gives the same digests."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid = mode, 0, 0, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    out, name = sys.argv[1], sys.argv[2]
    binary = sys.argv[3] if len(sys.argv) == 4 else "/usr/bin/catatonit"
    if not is_static(binary):
        print("make_pause_image: %s is not a static ELF64 binary" % binary, file=sys.stderr)
        return 1
    with open(binary, "rb") as f:
        exe = f.read()
    # runc makes /dev, /proc, /sys, /dev/shm itself; /etc and /tmp are where a runtime may
    # place files.
    layer = tar_bytes([("etc", None, 0o755), ("tmp", None, 0o1777), ("catatonit", exe, 0o755)])
    files = {}
    layer_desc = dict(blob(files, layer), mediaType="application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": ARCH, "os": "linux",
        "config": {"Entrypoint": ["/catatonit", "-P"], "WorkingDir": "/",
                   "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers",
                   "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created_by": "tests/cni/cri/make_pause_image.py"}],
    }
    config_desc = dict(blob(files, json.dumps(config, sort_keys=True).encode()),
                       mediaType="application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = dict(blob(files, json.dumps(manifest, sort_keys=True).encode()),
                         mediaType="application/vnd.oci.image.manifest.v1+json",
                         platform={"architecture": ARCH, "os": "linux"},
                         annotations={"io.containerd.image.name": name,
                                      "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]})
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode()
    files["oci-layout"] = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    dirs = [("blobs", None, 0o755), ("blobs/sha256", None, 0o755)]
    with open(out, "wb") as f:
        f.write(tar_bytes(dirs + [(k, v, 0o644) for k, v in sorted(files.items())]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
