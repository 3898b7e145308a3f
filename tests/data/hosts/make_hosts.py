#!/usr/bin/env python3
"""Writes the fixture host trees next to this script: sysfs, /proc, /boot and /opt/rocm shaped
like real machines, for the host inventory and isolation tests and `knod-policy doctor
--host-root`. Run it again after changing it; the trees are committed.

  mi250x-cx6    MI250X and ConnectX-6 Dx under one PCIe switch with ACS on; translated DMA;
                knod loaded; kernel with P2PDMA and DMABUF_MOVE_NOTIFY; ROCm 6.2.
  shared-group  RX 7900 XTX, an E810 and an NVMe drive below a switch without ACS: one IOMMU
                group for all; kernel without P2PDMA; config only in /boot; ROCm 6.0.
  identity      W7900 and ConnectX-6 on two root complexes; iommu=pt (identity domains).
  no-iommu      a virtio NIC and no IOMMU at all, like the project's VMs; no kernel config.
  passthrough-switch
                iommu.passthrough=1 (identity domains, no iommu=pt); a one-queue NIC behind a
                switch whose single-function upstream port has no ACS (not applicable) and whose
                downstream port has it; the GPU on a root port whose ACS cannot do Upstream
                Forwarding (so it counts as on).
"""
import gzip
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


# PCI Express Device/Port Type (PCIe base spec 7.5.3.2).
ENDPOINT, ROOT_PORT, UPSTREAM, DOWNSTREAM = 0, 4, 5, 6


def config_space(vendor, device, class_code, acs=None, port=ENDPOINT, acs_cap=0x005F):
    """4 KiB of PCI config space: ids, class, a PCI Express capability with the port type, and
    extended capabilities (AER, then ACS when `acs` is the control register value)."""
    b = bytearray(4096)
    struct.pack_into("<HH", b, 0, vendor, device)
    struct.pack_into("<H", b, 6, 0x0010)  # status: capability list
    struct.pack_into("<I", b, 8, class_code << 8)
    b[0x0E] = 1 if (class_code >> 8) == 0x0604 else 0
    b[0x34] = 0x40
    struct.pack_into("<BBH", b, 0x40, 0x10, 0, 2 | (port << 4))  # PCIe v2, last capability
    nxt = 0x148 if acs is not None else 0
    struct.pack_into("<I", b, 0x100, 0x0001 | (1 << 16) | (nxt << 20))  # AER
    if acs is not None:
        struct.pack_into("<I", b, 0x148, 0x000D | (1 << 16))  # ACS, last
        struct.pack_into("<HH", b, 0x14C, acs_cap, acs)  # capability, control
    return bytes(b)


