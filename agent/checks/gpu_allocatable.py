"""gpu.allocatable: what the scheduler can allocate against the GPUs seen: the device plugin's
`nvidia.com/gpu` on the Node, and the devices NVIDIA's DRA driver publishes for this node (core/dra).
A DRA-only node (the GPU Operator without a device plugin) has no such resource, or 0: its driver's
devices are compared. A pure function of NodeFacts and Config; its CHECKS take their place in
gpu.CHECKS."""

from __future__ import annotations

from dataclasses import replace

from agent.checks import CheckSpec, gpu_finding, rule_finding, typed_input
from agent.config import Config
from agent.core.device_scope import DRIVER
from agent.core.dra import DraSlices, PublishedGpu
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.node import NodeObject
from agent.core.pci import short_pci
from agent.core.probed import ProbeError
from agent.core.profile import InstanceProfile
from agent.core.rules import Rule
from agent.core.severity import Severity

ALLOCATABLE_BELOW_VISIBLE = Rule(
    "gpu.allocatable.below-visible",
    Severity.MONITOR,
    "the device plugin advertises fewer GPUs than are visible",
)
# NVIDIA's DRA driver (no device plugin): what it publishes against what NVML/nvidia-smi see. A
# publication fault, not a broken GPU (gpu.count, pci.inventory and gpu.responsive judge those).
DRA_UNPUBLISHED = Rule(
    "gpu.allocatable.dra-unpublished",
    Severity.MONITOR,
    "a visible GPU is missing from the DRA driver's ResourceSlices",
)
DRA_UNSEEN = Rule(
    "gpu.allocatable.dra-unseen",
    Severity.MONITOR,
    "the DRA driver publishes a GPU that NVML/nvidia-smi do not list",
)
DRA_COUNT = Rule(
    "gpu.allocatable.dra-count",
    Severity.MONITOR,
    "the DRA driver publishes other than the instance profile's GPU count (the GPUs unreadable)",
)


NVIDIA_DRA = "NVIDIA's DRA driver"


def check_allocatable(facts: NodeFacts, cfg: Config) -> CheckResult:
    name = "gpu.allocatable"
    node = facts.node if isinstance(facts.node, NodeObject) else None
    plugin = node.plugin_gpus if node is not None else 0
    dra = facts.dra if isinstance(facts.dra, DraSlices) else None
    if plugin == 0 and (dra is None or not dra.devices):
        return _nothing_published(name, facts)
    inv = typed_input(name, facts.gpus, GpuInventory)  # a damaged capture's part could only miscount
    if isinstance(inv, CheckResult):
        gap = inv
        if dra is None or not dra.devices or dra.incomplete or facts.profile is None:
            return gap
        counted = _published_vs_profile(cfg, name, dra, facts.profile)
        return replace(counted, unknown=gap.unknown)
    findings: list[Finding] = []
    notes: list[str] = []
    visible = inv.visible
    if plugin:
        alloc = (node.allocatable_gpus or 0) if node is not None else 0
        if alloc < visible:
            msg = (
                f"the device plugin advertises {alloc} of {visible} visible GPU(s) as allocatable: "
                f"it marked {visible - alloc} GPU(s) unhealthy"
            )
            findings.append(gpu_finding(cfg, name, ALLOCATABLE_BELOW_VISIBLE, msg))
        else:
            notes.append(f"{alloc} GPU(s) allocatable")
    unknown = None
    if dra is not None and dra.devices:
        if dra.incomplete:
            unknown = f"could not compare with {NVIDIA_DRA}'s devices: {dra.incomplete}"
        else:
            found, said = _seen_vs_published(cfg, name, inv, dra)
            findings += found
            notes.append(said)
    return CheckResult(name, findings=tuple(findings), unknown=unknown, note="; ".join(notes))


