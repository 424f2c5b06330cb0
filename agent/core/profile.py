"""What a healthy node of an instance type looks like (parsed from instance-profiles.yaml by config)."""

from __future__ import annotations

from dataclasses import dataclass

# Worst acceptable GPU-to-NIC path, best first (nvidia-smi topo -m legend).
TOPO_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class InstanceProfile:
    instance_type: str
    gpu_count: int
    gpu_model: str | None = None  # substring of the product name, e.g. "H100"
    efa_count: int = 0
    nvlink: bool = False
    nvswitch: bool = False
    nvlink_links_per_gpu: int | None = None
    nic_affinity: str | None = None  # worst acceptable GPU→nearest-NIC path, one of TOPO_LEVELS
    pcie_width: int | None = None  # healthy link width where the platform wires GPUs narrower than max
    connectx_count: int = 0  # ConnectX RDMA ports (InfiniBand or RoCE) of the GPU fabric; 0: not checked
    connectx_rate_gbps: int | None = None  # their healthy active rate, e.g. 400 (NDR / 400GbE)
    nvswitch_count: int = 0  # NVSwitches on the PCI bus (HGX A100: 6, HGX H100/H200: 4); 0: not checked
    numa_nodes: int | None = None  # NUMA nodes a healthy node shows online
    nvlink_link_gbps: float | None = None  # each active NVLink's speed as nvidia-smi nvlink -s prints it
