"""The reason vocabulary of an unhealthy remediation condition: the fault class and the action.

A repair engine that maps a condition's reason to an action (an EKS managed node group's
nodeRepairConfigOverrides: condition + reason → Replace | Reboot | NoAction; Karpenter's reason-aware
repair policies, in review) needs a reason that says what broke and what fixes it. Ours is
`GPUHealthcheck<FaultClass><Action>` ("GPUHealthcheckXidReboot"): the fault class from the worst
finding's rule (FAULT_CLASSES, the longest rule prefix wins), the action from its recommendation
(ACTIONS: reset the GPU, reboot, replace). With `reasonStyle: eks` on a remediation condition, a
finding the EKS node monitoring agent also names gets that agent's reason
(aws/eks-node-monitoring-agent pkg/reasons/reasons.yaml @029740fc, AcceleratedHardwareReady), so
overrides written for that agent work unchanged; any other finding keeps ours.

docs/clusters/node-repair.md renders these two tables ("The reason vocabulary");
tests/test_remediation_reasons.py holds them equal. Healthy-side and hold reasons are
core/remediation_types.py's RemediationReason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from agent.core.actions import Action

# An unhealthy remediation condition's reason as this table makes it ("GPUHealthcheckXidReboot", or the
# EKS agent's "NvidiaXID79Error"): its own type, so that no other vocabulary's word passes for one.
FaultReason = NewType("FaultReason", str)

REASON_PREFIX = "GPUHealthcheck"
STYLE_OURS, STYLE_EKS = "gpu-healthcheck", "eks"
REASON_STYLES = (STYLE_OURS, STYLE_EKS)


@dataclass(frozen=True)
class FaultRow:
    """Findings whose rule is `rule` or starts with `rule.`: their fault class, and the EKS node
    monitoring agent's reason for them ("" = none; `{code}` = the Xid number of the finding)."""

    rule: str
    fault: str
    eks: str = ""


# The one table: a rule prefix → (fault class, EKS reason). Every rule of every check has a row
# (tests/test_remediation_reasons.py), so a new check names its class here.
FAULT_CLASSES: tuple[FaultRow, ...] = (
    FaultRow("gpu.responsive", "GPULost"),
    FaultRow("gpu.count", "GPULost", "NvidiaDeviceCountMismatch"),
    FaultRow("gpu.allocatable", "GPULost"),
    FaultRow("pci.inventory", "GPULost"),
    FaultRow("topology.gpu-count", "GPULost", "NvidiaDeviceCountMismatch"),
    FaultRow("gpu.ecc", "Memory"),
    FaultRow("gpu.ecc.dram-uncorrectable", "Memory", "NvidiaDoubleBitError"),
    FaultRow("gpu.retired-pages", "Memory", "NvidiaPageRetirement"),
    FaultRow("gpu.retired-pages.double-bit", "Memory", "NvidiaDoubleBitError"),
    FaultRow("gpu.row-remap", "Memory"),
    FaultRow("trend.memory", "Memory"),
    FaultRow("gpu.recovery-action", "DriverRecovery"),
    FaultRow("xid", "Xid", "NvidiaXID{code}Error"),
    FaultRow("xid.sxid", "Fabric"),
    FaultRow("xid.pcie-aer", "PCIe", "NvidiaPCIeError"),
    FaultRow("gpu.driver-taints", "GPULost"),  # NVIDIA's DRA driver's taints (checks/dra_taints.py)
    FaultRow("gpu.driver-taints.xid", "Xid"),
    FaultRow("gpu.fabric", "Fabric", "NvidiaFabricError"),
    FaultRow("nvlink", "NVLink", "NvidiaNVLinkError"),
    FaultRow("nvlink-speed", "NVLink", "NvidiaNVLinkError"),
    FaultRow("nvlink-errors", "NVLink", "NvidiaNVLinkError"),
    FaultRow("trend.nvlink", "NVLink", "NvidiaNVLinkError"),
    FaultRow("topology", "Topology"),
    FaultRow("gpu.pcie", "PCIe", "NvidiaPCIeError"),
    FaultRow("pci.link", "PCIe", "NvidiaPCIeError"),
    FaultRow("pci.aer", "PCIe", "NvidiaPCIeError"),
    FaultRow("trend.pcie", "PCIe", "NvidiaPCIeError"),
    FaultRow("gpu.throttle", "Thermal", "NvidiaThermalError"),
    FaultRow("gpu.stalled", "Stall"),  # monitor at most: named only for completeness
    FaultRow("gpu.peers", "Performance"),  # the odd GPU out, monitor at most (core/peers.py)
    FaultRow("gpu.throttle.hw-power-brake", "Thermal", "NvidiaPowerError"),
    FaultRow("trend.thermal", "Thermal", "NvidiaThermalError"),
    FaultRow("host.power-cap", "Thermal", "NvidiaPowerError"),
    FaultRow("gpu.persistence", "Host"),
    FaultRow("host", "Host"),
    FaultRow("efa", "Network"),
    FaultRow("connectx", "Network"),
    FaultRow("dcgm-diag", "Diagnostic", "DCGMDiagnosticFailure"),
    FaultRow("dcgm-diag.peers", "Performance"),  # monitor at most: a diag figure below its siblings'
    FaultRow("dcgm-health", "DCGMHealth"),
    FaultRow("sdc", "DataCorruption"),  # a GPU's output differs from its siblings' (checks/sdc.py)
)
OTHER = "Other"  # a rule no row names (a check newer than this table): never in a shipped build

