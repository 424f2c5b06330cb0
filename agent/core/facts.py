"""NodeFacts: everything the probes read about one node, the single input of every check."""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.dcgm_report import DiagReport, HealthReport
from agent.core.model import GpuInventory, KernelLog, NodeObject, NvlinkReport, RdmaSample, TopoMatrix
from agent.core.probed import NotCaptured, Probed
from agent.core.profile import InstanceProfile


@dataclass(frozen=True)
class NodeFacts:
    instance_type: str | None = None
    instance_type_source: str = ""  # "--instance-type", "config", "node label", "snapshot file"
    profile: InstanceProfile | None = None
    boot_id: str | None = None
    gpus: Probed[GpuInventory] = NotCaptured("nvidia-smi")
    topo: Probed[TopoMatrix] = NotCaptured("nvidia-smi topo -m")
    nvlink: Probed[NvlinkReport] = NotCaptured("nvidia-smi nvlink -s")
    kernel: Probed[KernelLog] = NotCaptured("kernel log")
    rdma: Probed[RdmaSample] = NotCaptured("sysfs infiniband")
    rdma_previous: RdmaSample | None = None  # the agent's previous read, for counter rates
    node: Probed[NodeObject] = NotCaptured("node.json")
    dcgm_diag: Probed[DiagReport] = NotCaptured("dcgm-diag.json")
    dcgm_health: Probed[HealthReport] = NotCaptured("dcgm health")