class Host:
    def __init__(self, name):
        self.root = os.path.join(HERE, name)
        shutil.rmtree(self.root, ignore_errors=True)
        self.sys = os.path.join(self.root, "sys")
        self.devices = {}
        self.ports = {}

    def path(self, *parts):
        p = os.path.join(*parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def write(self, path, text, mode="w"):
        with open(self.path(path), mode) as f:
            f.write(text)

    def link(self, at, target):
        self.path(at)
        os.symlink(os.path.relpath(target, os.path.dirname(at)), at)

    def pci(self, parent, bdf, vendor, device, class_code, driver=None, acs=None, acs_cap=0x005F, **files):
        base = self.devices[parent] if parent in self.devices else os.path.join(self.sys, "devices", parent)
        d = os.path.join(base, bdf)
        self.devices[bdf] = d
        # Port type from the place in the tree: a bridge on a host bridge is a root port, one
        # below a root or downstream port a switch upstream port, one below that a downstream port.
        port = ENDPOINT
        if (class_code >> 8) == 0x0604:
            up = self.ports.get(parent)
            port = ROOT_PORT if up is None else DOWNSTREAM if up == UPSTREAM else UPSTREAM
        self.ports[bdf] = port
        self.write(os.path.join(d, "vendor"), "0x%04x\n" % vendor)
        self.write(os.path.join(d, "device"), "0x%04x\n" % device)
        self.write(os.path.join(d, "class"), "0x%06x\n" % class_code)
        cfg = bytearray(config_space(vendor, device, class_code, acs, port, acs_cap))
        # Two functions of one slot: both say multi-function in their header type.
        for other in self.devices:
            if other != bdf and other.rsplit(".", 1)[0] == bdf.rsplit(".", 1)[0]:
                cfg[0x0E] |= 0x80
                path = os.path.join(self.devices[other], "config")
                with open(path, "r+b") as f:
                    f.seek(0x0E)
                    head = f.read(1)[0]
                    f.seek(0x0E)
                    f.write(bytes([head | 0x80]))
        self.write(os.path.join(d, "config"), bytes(cfg), "wb")
        for k, v in files.items():
            self.write(os.path.join(d, k), v)
        self.link(os.path.join(self.sys, "bus/pci/devices", bdf), d)
        if driver:
            drv = os.path.join(self.sys, "bus/pci/drivers", driver)
            self.write(os.path.join(drv, "uevent"), "")
            self.link(os.path.join(d, "driver"), drv)
        return d

    def group(self, number, kind, *bdfs):
        g = os.path.join(self.sys, "kernel/iommu_groups", str(number))
        self.write(os.path.join(g, "type"), kind + "\n")
        for bdf in bdfs:
            self.link(os.path.join(g, "devices", bdf), self.devices[bdf])
            self.link(os.path.join(self.devices[bdf], "iommu_group"), g)

    def netdev(self, bdf, name, ifindex, rx_queues, driver=None, under=None):
        dev = self.devices[bdf] if under is None else os.path.join(self.devices[bdf], under)
        n = os.path.join(dev, "net", name)
        self.write(os.path.join(n, "ifindex"), "%d\n" % ifindex)
        self.write(os.path.join(n, "operstate"), "up\n")
        self.write(os.path.join(n, "flags"), "0x1003\n")
        # Git keeps no empty directory: each queue gets the file the kernel puts there.
        for q in range(rx_queues):
            self.write(os.path.join(n, "queues", "rx-%d" % q, "rps_cpus"), "0\n")
            self.write(os.path.join(n, "queues", "tx-%d" % q, "xps_cpus"), "0\n")
        self.link(os.path.join(n, "device"), dev)
        self.link(os.path.join(self.sys, "class/net", name), n)
        if under is not None and driver:
            drv = os.path.join(self.sys, "bus/virtio/drivers", driver)
            self.write(os.path.join(drv, "uevent"), "")
            self.link(os.path.join(dev, "driver"), drv)

    def gpu_nodes(self, bdf, card, render):
        for node in ("card%d" % card, "renderD%d" % render):
            d = os.path.join(self.devices[bdf], "drm", node)
            self.write(os.path.join(d, "dev"), "226:%d\n" % (card if node.startswith("card") else render))
            self.link(os.path.join(self.sys, "class/drm", node), d)

    def knod(self, index, netdev, gpu, rx_queues):
        d = os.path.join(self.sys, "devices/virtual/knod", "knod%d" % index)
        self.write(os.path.join(d, "netdev"), netdev + "\n")
        self.write(os.path.join(d, "gpu"), gpu + "\n")
        self.write(os.path.join(d, "rx_queues"), "%d\n" % rx_queues)
        self.write(os.path.join(d, "version"), "3\n")
        self.write(os.path.join(d, "bind"), "")
        self.write(os.path.join(d, "unbind"), "")
        self.link(os.path.join(self.sys, "class/knod", "knod%d" % index), d)

    def kernel(self, release, cmdline, config=None, config_in_boot=False):
        self.write(os.path.join(self.root, "proc/cmdline"), cmdline + "\n")
        self.write(os.path.join(self.root, "proc/sys/kernel/osrelease"), release + "\n")
        if config is None:
            return
        text = "#\n# Linux/x86 %s Kernel Configuration\n#\n" % release + "\n".join(config) + "\n"
        if config_in_boot:
            self.write(os.path.join(self.root, "boot", "config-" + release), text)
        else:
            with gzip.GzipFile(self.path(os.path.join(self.root, "proc/config.gz")), "wb", mtime=0) as f:
                f.write(text.encode())

    def rocm(self, version):
        self.write(os.path.join(self.root, "opt/rocm/.info/version"), version + "\n")


ACS_ON = 0x001D  # SV RR CR UF
BRIDGE = 0x060400

# --- MI250X + ConnectX-6 Dx under one Broadcom PEX switch, ACS on --------------------------
h = Host("mi250x-cx6")
h.pci("pci0000:00", "0000:00:01.1", 0x1022, 0x14AB, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:00:01.1", "0000:01:00.0", 0x1000, 0xC030, BRIDGE, "pcieport")
h.pci("0000:01:00.0", "0000:02:00.0", 0x1000, 0xC030, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:01:00.0", "0000:02:01.0", 0x1000, 0xC030, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:02:00.0", "0000:03:00.0", 0x1002, 0x740C, 0x038000, "amdgpu",
      mem_info_vram_total="68702699520\n")
h.pci("0000:02:01.0", "0000:04:00.0", 0x15B3, 0x101D, 0x020000, "mlx5_core")
h.pci("0000:02:01.0", "0000:04:00.1", 0x15B3, 0x101D, 0x020000, "mlx5_core")
h.gpu_nodes("0000:03:00.0", 0, 128)
h.netdev("0000:04:00.0", "eth2", 4, 8)
h.netdev("0000:04:00.1", "eth3", 5, 8)
for n, bdf in enumerate(["0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"]):
    h.group(n, "DMA", bdf)
h.group(10, "DMA-FQ", "0000:03:00.0")
h.group(11, "DMA-FQ", "0000:04:00.0", "0000:04:00.1")
h.knod(0, "eth2", "0000:03:00.0", 8)
h.kernel("6.12.0-knod-v3", "BOOT_IMAGE=/vmlinuz-6.12.0-knod-v3 root=/dev/nvme0n1p2 ro amd_iommu=on amdgpu.knod_enable=1",
         ["CONFIG_PCI_P2PDMA=y", "CONFIG_DMABUF_MOVE_NOTIFY=y", "CONFIG_AMD_KNOD=y", "CONFIG_NET_DEVMEM=y",
          "# CONFIG_UDMABUF is not set"])
h.rocm("6.2.1-112")

# --- a workstation: RX 7900 XTX, E810, NVMe below a switch without ACS ----------------------
h = Host("shared-group")
h.pci("pci0000:00", "0000:00:01.0", 0x1022, 0x1483, BRIDGE, "pcieport")
h.pci("0000:00:01.0", "0000:01:00.0", 0x1002, 0x1478, BRIDGE, "pcieport")
h.pci("0000:01:00.0", "0000:02:00.0", 0x1002, 0x1479, BRIDGE, "pcieport", 0x0000)
h.pci("0000:01:00.0", "0000:02:01.0", 0x1002, 0x1479, BRIDGE, "pcieport", 0x0000)
h.pci("0000:01:00.0", "0000:02:02.0", 0x1002, 0x1479, BRIDGE, "pcieport", 0x0000)
h.pci("0000:02:00.0", "0000:03:00.0", 0x1002, 0x744C, 0x030000, "amdgpu",
      mem_info_vram_total="25753026560\n")
h.pci("0000:02:00.0", "0000:03:00.1", 0x1002, 0xAB30, 0x040300, "snd_hda_intel")
h.pci("0000:02:01.0", "0000:04:00.0", 0x8086, 0x1593, 0x020000, "ice")
h.pci("0000:02:02.0", "0000:05:00.0", 0x144D, 0xA808, 0x010802, "nvme")
h.gpu_nodes("0000:03:00.0", 1, 129)
h.netdev("0000:04:00.0", "enp4s0", 3, 16)
h.group(0, "DMA", "0000:00:01.0")
h.group(7, "DMA", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0", "0000:02:02.0", "0000:03:00.0",
        "0000:03:00.1", "0000:04:00.0", "0000:05:00.0")
h.kernel("6.8.0-45-generic", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-45-generic root=UUID=1 ro quiet splash",
         ["# CONFIG_PCI_P2PDMA is not set", "# CONFIG_DMABUF_MOVE_NOTIFY is not set", "CONFIG_NET_DEVMEM=y"],
         config_in_boot=True)
h.rocm("6.0.2-115")

# --- W7900 and ConnectX-6 on two root complexes, iommu=pt -----------------------------------
h = Host("identity")
h.pci("pci0000:40", "0000:40:01.1", 0x1022, 0x14AB, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:40:01.1", "0000:41:00.0", 0x1002, 0x7448, 0x030000, "amdgpu",
      mem_info_vram_total="51522830336\n")
h.pci("pci0000:c0", "0000:c0:01.1", 0x1022, 0x14AB, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:c0:01.1", "0000:c1:00.0", 0x15B3, 0x101B, 0x020000, "mlx5_core")
h.gpu_nodes("0000:41:00.0", 0, 128)
h.netdev("0000:c1:00.0", "ens1f0np0", 6, 32)
h.group(3, "identity", "0000:40:01.1")
h.group(4, "identity", "0000:41:00.0")
h.group(20, "identity", "0000:c0:01.1")
h.group(21, "identity", "0000:c1:00.0")
h.kernel("6.12.0-knod-v3", "BOOT_IMAGE=/vmlinuz-6.12.0-knod-v3 ro iommu=pt amd_iommu=on amdgpu.knod_enable=1",
         ["CONFIG_PCI_P2PDMA=y", "CONFIG_DMABUF_MOVE_NOTIFY=y", "CONFIG_NET_DEVMEM=y"])
h.rocm("6.3.0-39")

# --- a VM: virtio NIC, no IOMMU, no GPU, no kernel config -----------------------------------
h = Host("no-iommu")
h.pci("pci0000:00", "0000:00:03.0", 0x1AF4, 0x1041, 0x020000, "virtio-pci")
h.netdev("0000:00:03.0", "eth0", 2, 2, driver="virtio_net", under="virtio2")
h.kernel("6.18.44", "console=ttyS0 root=/dev/vda rw")

# --- iommu.passthrough=1; a NIC behind a switch, the GPU on another root port ---------------
h = Host("passthrough-switch")
h.pci("pci0000:00", "0000:00:01.0", 0x8086, 0x7A38, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:00:01.0", "0000:01:00.0", 0x10B5, 0x8747, BRIDGE, "pcieport")  # upstream, no ACS
h.pci("0000:01:00.0", "0000:02:08.0", 0x10B5, 0x8747, BRIDGE, "pcieport", ACS_ON)
h.pci("0000:02:08.0", "0000:03:00.0", 0x8086, 0x1533, 0x020000, "igb")
h.pci("pci0000:00", "0000:00:02.0", 0x8086, 0x7A3A, BRIDGE, "pcieport", 0x000D, acs_cap=0x000F)
h.pci("0000:00:02.0", "0000:04:00.0", 0x1002, 0x7448, 0x030000, "amdgpu",
      mem_info_vram_total="51522830336\n")
h.gpu_nodes("0000:04:00.0", 0, 128)
h.netdev("0000:03:00.0", "enp3s0", 2, 1)
for n, bdf in enumerate(["0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:03:00.0",
                         "0000:00:02.0", "0000:04:00.0"]):
    h.group(n, "identity", bdf)
h.kernel("6.12.117+deb12-amd64", "console=ttyS0 intel_iommu=on iommu.passthrough=1",
         ["CONFIG_PCI_P2PDMA=y", "CONFIG_DMABUF_MOVE_NOTIFY=y"])
h.rocm("6.2.1-112")