def _nothing_published(name: str, facts: NodeFacts) -> CheckResult:
    """Neither a device plugin nor the DRA driver publishes a GPU here: why, as unknown when we
    could not look, else skipped. Not a fail: no evidence says the GPUs are not used (and the
    driver's kubelet plugin, which tolerates only nvidia.com/gpu by default, may wait for the
    validating taint to lift before it publishes)."""
    node, dra = facts.node, facts.dra
    for probed in (node, dra):
        if isinstance(probed, ProbeError):
            return CheckResult(name, unknown=f"could not read {probed.source}: {probed.message}")
    if isinstance(dra, DraSlices) and dra.incomplete:
        return CheckResult(name, unknown=f"could not read {NVIDIA_DRA}'s devices: {dra.incomplete}")
    plugin = "no nvidia.com/gpu on the Node" if isinstance(node, NodeObject) else f"{node} (device plugin)"
    driver = (
        f"no {DRIVER} device for this node in its ResourceSlices"
        if isinstance(dra, DraSlices)
        else f"{dra} ({NVIDIA_DRA})"
    )
    return CheckResult(
        name, skipped=f"nothing publishes this node's GPUs to compare with: {plugin}, {driver}"
    )


def _seen_vs_published(
    cfg: Config, name: str, inv: GpuInventory, dra: DraSlices
) -> tuple[list[Finding], str]:
    """Each GPU seen against the driver's devices, and each GPU the driver publishes against the
    GPUs seen (by PCI address, else UUID)."""
    findings: list[Finding] = []
    seen: set[PublishedGpu] = set()
    mig: list[str] = []
    for g in inv.gpus:
        p = dra.published(g.pci_bus_id, g.uuid)
        if p is not None:
            seen.add(p)
        elif g.mig_mode:
            mig.append(g.label)  # MIG on and no MIG device made: nothing to publish, no fault
        else:
            msg = (
                f"{g.label}: {NVIDIA_DRA} does not publish it (no {DRIVER} device with its PCI address "
                f"or UUID {g.uuid or '?'} in this node's ResourceSlices): the scheduler cannot allocate it"
            )
            findings.append(gpu_finding(cfg, name, DRA_UNPUBLISHED, msg, g))
    # Lost or hung: the driver cannot talk to it, gpu.responsive judges it, not this check.
    silent = [(x.pci_bus_id, None) for x in inv.lost] + [(h.pci_bus_id, h.uuid) for h in inv.hung]
    for pci, uuid in silent:
        p = dra.published(pci, uuid)
        if p is not None:
            seen.add(p)
    passthrough: list[str] = []
    for p in dra.gpus():
        if p in seen:
            continue
        if p.passthrough_only:
            passthrough.append(p.label)  # bound to vfio-pci for a VM: NVML does not see it
            continue
        uuid = f" {p.uuid}" if p.uuid else ""
        msg = (
            f"{NVIDIA_DRA} publishes {p.label}{uuid} that NVML/nvidia-smi do not list: "
            "the scheduler may allocate a GPU that is not there"
        )
        key = short_pci(p.pci) if p.pci else p.uuid or p.label
        findings.append(rule_finding(cfg, name, DRA_UNSEEN, msg, (p.label,), key))
    said = f"{NVIDIA_DRA} publishes the {len(seen)} GPU(s) seen"
    if mig:
        said += f"; MIG mode on with no MIG device published: {', '.join(mig)}"
    if passthrough:
        said += f"; passthrough (vfio) only, not seen by NVML: {', '.join(passthrough)}"
    return findings, said


def _published_vs_profile(cfg: Config, name: str, dra: DraSlices, profile: InstanceProfile) -> CheckResult:
    """The GPUs could not be read: the driver's count against the instance profile."""
    published = [p for p in dra.gpus() if not p.passthrough_only]
    if len(published) == profile.gpu_count:
        note = f"{NVIDIA_DRA} publishes {len(published)} GPU(s), as {profile.instance_type} has"
        return CheckResult(name, note=note)
    msg = f"{NVIDIA_DRA} publishes {len(published)} GPU(s), {profile.instance_type} has {profile.gpu_count}"
    return CheckResult(name, findings=(gpu_finding(cfg, name, DRA_COUNT, msg),))


CHECKS = (
    CheckSpec(
        "gpu.allocatable",
        check_allocatable,
        (Input.GPUS, Input.NODE, Input.DRA),
        "gpu",
        (ALLOCATABLE_BELOW_VISIBLE, DRA_UNPUBLISHED, DRA_UNSEEN, DRA_COUNT),
    ),
)
