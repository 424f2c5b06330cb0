"""GPU checks on the NVML / nvidia-smi inventory. Each is a pure function of NodeFacts and Config.
The memory-health family (ECC, row remapping, retired pages) is in gpu_memory, gpu.allocatable in
gpu_allocatable; CHECKS lists them all, in report order."""

from __future__ import annotations

from collections.abc import Iterable

from agent.checks import (
    CheckSpec,
    gpu_allocatable,
    gpu_finding,
    gpu_memory,
    partial_input,
    per_gpu,
    rule_finding,
    typed_input,
)
from agent.config import Config
from agent.core.actions import Action
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.pci import short_pci
from agent.core.probed import ProbeError, ProbeErrorKind
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
    *gpu_allocatable.CHECKS,  # what the scheduler can allocate: checks/gpu_allocatable.py
)
