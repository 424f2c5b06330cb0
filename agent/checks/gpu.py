"""GPU checks on the NVML / nvidia-smi inventory. Each is a pure function of NodeFacts and Config.
The memory-health family (ECC, row remapping, retired pages) is in gpu_memory; CHECKS lists both,
in report order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from agent.checks import CheckSpec, gpu_finding, gpu_memory, partial_input, per_gpu, rule_finding, typed_input
from agent.config import Config
from agent.core.actions import Action
from agent.core.device_scope import DRIVER
from agent.core.dra import DraSlices, PublishedGpu
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.node import NodeObject
from agent.core.pci import short_pci
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.profile import InstanceProfile
from agent.core.rules import Rule
from agent.core.severity import Severity

COUNT_MISMATCH = Rule("gpu.count.mismatch", Severity.ISOLATE, "visible GPUs differ from the instance profile")
COUNT_MODEL = Rule("gpu.count.model", Severity.MONITOR, "GPU model differs from the instance profile")
RESPONSIVE_LOST = Rule(
    "gpu.responsive.lost",
    Severity.REBOOT,
    "the driver cannot talk to a GPU (GPU is lost / no device handle)",
)
RESPONSIVE_TIMEOUT = Rule(
    "gpu.responsive.timeout", Severity.REBOOT, "nvidia-smi/NVML hung past its timeout", confirm=True
)  # one slow read (a loaded host, a driver busy for a moment) is not a broken GPU
RESPONSIVE_DRIVER = Rule(
    "gpu.responsive.driver",
    Severity.REBOOT,
    "nvidia-smi/NVML cannot talk to the driver (not loaded, version mismatch)",
    confirm=True,
)  # also a tool that exited non-zero without output, and a driver caught mid-reload
RECOVERY_ACTION_RESET = Rule("gpu.recovery-action.reset", Severity.RESET, "the driver asks for a GPU reset")
RECOVERY_ACTION_REBOOT = Rule(
    "gpu.recovery-action.reboot",
    Severity.REBOOT,
    "the driver asks for a node reboot",
)
RECOVERY_ACTION_DRAIN = Rule(
    "gpu.recovery-action.drain",
    Severity.RESET,
    "the driver asks to drain and reset",
)
# Clock events and a link width are what the GPU does at the moment of the read (monitor; confirmed
# where `severities:` makes them fail).
THROTTLE_HW_SLOWDOWN = Rule("gpu.throttle.hw-slowdown", Severity.MONITOR, "HW slowdown active", confirm=True)
THROTTLE_HW_THERMAL = Rule(
    "gpu.throttle.hw-thermal", Severity.MONITOR, "HW thermal slowdown active", confirm=True
)
THROTTLE_HW_POWER_BRAKE = Rule(
    "gpu.throttle.hw-power-brake",
    Severity.MONITOR,
    "HW power brake slowdown active",
    confirm=True,
)
PCIE_WIDTH = Rule(
    "gpu.pcie.width", Severity.MONITOR, "PCIe link width below its maximum", Action.RESEAT, confirm=True
)  # a link that trained down: seating, riser or cable
PERSISTENCE_DISABLED = Rule("gpu.persistence.disabled", Severity.MONITOR, "persistence mode disabled")
FABRIC_INCOMPLETE = Rule(
    "gpu.fabric.incomplete",
    Severity.RESET,
    "NVSwitch fabric registration not completed/successful",
    Action.RESTART_FABRIC_MANAGER,
)
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


# The Gpu.where key of the lines each rule's finding rests on (`check --explain`).
WHERE = {
    COUNT_MODEL.name: "name",
    RECOVERY_ACTION_RESET.name: "recovery_action",
    RECOVERY_ACTION_REBOOT.name: "recovery_action",
    RECOVERY_ACTION_DRAIN.name: "recovery_action",
    THROTTLE_HW_SLOWDOWN.name: "clock_events",
    THROTTLE_HW_THERMAL.name: "clock_events",
    THROTTLE_HW_POWER_BRAKE.name: "clock_events",
    PCIE_WIDTH.name: "pcie.width",
    PERSISTENCE_DISABLED.name: "persistence_mode",
    FABRIC_INCOMPLETE.name: "fabric",
}


# --------------------------------------------------------------------------- gpu.count


def check_count(facts: NodeFacts, cfg: Config) -> CheckResult:
    name = "gpu.count"
    inv = typed_input(name, facts.gpus, GpuInventory)
    if isinstance(inv, CheckResult):
        return inv
    visible = inv.visible
    if facts.profile is None:
        why = (
            f"instance type {facts.instance_type!r} has no profile"
            if facts.instance_type
            else ("instance type unknown")
        )
        return CheckResult(name, skipped=f"{why}: {visible} GPU(s) visible, count not checked")
    prof = facts.profile
    findings: list[Finding] = []
    if visible != prof.gpu_count:
        findings.append(
            gpu_finding(
                cfg,
                name,
                COUNT_MISMATCH,
                f"{visible} GPU(s) visible, {prof.instance_type} has {prof.gpu_count}",
            )
        )
    if prof.gpu_model:
        wrong = [g for g in inv.gpus if g.name and prof.gpu_model.lower() not in g.name.lower()]
        for g in wrong:
            findings.append(
                gpu_finding(
                    cfg,
                    name,
                    COUNT_MODEL,
                    f"{g.label} is {g.name}, expected {prof.gpu_model}",
                    g,
                    Evidence.of(inv.source, g.where.get("name", ())),
                )
            )
    return CheckResult(
        name, findings=tuple(findings), note=f"{visible} GPU(s) as expected for {prof.instance_type}"
    )


# --------------------------------------------------------------------------- gpu.responsive


def check_responsive(facts: NodeFacts, cfg: Config) -> CheckResult:
    """A tool that hangs or cannot reach the driver is a GPU failure; a garbled file is "could not look".
    One GPU whose NVML calls hang is that GPU's own failure (gpu.responsive.timeout on it, confirmed
    like the node-wide one); the other GPUs are judged as usual."""
    name = "gpu.responsive"
    probed = facts.gpus
    if isinstance(probed, ProbeError) and probed.kind is not ProbeErrorKind.UNREADABLE:
        if probed.kind is ProbeErrorKind.TIMEOUT:
            rule = RESPONSIVE_TIMEOUT
        elif probed.kind is ProbeErrorKind.TOOL_FAILED:
            rule = RESPONSIVE_DRIVER
        else:
            return CheckResult(name, unknown=f"could not read {probed.source}: {probed.message}")
        return CheckResult(
            name, findings=(gpu_finding(cfg, name, rule, f"{probed.source}: {probed.message}"),)
        )
    got = partial_input(name, probed, GpuInventory)
    if isinstance(got, CheckResult):
        return got
    inv, unreadable = got
    # nvidia-smi saying a GPU is lost is a fault, also in a capture that is otherwise unreadable. A
    # GPU announced ("Attached GPUs") but not described is not: the parsers call that unreadable.
    findings = []
    for lost in inv.lost:
        where = f"GPU {short_pci(lost.pci_bus_id)}" if lost.pci_bus_id else "a GPU"
        findings.append(
            rule_finding(
                cfg,
                name,
                RESPONSIVE_LOST,
                f"{where} does not answer: {lost.message}",
                (short_pci(lost.pci_bus_id),) if lost.pci_bus_id else (),
                lost.pci_bus_id or "?",
                Evidence.of(inv.source, (lost.where,))
                if lost.where is not None
                else (Evidence(inv.source, None, lost.message),),
            )
        )
    for hung in inv.hung:
        findings.append(
            rule_finding(
                cfg,
                name,
                RESPONSIVE_TIMEOUT,
                f"{hung.label} does not answer: {hung.message}",
                (hung.label,),
                hung.pci_bus_id or f"gpu{hung.index}",
                (Evidence(inv.source, None, hung.message),),
            )
        )
    if unreadable is not None:
        return CheckResult(name, findings=tuple(findings), unknown=unreadable)
    return CheckResult(name, findings=tuple(findings), note=f"{len(inv.gpus)} GPU(s) answer ({inv.source})")


# --------------------------------------------------------------------------- driver recovery action


def _recovery(g: Gpu) -> Iterable[tuple[Rule, str]]:
    action = (g.recovery_action or "").strip()
    low = action.lower()
    if low.startswith("drain"):
        yield RECOVERY_ACTION_DRAIN, f"driver recovery action: {action}"
    elif "reboot" in low:
        yield RECOVERY_ACTION_REBOOT, f"driver recovery action: {action}"
    elif "reset" in low:
        yield RECOVERY_ACTION_RESET, f"driver recovery action: {action}"
    elif g.drain_and_reset_recommended:
        yield RECOVERY_ACTION_DRAIN, "driver recommends drain and reset"
    elif g.reset_required:
        yield RECOVERY_ACTION_RESET, "driver reports: reset required"


def check_recovery_action(facts: NodeFacts, cfg: Config) -> CheckResult:
    return per_gpu(
        "gpu.recovery-action",
        facts,
        cfg,
        _recovery,
        lambda g: g.recovery_action is not None or g.reset_required is not None,
        not_applicable="driver reports no recovery action (older driver)",
        ok="no recovery action pending",
        where=WHERE,
    )


# --------------------------------------------------------------------------- clocks, link, settings


def _throttle(g: Gpu) -> Iterable[tuple[Rule, str]]:
    c = g.clock_events
    if c.hw_thermal_slowdown:
        yield THROTTLE_HW_THERMAL, "HW thermal slowdown active"
    if c.hw_power_brake:
        yield THROTTLE_HW_POWER_BRAKE, "HW power brake slowdown active"
    if c.hw_slowdown and not (c.hw_thermal_slowdown or c.hw_power_brake):
        yield THROTTLE_HW_SLOWDOWN, "HW slowdown active"


def check_throttle(facts: NodeFacts, cfg: Config) -> CheckResult:
    """SW power capping and SW thermal slowdown are normal operation, not findings."""
    return per_gpu(
        "gpu.throttle",
        facts,
        cfg,
        _throttle,
        lambda g: any(
            v is not None
            for v in (
                g.clock_events.hw_slowdown,
                g.clock_events.hw_thermal_slowdown,
                g.clock_events.hw_power_brake,
            )
        ),
        not_applicable="no clock event reasons reported",
        ok="no HW slowdown",
        where=WHERE,
    )


def check_pcie(facts: NodeFacts, cfg: Config) -> CheckResult:
    """Only width: a generation below max at idle is power saving, not a fault. Some platforms wire
    GPUs narrower than their maximum (AWS g5/g6: x8 of x16); the profile's pcieWidth says so."""
    wired = facts.profile.pcie_width if facts.profile is not None else None

    def judge(g: Gpu) -> Iterable[tuple[Rule, str]]:
        p = g.pcie
        assert p.width_current is not None and p.width_max is not None
        expected = min(wired, p.width_max) if wired else p.width_max
        if p.width_current < expected:
            why = f" (this instance type runs x{wired})" if wired else ""
            yield PCIE_WIDTH, f"PCIe link x{p.width_current} of x{p.width_max}{why}"

    return per_gpu(
        "gpu.pcie",
        facts,
        cfg,
        judge,
        lambda g: g.pcie.width_current is not None and g.pcie.width_max is not None,
        not_applicable="PCIe link width not reported",
        ok="PCIe links at full width",
        where=WHERE,
    )


