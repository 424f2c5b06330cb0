"""Build the bundled p5.48xlarge demo snapshots from real recorded outputs in tests/fixtures.

Run from the repository root: `python examples/build_demo_snapshots.py`. The output is committed;
this script documents exactly how each derived file was made (see examples/snapshots/SOURCE.md).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = ROOT / "examples" / "snapshots"

NVSMI = FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"
TOPO = FIX / "nvidia-smi-topo" / "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full.txt"
NVLINK_ONE = FIX / "nvlink" / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt"
BOOT_LOG = FIX / "kernel-log" / "gpud-h100-boot-dmesg-decode-iso-no-xid.log"
XID79 = FIX / "xid-kernel-log" / "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034-BLOCKQUOTE.txt"
EFA_PROM = FIX / "efa" / "awsome-p5-32efa-node-exporter-amazonefa-tx-pkts.prom"

LOST_PCI = "00000000:97:00.0"  # GPU 4 of the real 8xH100 recording


def nvlink_for_all(nvsmi: str) -> str:
    """The real single-H100 `nvlink -s` block, repeated for each GPU of the 8xH100 recording."""
    block = NVLINK_ONE.read_text().splitlines()
    links = [line for line in block[1:] if line.strip()]
    uuids = re.findall(r"GPU UUID\s+:\s+(\S+)", nvsmi)
    name = re.search(r"Product Name\s+:\s+(.+)", nvsmi)
    assert name is not None
    out = []
    for i, uuid in enumerate(uuids):
        out.append(f"GPU {i}: {name.group(1).strip()} (UUID: {uuid})")
        out += links
    return "\n".join(out) + "\n"


def efa_tree(dest: Path) -> None:
    """32 EFA devices named as on a real p5 (from the node_exporter recording), all ports ACTIVE."""
    names = sorted(set(re.findall(r'device="(rdmap\d+s0)"', EFA_PROM.read_text())), key=lambda n: int(n[5:-2]))
    for n in names:
        bus = int(n[5:-2])
        pci = f"0000:{bus:02x}:00.0"
        dev = dest / "class" / "infiniband" / n
        port = dev / "ports" / "1"
        (port / "hw_counters").mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
        (port / "link_layer").write_text("Unspecified\n")
        for counter in ("rx_drops", "retrans_timeout_events", "unresponsive_remote_events",
                        "impaired_remote_conn_events", "tx_pkts", "rx_pkts"):
            (port / "hw_counters" / counter).write_text("0\n")
        (dev / "hca_type").write_text("efa\n")
        pci_dir = dest / "bus" / "pci" / "devices" / pci
        pci_dir.mkdir(parents=True)
        (pci_dir / "vendor").write_text("0x1d0f\n")
        (pci_dir / "device").write_text("0xefa1\n")
        (pci_dir / "uevent").write_text(f"DRIVER=efa\nPCI_SLOT_NAME={pci}\n")
        (dev / "device").symlink_to(Path("..", "..", "..", "bus", "pci", "devices", pci))


def node_json(allocatable: int | None) -> str:
    """The Node; allocatable None: a DRA-only node (no device plugin, so no nvidia.com/gpu)."""
    gpus = {} if allocatable is None else {"nvidia.com/gpu": str(allocatable)}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "ip-10-1-2-3.ec2.internal",
            "labels": {
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "nvidia.com/gpu.present": "true",
            },
        },
        "status": {
            "capacity": {"nvidia.com/gpu": "8"} if gpus else {},
            "allocatable": gpus,
            "nodeInfo": {"bootID": "3f0c1c56-2f4a-4b8e-9a7d-6c1e2b9d0a11"},
        },
    }
    return json.dumps(node, indent=2) + "\n"


def resource_slices(nvsmi: str) -> str:
    """`kubectl get resourceslices -o json` for this node: one slice as NVIDIA's DRA driver
    (dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin, deviceinfo.go GpuInfo.GetDevice) publishes full
    GPUs, every attribute from the recording (versions as its semver parse prints them); no
    pcieRoot: it reads sysfs the recording does not hold, and the driver leaves it out then."""
    node = "ip-10-1-2-3.ec2.internal"
    driver = re.search(r"Driver Version\s+:\s+(\S+)", nvsmi)
    cuda = re.search(r"CUDA Version\s+:\s+(\S+)", nvsmi)
    assert driver is not None and cuda is not None

    def semver(text: str) -> str:
        parts = [str(int(p)) for p in text.split(".")]
        return ".".join((parts + ["0", "0"])[:3])

    devices = []
    for block in re.split(r"\n(?=GPU [0-9a-fA-F]{8}:)", nvsmi)[1:]:
        def field(label: str, text: str = block) -> str:
            m = re.search(rf"^\s+{re.escape(label)}\s+:\s+(.+?)\s*$", text, flags=re.M)
            assert m is not None, label
            return m.group(1)

        memory = re.search(r"FB Memory Usage\s+Total\s+:\s+(\d+) MiB", block)
        assert memory is not None
        bus = field("Bus Id").lower()
        devices.append(
            {
                "name": f"gpu-{field('Minor Number')}",
                "attributes": {
                    "architecture": {"string": field("Product Architecture")},
                    "brand": {"string": field("Product Brand")},
                    "cudaComputeCapability": {"version": "9.0.0"},  # Hopper
                    "cudaDriverVersion": {"version": semver(cuda.group(1))},
                    "driverVersion": {"version": semver(driver.group(1))},
                    "productName": {"string": field("Product Name")},
                    "resource.kubernetes.io/pciBusID": {"string": bus[4:]},
                    "type": {"string": "gpu"},
                    "uuid": {"string": field("GPU UUID")},
                },
                "capacity": {"memory": {"value": f"{memory.group(1)}Mi"}},
            }
        )
    doc = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "generateName": f"{node}-gpu.nvidia.com-",
                    "name": f"{node}-gpu.nvidia.com-x7k2q",
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "controller": True}],
                },
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def xid79_lines() -> str:
    """The real Xid 79 block (blockquote stripped), its PCI id moved onto GPU 4 of the H100 recording."""
    lines = []
    for raw in XID79.read_text().splitlines():
        line = raw.removeprefix(">").strip()
        if "NVRM" not in line:
            continue
        line = line.replace("0000:91:00", "0000:97:00")
        # dmesg --decode iso format, as the boot log it is appended to.
        msg = line.split("] ", 1)[1]
        lines.append(f"kern  :err   : 2025-01-21T03:12:44,118231+00:00 {msg}")
    return "\n".join(lines) + "\n"


def calm_gpu2(nvsmi: str) -> str:
    """The recording caught GPU 2 (00000000:75:00.0) under load with HW power brake slowdown active,
    which the throttle check rightly reports (monitor). A healthy demo node should not: clear it."""
    start = nvsmi.index("GPU 00000000:75:00.0")
    end = nvsmi.index("\nGPU 00000000:", start + 1)
    block = re.sub(r"(HW Power Brake Slowdown\s+: )Active", r"\1Not Active", nvsmi[start:end])
    return nvsmi[:start] + block + nvsmi[end:]


def lose_gpu(nvsmi: str) -> str:
    """nvidia-smi -q after the GPU fell off the bus: its block is replaced by the driver's error line."""
    start = nvsmi.index(f"GPU {LOST_PCI}")
    end = nvsmi.index("\nGPU 00000000:", start + 1) + 1
    lost = f"Unable to determine the device handle for GPU{LOST_PCI[4:]}: Unknown Error\n"
    return nvsmi[:start] + lost + nvsmi[end:]


