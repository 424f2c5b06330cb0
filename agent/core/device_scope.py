"""Is this fault confined to one GPU? (DESIGN.md §3.7: per-GPU isolation with DRA device taints.)

A node taint takes every GPU of the node out of service; a DRA device taint only the bad one. That is
right only for a fault that is the GPU's own: an Xid that names its PCI address, its ECC or
row-remap/retired-page counters, its handle lost, its own NVML calls hanging. A fault of the node's
fabric (NVSwitch SXid), of a PCIe root port (AER), of the host, one that names no GPU, or one that
hits most GPUs at once stays node-wide: a device taint there would leave the node taking work it
cannot do.

And where a GPU is published: NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu,
cmd/gpu-kubelet-plugin) publishes the node's GPUs in ResourceSlices of driver `gpu.nvidia.com`, pool
= the node's name, devices `gpu-<minor>` with the standard attribute `resource.kubernetes.io/pciBusID`
("0000:53:00.0") and `uuid`. A GPU is found there by its PCI address, else by its UUID.

Pure functions; the engine asks `confined_scope`, the device taint writer `devices_for`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.pci import normalize_pci
from agent.core.severity import Severity, Status

DRIVER = "gpu.nvidia.com"  # the DRA driver's name (cmd/gpu-kubelet-plugin/main.go DriverName)
PCI_ATTRIBUTE = "resource.kubernetes.io/pciBusID"  # k8s.io/dynamic-resource-allocation/deviceattribute
UUID_ATTRIBUTE = "uuid"
ISOLATION_NODE, ISOLATION_GPU, ISOLATION_AUTO = "node", "gpu", "auto"
ISOLATIONS = (ISOLATION_NODE, ISOLATION_GPU, ISOLATION_AUTO)
DEFAULT_ISOLATION = ISOLATION_NODE

# The rules whose finding is one GPU's own, when it names exactly one GPU's PCI address: an Xid by
# its number (`xid.79`; not `xid.sxid`, the NVSwitch fabric, nor `xid.pcie-aer`, a PCIe port), a
# GPU's own counters or its lost handle. DCGM, NVLink, topology, host: node-wide.
# A GPU whose own NVML calls hang too (gpu.responsive.timeout; a whole read that hung names no GPU).
PER_GPU_RULES = (
    "gpu.ecc.",
    "gpu.row-remap.",
    "gpu.retired-pages.",
    "gpu.responsive.lost",
    "gpu.responsive.timeout",
    "gpu.driver-taints.",  # NVIDIA's DRA driver's taint on that GPU's device (checks/dra_taints.py)
    "sdc.",  # the GPU whose output differs from its siblings' in the SDC probe (checks/sdc.py)
)
# The warnings (checks/trends.py) that are one GPU's own: its memory's and its thermal/clock trends.
PER_GPU_WARN_RULES = (*PER_GPU_RULES, "trend.memory.", "trend.thermal.")
XID_RULE = re.compile(r"xid\.\d+$")
PCI = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(\.[0-7])?\b")


@dataclass(frozen=True)
class Scope:
    """Where the failing findings (at the taint's minimum severity) lie: node-wide, or on these GPUs
    (normalised PCI addresses, sorted)."""

    node_wide: bool
    gpus: tuple[str, ...] = ()
    why: str = ""  # node-wide: the first finding that made it so

    def as_text(self) -> str:
        return "node" if self.node_wide else "gpu:" + ",".join(self.gpus)


def finding_pcis(finding: Finding) -> set[str]:
    """The normalised PCI addresses a finding's key and entities name."""
    texts = (finding.key, *finding.entities)
    return {normalize_pci(m.group(1) + (m.group(2) or ".0")) for t in texts for m in PCI.finditer(t)}


def confined_scope(
    results: Iterable[CheckResult], gpus: Any, min_severity: Severity, node_at: int = 0
) -> Scope | None:
    """The scope of the failing findings at *min_severity* or above; None when there is none.

    Node-wide when any of them is not a per-GPU rule, names no GPU of the inventory or more than one,
    when the GPUs hit are more than half of the node's (a node that lost most GPUs is a node fault),
    or when they are *node_at* or more (node.isolation's nodeAtGpus; 0: off).
    """
    scope = _scope(results, gpus, Status.FAIL, lambda f: f.severity >= min_severity, PER_GPU_RULES)
    if scope is not None and not scope.node_wide and node_at and len(scope.gpus) >= node_at:
        return Scope(True, why=f"{len(scope.gpus)} GPUs fail at once (node.isolationNodeAtGpus: {node_at})")
    return scope


def warn_scope(results: Iterable[CheckResult], gpus: Any) -> Scope | None:
    """The scope of the warnings (`monitor` findings of the checks that warn); None when there is none.

    What `confined_scope` is to a taint, this is to an early warning: a GPU's own trend (its memory,
    its temperature and clock) or a GPU's own counter at `monitor` shows on that GPU's DRA device as
    a taint of effect None, which moves no pod. NVLink and PCIe trends involve the link's other end:
    node-wide, shown on the Node only, as before."""
    return _scope(results, gpus, Status.WARN, lambda f: f.severity == Severity.MONITOR, PER_GPU_WARN_RULES)


def _scope(
    results: Iterable[CheckResult],
    gpus: Any,
    status: Status,
    counts: Callable[[Finding], bool],
    per_gpu: tuple[str, ...],
) -> Scope | None:
    inv = gpus if isinstance(gpus, GpuInventory) else None
    known = {normalize_pci(g.pci_bus_id) for g in inv.gpus} if inv else set()
    known |= set(inv.silent) if inv else set()
    hit: set[str] = set()
    seen = False
    for res in results:
        if res.status is not status:
            continue
        for f in res.findings:
            if not counts(f):
                continue
            seen = True
            pcis = finding_pcis(f) & known
            if not (f.rule.startswith(per_gpu) or XID_RULE.match(f.rule)):
                return Scope(True, why=f"{f.key or f.rule} is not confined to one GPU")
            if len(pcis) != 1:
                return Scope(True, why=f"{f.key or f.rule} names no single GPU of the inventory")
            hit |= pcis
    if not seen:
        return None
    if 2 * len(hit) > len(known):
        return Scope(True, why=f"{len(hit)} of {len(known)} GPUs fail at once")
    return Scope(False, tuple(sorted(hit)))


@dataclass(frozen=True)
class Device:
    """One device of the DRA driver's ResourceSlices on this node."""

    pool: str
    name: str
    pci: str = ""  # normalised
    uuid: str = ""


def slice_devices(slices: Iterable[Mapping[str, Any]], node_name: str) -> list[Device]:
    """The devices of driver gpu.nvidia.com on *node_name* in the ResourceSlices (API JSON, v1)."""
    out: list[Device] = []
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER or spec.get("nodeName") != node_name:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        for d in spec.get("devices") or ():
            attrs = d.get("attributes") or {}
            pci = str((attrs.get(PCI_ATTRIBUTE) or {}).get("string") or "")
            uuid = str((attrs.get(UUID_ATTRIBUTE) or {}).get("string") or "")
            out.append(Device(pool, str(d.get("name") or ""), normalize_pci(pci) if pci else "", uuid))
    return out


def devices_for(
    gpus: Sequence[str], devices: Sequence[Device], uuids: Mapping[str, str]
) -> list[Device] | None:
    """The slice device of each GPU (PCI address; *uuids*: PCI → UUID from the inventory), matched
    by the driver's pciBusID attribute, else its uuid; None when any GPU is not found (then it cannot
    be isolated alone and the node is tainted)."""
    by_pci = {d.pci: d for d in devices if d.pci}
    by_uuid = {d.uuid: d for d in devices if d.uuid}
    out = []
    for pci in gpus:
        d = by_pci.get(pci) or by_uuid.get(uuids.get(pci, "") or "\0")
        if d is None:
            return None
        out.append(d)
    return out


def rule_name(node_name: str, device: Device, prefix: str) -> str:
    """The DeviceTaintRule's name: `<node>.<device>.<hash>`, for people to read. Nothing trusts it:
    the agent and the admission fence know our rules by their label and their owner, the Node."""
    digest = hashlib.sha256(f"{prefix}|{device.pool}|{device.name}".encode()).hexdigest()[:8]
    tail = f".{device.name}.{digest}"
    return node_name[: max(0, 253 - len(tail))].rstrip(".-") + tail


__all__ = [
    "DEFAULT_ISOLATION",
    "DRIVER",
    "ISOLATIONS",
    "ISOLATION_AUTO",
    "ISOLATION_GPU",
    "ISOLATION_NODE",
    "PCI_ATTRIBUTE",
    "PER_GPU_RULES",
    "PER_GPU_WARN_RULES",
    "Device",
    "Scope",
    "confined_scope",
    "devices_for",
    "finding_pcis",
    "rule_name",
    "slice_devices",
    "warn_scope",
]