def check_persistence(facts: NodeFacts, cfg: Config) -> CheckResult:
    return per_gpu(
        "gpu.persistence",
        facts,
        cfg,
        lambda g: (
            [(PERSISTENCE_DISABLED, "persistence mode disabled")] if g.persistence_mode is False else []
        ),
        lambda g: g.persistence_mode is not None,
        not_applicable="persistence mode not reported",
        ok="persistence mode enabled",
        where=WHERE,
    )


def _fabric(g: Gpu) -> Iterable[tuple[Rule, str]]:
    f = g.fabric
    assert f is not None
    state = (f.state or "").strip()
    status = (f.status or "").strip()
    if state.lower() != "completed" or (status and status.lower() != "success"):
        detail = f"state {state or '?'}" + (f", status {status}" if status else "")
        yield FABRIC_INCOMPLETE, f"NVSwitch fabric not ready: {detail}"


def check_fabric(facts: NodeFacts, cfg: Config) -> CheckResult:
    expects = facts.profile.nvswitch if facts.profile is not None else None

    def applies(g: Gpu) -> bool:
        if g.fabric is None or g.fabric.state is None:
            return False
        return expects is not False

    return per_gpu(
        "gpu.fabric",
        facts,
        cfg,
        _fabric,
        applies,
        not_applicable="no NVSwitch fabric state reported",
        ok="fabric registration completed",
        where=WHERE,
    )


