"""NodeFacts: everything the probes read about one node, the single input of every check; Input:
the names of the inputs it holds (what a check reads, what a tier refreshes, what `--only` probes).
Each input is defined once, in agent/probes/inputs.py (its type, readers, tier, previous read): the
other layers read that spec, and tests/test_inputs.py holds these fields to it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.core.dcgm_report import DiagReport, HealthReport
from agent.core.dra import DraSlices
from agent.core.gpu import GpuInventory
from agent.core.gpu_stall import GpuActivity
from agent.core.host import HostInfo
from agent.core.kernel import KernelXids
from agent.core.node import NodeObject
from agent.core.nvlink import NvlinkErrorSample, NvlinkReport
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, Probed
from agent.core.profile import InstanceProfile
from agent.core.rdma import RdmaSample
from agent.core.sdc_report import SdcReport
from agent.core.topo import TopoMatrix
from agent.core.trend_history import TrendHistory


class Input(str, enum.Enum):
    """One input of the checks: each names the NodeFacts field that holds it."""

    GPUS = "gpus"
    TOPO = "topo"
    NVLINK = "nvlink"
    KERNEL = "kernel"
    RDMA = "rdma"
    NODE = "node"
    DCGM_DIAG = "dcgm_diag"
    DCGM_HEALTH = "dcgm_health"
    PCI = "pci"
    HOST = "host"
    NVLINK_ERRORS = "nvlink_errors"
    DRA = "dra"
    SDC = "sdc"  # the SDC probe's last completed run (core/sdc_report.py)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class NodeFacts:
    """An input that was not read keeps its default: NotCaptured."""

    instance_type: str | None = None
    instance_type_source: str = ""  # "--instance-type", "config", "node label", "snapshot file"
    profile: InstanceProfile | None = None
    boot_id: str | None = None
    gpus: Probed[GpuInventory] = NotCaptured("nvidia-smi")
    gpus_previous: GpuInventory | None = None  # the agent's previous read, for the ECC rate
    topo: Probed[TopoMatrix] = NotCaptured("nvidia-smi topo -m")
    nvlink: Probed[NvlinkReport] = NotCaptured("nvidia-smi nvlink -s")
    kernel: Probed[KernelXids] = NotCaptured("kernel log")
    rdma: Probed[RdmaSample] = NotCaptured("sysfs infiniband")
    rdma_previous: RdmaSample | None = None  # the agent's previous read, for counter rates
    node: Probed[NodeObject] = NotCaptured("node.json")
    dra: Probed[DraSlices] = NotCaptured("resourceslices.json")  # NVIDIA's DRA driver's devices here
    dcgm_diag: Probed[DiagReport] = NotCaptured("dcgm-diag.json")
    dcgm_health: Probed[HealthReport] = NotCaptured("dcgm health")
    sdc: Probed[SdcReport] = NotCaptured("sdc-probe.json")
    pci: Probed[PciSample] = NotCaptured("sysfs pci")
    pci_previous: PciSample | None = None  # the agent's previous read, for AER counter rates
    host: Probed[HostInfo] = NotCaptured("sysfs cpu/node")
    nvlink_errors: Probed[NvlinkErrorSample] = NotCaptured("NVLink error counters")
    nvlink_errors_previous: NvlinkErrorSample | None = None  # the previous read, for rates
    trends: TrendHistory = (
        TrendHistory()
    )  # the kept reads (core/trend_history.py), this cycle's included when due
    activity: GpuActivity = GpuActivity()  # the agent's recent samples per GPU (core/gpu_stall.py)