# The worst finding's next step → the action its reason names (and what an EKS managed node group,
# which cannot reset a GPU, is best told in nodeRepairConfigOverrides).
ACTIONS: dict[Action, str] = {
    Action.WATCH: "ResetGPU",
    Action.RESTART_APP: "ResetGPU",
    Action.RESET_GPU: "ResetGPU",
    Action.RESTART_FABRIC_MANAGER: "Reboot",
    Action.UPDATE_SOFTWARE: "Reboot",
    Action.REBOOT: "Reboot",
    Action.RESEAT: "Replace",
    Action.PLAN_SERVICE: "Replace",
    Action.SERVICE: "Replace",
}
MANAGED_NODE_GROUP_ACTION = {"ResetGPU": "Reboot", "Reboot": "Reboot", "Replace": "Replace"}


def fault_row(rule: str) -> FaultRow | None:
    """The row with the longest prefix of *rule* (a rule name, e.g. "gpu.ecc.dram-uncorrectable")."""
    best: FaultRow | None = None
    for row in FAULT_CLASSES:
        if (rule == row.rule or rule.startswith(row.rule + ".")) and (
            best is None or len(row.rule) > len(best.rule)
        ):
            best = row
    return best


def fault_class(rule: str) -> str:
    row = fault_row(rule)
    return row.fault if row is not None else OTHER


def reason_for(rule: str, key: str, action: Action, style: str = STYLE_OURS) -> FaultReason:
    """The reason of an unhealthy remediation condition whose worst finding has *rule*, *key* (an
    Xid's "xid/79/…") and next step *action*, in *style*."""
    row = fault_row(rule)
    if style == STYLE_EKS and row is not None and row.eks:
        parts = key.split("/")
        code = parts[1] if len(parts) > 1 and parts[0] == "xid" and parts[1].isdigit() else ""
        if "{code}" not in row.eks or code:
            return FaultReason(row.eks.replace("{code}", code))
    return FaultReason(f"{REASON_PREFIX}{row.fault if row is not None else OTHER}{ACTIONS[action]}")


def is_eks_reason(reason: str) -> bool:
    """Whether *reason* is one of the EKS agent's names this table writes (NvidiaXID79Error, …)."""
    for row in FAULT_CLASSES:
        head, code, tail = row.eks.partition("{code}")
        if not row.eks:
            continue
        if not code and reason == row.eks:
            return True
        middle = reason[len(head) : len(reason) - len(tail)]
        if code and reason.startswith(head) and reason.endswith(tail) and middle.isdigit():
            return True
    return False


def our_reasons() -> tuple[FaultReason, ...]:
    """Every reason of our style, in table order: a condition of ours carries one of them (the
    admission fence lets the agent remove a condition no longer configured only with one of ours)."""
    faults = dict.fromkeys([*(r.fault for r in FAULT_CLASSES), OTHER])
    actions = dict.fromkeys(ACTIONS.values())
    return tuple(FaultReason(f"{REASON_PREFIX}{f}{a}") for f in faults for a in actions)


__all__ = [
    "ACTIONS",
    "FAULT_CLASSES",
    "MANAGED_NODE_GROUP_ACTION",
    "OTHER",
    "REASON_STYLES",
    "STYLE_EKS",
    "STYLE_OURS",
    "FaultReason",
    "FaultRow",
    "fault_class",
    "fault_row",
    "is_eks_reason",
    "our_reasons",
    "reason_for",
]