def build(name: str, faulty: bool, dra: bool = False) -> None:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    nvsmi = calm_gpu2(NVSMI.read_text())
    (d / "instance-type").write_text("p5.48xlarge\n")
    (d / "boot_id").write_text("3f0c1c56-2f4a-4b8e-9a7d-6c1e2b9d0a11\n")
    (d / "nvidia-smi-q.txt").write_text(lose_gpu(nvsmi) if faulty else nvsmi)
    shutil.copy(TOPO, d / "nvidia-smi-topo-m.txt")
    (d / "nvidia-smi-nvlink-s.txt").write_text(nvlink_for_all(nvsmi))
    log = BOOT_LOG.read_text()
    if not log.endswith("\n"):
        log += "\n"
    (d / "kmsg.log").write_text(log + (xid79_lines() if faulty else ""))
    efa_tree(d / "sys")
    (d / "node.json").write_text(node_json(None if dra else 7 if faulty else 8))
    if dra:  # the GPU Operator's DRA-only mode: no device plugin, the driver's ResourceSlice
        (d / "resourceslices.json").write_text(resource_slices(nvsmi))


if __name__ == "__main__":
    build("p5.48xlarge-healthy", faulty=False)
    build("p5.48xlarge-xid79", faulty=True)
    build("p5.48xlarge-dra", faulty=False, dra=True)
    print(f"wrote {OUT}")
