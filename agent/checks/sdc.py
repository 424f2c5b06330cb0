"""`sdc`: a GPU whose output differs bit for bit from its siblings' in the SDC probe (core/sdc_report.py).

The probe (sdcprobe/, its own image, run in the active-check window) computes the same GEMMs and
reductions in several precisions on every GPU of the idle node and reports the SHA-256 of each
output. A GPU not in its siblings' majority on the first attempt only: `sdc.mismatch-once`, a warning
on that GPU (a None-effect device taint where DRA serves one). On the immediate re-run too:
`sdc.mismatch-repeated`, that GPU fails alone (isolate: it computes wrong answers). Never a fault
where nobody can be named (two GPUs, a split, every GPU different): `unknown`, saying why. A GPU that
could not run it, or one the agent cannot match to a GPU it sees: `unknown` for it. Messages hold
the run's start time, not live numbers: a standing result costs no write per cycle.
"""

from __future__ import annotations

from agent.checks import CheckSpec, gpu_finding, typed_input
from agent.config import Config
from agent.core.actions import Action
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.pci import normalize_pci
from agent.core.peers import MIN_PEERS
from agent.core.rules import Rule
from agent.core.sdc_report import SdcDevice, SdcReport, judge
from agent.core.severity import Severity

NAME = "sdc"
MISMATCH_ONCE = Rule(
    f"{NAME}.mismatch-once",
    Severity.MONITOR,
    "in the SDC probe, the GPU's output differed bit for bit from its siblings' majority on the "
    "first attempt and agreed on the immediate re-run: a silent data corruption once",
    max_severity=Severity.MONITOR,
)
MISMATCH_REPEATED = Rule(
    f"{NAME}.mismatch-repeated",
    Severity.ISOLATE,
    "in the SDC probe, the GPU's output differed bit for bit from its siblings' majority on both "
    "attempts with the same inputs: it computes wrong answers (silent data corruption)",
    action=Action.SERVICE,
)


def _match(dev: SdcDevice, gpus: list[Gpu]) -> Gpu | None:
    """The GPU NVML sees that the probe's device is: by UUID, else by PCI address."""
    for g in gpus:
        if dev.uuid and g.uuid and g.uuid.lower() == dev.uuid.lower():
            return g
    for g in gpus:
        if dev.pci_bus_id and normalize_pci(g.pci_bus_id) == normalize_pci(dev.pci_bus_id):
            return g
    return None


def check_sdc(facts: NodeFacts, cfg: Config) -> CheckResult:
    report = typed_input(NAME, facts.sdc, SdcReport)
    if isinstance(report, CheckResult):
        return report
    if len(report.devices) < 2:
        return CheckResult(NAME, skipped="one GPU: no sibling to compare its output with")
    gpus = list(facts.gpus.gpus) if isinstance(facts.gpus, GpuInventory) else []
    verdict = judge(report)
    run = f"the SDC probe run of {report.started_at}"
    findings: list[Finding] = []
    unknown: list[str] = []
    by_index = {d.index: d for d in report.devices}
    for rule, odd, again in (
        (MISMATCH_REPEATED, verdict.repeated, "and again on the immediate re-run with the same inputs"),
        (MISMATCH_ONCE, verdict.once, "once: the immediate re-run with the same inputs agreed"),
    ):
        for index, keys in sorted(odd.items()):
            dev = by_index.get(index, SdcDevice(index, "", "", ""))
            gpu = _match(dev, gpus)
            siblings = verdict.peers.get(index, 0)
            what = (
                f"its output differed bit for bit from the majority of its {siblings} siblings on "
                f"{', '.join(keys)} in {run}, {again}"
            )
            if gpu is None:
                unknown.append(
                    f"CUDA device {index} ({dev.pci_bus_id or dev.uuid}), which NVML does not show: {what}"
                )
                continue
            evidence = (
                Evidence(
                    report.source, None, f"device {index} {dev.uuid} {dev.pci_bus_id}: {', '.join(keys)}"
                ),
            )
            findings.append(gpu_finding(cfg, NAME, rule, f"{gpu.label}: {what}", gpu, evidence))
    if verdict.undecided:
        unknown.append(
            f"{', '.join(verdict.undecided)} disagreed in {run} with no majority of more than half of at "
            f"least {MIN_PEERS} GPUs: no GPU can be named"
        )
    for index, err in sorted(verdict.errors.items()):
        dev = by_index.get(index, SdcDevice(index, "", "", ""))
        gpu = _match(dev, gpus)
        unknown.append(f"{gpu.label if gpu else f'CUDA device {index}'} could not run {run}: {err}")
    kept = f" ({report.kept})" if report.kept else ""
    note = ""
    if not findings and not unknown:
        ran = len({k for d in report.attempts[0].digests.values() for k in d})
        few = (
            f" (with {len(report.devices)} GPUs a disagreement could not name the odd one)"
            if len(report.devices) < MIN_PEERS
            else ""
        )
        n = len(report.devices)
        note = f"{n} GPUs agreed bit for bit on {ran} kernels and precisions in {run}{few}{kept}"
    return CheckResult(NAME, findings=tuple(findings), unknown="; ".join(unknown) or None, note=note)


CHECKS = (
    CheckSpec(NAME, check_sdc, (Input.SDC, Input.GPUS), "sdc-probe", (MISMATCH_ONCE, MISMATCH_REPEATED)),
)
