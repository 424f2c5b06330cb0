"""`dcgm-health.suspect`: while the node's DCGM engine does not answer, name the GPU that reads taken
outside DCGM point at.

A wedged engine is no evidence about any GPU by itself (a busy host, a slow network, an engine bug:
dcgm-health is `unknown`, never `fail`). But a GPU can wedge it: one GPU's correctable-ECC storm
(about 17,700 a second under load) held `dcgmi health` past 45 s while DCGM called every GPU healthy
(NVIDIA/NVSentinel#1748, NVIDIA/DCGM#313), and a GPU stuck in a pending recovery action looks
healthy to DCGM (NVIDIA/DCGM#263). So when the engine does not answer (dcgm-health read TIMEOUT) and
a GPU, as the gpu tier read it through NVML or nvidia-smi, shows correctable ECC errors growing
faster than `thresholds.dcgmWedgeEccPerSec` between its last two reads, or a recovery action the
driver asks for, that GPU is named: a warning on it that states both facts. A warning marks
nothing, and `severities:` cannot raise it (the recovery action itself is judged, and marked, by
gpu.recovery-action).
"""

from __future__ import annotations

from dataclasses import replace

from agent.checks import CheckSpec, gpu_finding, input_gap, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence
from agent.core.gpu import Gpu, GpuInventory
from agent.core.pci import normalize_pci
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "dcgm-health.suspect"
SUSPECT = Rule(
    f"{NAME}.gpu",
    Severity.MONITOR,
    "the DCGM engine does not answer while this GPU's correctable-ECC rate or pending recovery action "
    "(read outside DCGM) points at it",
    max_severity=Severity.MONITOR,
)


def _recovery(g: Gpu) -> str | None:
    action = (g.recovery_action or "").strip()
    if action and action != "None":
        return f"the driver asks for a recovery action: {action}"
    if g.drain_and_reset_recommended:
        return "the driver recommends drain and reset"
    if g.reset_required:
        return "the driver reports: reset required"
    return None


def _rough(rate: float) -> str:
    """A rate to one significant figure ("about 20,000"): the message stays the same while a storm
    goes on at about the same pace (a new message is a Node write); the exact figure is evidence."""
    digits = max(0, len(str(int(rate))) - 1)
    return f"{round(rate, -digits):,.0f}"


def _ecc_rate(
    g: Gpu, inv: GpuInventory, before: GpuInventory | None, limit: float
) -> tuple[str, Evidence, str] | None:
    """The GPU's correctable-ECC growth a second between the two reads, when it exceeds `limit`:
    the words, the evidence, the exact rate."""
    if before is None or inv.taken_at is None or before.taken_at is None:
        return None
    seconds = inv.taken_at - before.taken_at
    was = next((p for p in before.gpus if normalize_pci(p.pci_bus_id) == normalize_pci(g.pci_bus_id)), None)
    if seconds <= 0 or was is None or (was.uuid and g.uuid and was.uuid != g.uuid):
        return None
    now, then = g.ecc.volatile_correctable, was.ecc.volatile_correctable
    if now is None or then is None or now < then:  # not reported, or the driver reloaded
        return None
    rate = (now - then) / seconds
    if rate <= limit:
        return None
    words = (
        f"its correctable ECC errors grow about {_rough(rate)} a second "
        f"(over thresholds.dcgmWedgeEccPerSec, {limit:g})"
    )
    said = f"volatile correctable ECC errors {then:,} → {now:,} in {seconds:.1f} s: {rate:,.0f}/s"
    return words, Evidence(inv.source, None, said), f"{rate:,.0f}/s"


def check_suspect(facts: NodeFacts, cfg: Config) -> CheckResult:
    health = facts.dcgm_health
    if not (isinstance(health, ProbeError) and health.kind is ProbeErrorKind.TIMEOUT):
        gap = input_gap(NAME, health)
        if gap is not None:  # not polled, or unreachable: nothing answered slowly, nothing to name
            return CheckResult(NAME, skipped=f"no wedged DCGM engine to attribute ({health})")
        return CheckResult(NAME, note="the DCGM engine answers")
    inv = typed_input(NAME, facts.gpus, GpuInventory)
    if isinstance(inv, CheckResult):
        return CheckResult(NAME, unknown=f"the DCGM engine does not answer ({health.message}); {inv.message}")
    limit = cfg.thresholds.dcgm_wedge_ecc_per_sec
    findings = []
    for g in inv.gpus:
        ecc, action = _ecc_rate(g, inv, facts.gpus_previous, limit), _recovery(g)
        why = [w for w in (ecc[0] if ecc else None, action) if w]
        if why:
            wedge = f"the DCGM engine does not answer ({health.message})"
            msg = f"{g.label} is the likely cause: {wedge} and {'; '.join(why)}"
            evidence = (Evidence("dcgm health", None, health.message), *((ecc[1],) if ecc else ()))
            found = gpu_finding(cfg, NAME, SUSPECT, msg, g, evidence)
            findings.append(replace(found, rate=ecc[2]) if ecc else found)
    rated = facts.gpus_previous is not None and inv.taken_at is not None
    note = "the DCGM engine does not answer; no GPU points at a cause (no recovery action pending" + (
        f", correctable ECC at most {limit:g}/s)" if rated else "; no earlier read for an ECC rate)"
    )
    return CheckResult(NAME, findings=tuple(findings), note=note)


CHECKS = (CheckSpec(NAME, check_suspect, (Input.DCGM_HEALTH, Input.GPUS), "dcgm-health", (SUSPECT,)),)