# --------------------------------------------------------------------------- node allocatable
# What the scheduler can allocate vs the GPUs seen: the device plugin's `nvidia.com/gpu` on the Node,
# and the devices NVIDIA's DRA driver publishes for this node (core/dra). A DRA-only node (the GPU
# Operator without a device plugin) has no such resource, or 0: its driver's devices are compared.

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
        "gpu.responsive",
        check_responsive,
        (Input.GPUS,),
        "gpu",
        (RESPONSIVE_LOST, RESPONSIVE_TIMEOUT, RESPONSIVE_DRIVER),
    ),
    CheckSpec("gpu.count", check_count, (Input.GPUS,), "gpu", (COUNT_MISMATCH, COUNT_MODEL)),
    *gpu_memory.CHECKS,  # ECC, row remapping, retired pages: checks/gpu_memory.py
    CheckSpec(
        "gpu.recovery-action",
        check_recovery_action,
        (Input.GPUS,),
        "gpu",
        (RECOVERY_ACTION_RESET, RECOVERY_ACTION_REBOOT, RECOVERY_ACTION_DRAIN),
    ),
    CheckSpec(
        "gpu.throttle",
        check_throttle,
        (Input.GPUS,),
        "gpu",
        (THROTTLE_HW_SLOWDOWN, THROTTLE_HW_THERMAL, THROTTLE_HW_POWER_BRAKE),
    ),
    CheckSpec("gpu.pcie", check_pcie, (Input.GPUS,), "gpu", (PCIE_WIDTH,)),
    CheckSpec("gpu.persistence", check_persistence, (Input.GPUS,), "gpu", (PERSISTENCE_DISABLED,)),
    CheckSpec("gpu.fabric", check_fabric, (Input.GPUS,), "gpu", (FABRIC_INCOMPLETE,)),
    CheckSpec(
        "gpu.allocatable",
        check_allocatable,
        (Input.GPUS, Input.NODE, Input.DRA),
        "gpu",
        (ALLOCATABLE_BELOW_VISIBLE, DRA_UNPUBLISHED, DRA_UNSEEN, DRA_COUNT),
    ),
)
