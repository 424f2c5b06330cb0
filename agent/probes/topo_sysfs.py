"""Where PCI functions sit, from sysfs, as `nvidia-smi topo -m` names the path between two of them.

The topology tier read through NVML (agent.probes.nvml_topo) takes the GPU-to-NIC and NIC-to-NIC
cells from here: NVML knows GPUs only. The codes follow the legend nvidia-smi prints:
  SYS  the path crosses the interconnect between NUMA nodes (different host bridges, different nodes)
  NODE different host bridges within one NUMA node (or a node the kernel does not know: -1)
  PHB  through a host bridge (one root complex, different root ports)
  PXB  several PCIe bridges, without the host bridge
  PIX  at most a single PCIe bridge: each device at most one bridge (a switch's downstream port,
       or the root port itself) below the bridge they share
The NICs are the RDMA devices of /sys/class/infiniband (nvidia-smi's NIC Legend lists the same),
named NIC0.. in the order of their names (mlx5_2 before mlx5_10).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.core.text import id_ranges

_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciPlace:
    """A PCI function's host bridge (pci0000:17), the bridges above it from the root port down,
    and its NUMA node (None: the kernel says -1)."""

    root: str
    bridges: tuple[str, ...]
    numa: int | None


def sysfs_bdf(bus_id: str) -> str:
    """NVML's "00000000:53:00.0" as sysfs names it: "0000:53:00.0"."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def place(devices_dir: Path, bdf: str) -> PciPlace | None:
    """Where /sys/bus/pci/devices/<bdf> sits; None when it is not there or not under a host bridge."""
    try:
        parts = Path(os.path.realpath(devices_dir / bdf)).parts
        raw = (devices_dir / bdf / "numa_node").read_text().strip()
    except OSError:
        return None
    roots = [i for i, p in enumerate(parts) if _ROOT.match(p)]
    if not roots:
        return None
    chain = [p for p in parts[roots[-1] + 1 :] if _BDF.match(p)]
    try:
        numa: int | None = int(raw)
    except ValueError:
        numa = None
    return PciPlace(parts[roots[-1]], tuple(chain[:-1]), numa if numa is not None and numa >= 0 else None)


def level(a: PciPlace, b: PciPlace) -> str:
    """The topo -m code of the path between two functions (see the module's docstring)."""
    if a.root != b.root:
        return "SYS" if a.numa is not None and b.numa is not None and a.numa != b.numa else "NODE"
    shared = 0
    for x, y in zip(a.bridges, b.bridges, strict=False):
        if x != y:
            break
        shared += 1
    if shared == 0:
        return "PHB"
    return "PIX" if len(a.bridges) - shared <= 1 and len(b.bridges) - shared <= 1 else "PXB"


def _natural(name: str) -> list[int | str]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def rdma_nics(sys_root: Path) -> list[tuple[str, str]]:
    """(name, BDF) of each RDMA device with a PCI function, in name order; none without the class."""
    class_dir = sys_root / "class" / "infiniband"
    try:
        names = sorted(os.listdir(class_dir), key=_natural)
    except OSError:
        return []
    out = []
    for name in names:
        bdf = os.path.basename(os.path.realpath(class_dir / name / "device"))
        if _BDF.match(bdf):
            out.append((name, bdf))
    return out


def cpu_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] → "0-2,5", as nvidia-smi prints CPU and NUMA affinity."""
    return id_ranges(sorted(ids))
