"""`dcgm-diag.peers`: a GPU whose DCGM diag figures fall well below its siblings' (core/peers.py).

The diag runs the same tests on every GPU of the node and states, per GPU, what each reached: the
diagnostic test's GFLOPS, targeted stress's relative stress level, targeted power's average draw,
the PCIe test's bandwidths (the `info` lines of each result; DCGM nvvs/plugin_src wording, 3.x and
4.x). A GPU below its siblings' median by more than `peers.diagMarginPercent` on a test it passed is
a warning on that GPU naming the figure, its value, the median and the margin: a slow GPU the
diag's own absolute floors (a target per SKU, well below a healthy board) let through. A figure
fewer than three GPUs report is not judged. A failed or warned test is dcgm-diag's, not compared.
The message changes only with a new diag report (its figures are those of one run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.checks import CheckSpec, gpu_finding, rule_finding, typed_input
from agent.config import Config
from agent.core.dcgm_report import DiagReport, DiagStatus
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.peers import MIN_PEERS, behind_median
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "dcgm-diag.peers"
BELOW = Rule(
    f"{NAME}.below-median",
    Severity.MONITOR,
    "a DCGM diag figure of this GPU (GFLOPS, stress level, power, PCIe bandwidth) is below its "
    "siblings' median by more than peers.diagMarginPercent",
    max_severity=Severity.MONITOR,
)
_GPU = r"(?:GPU (\d+) )?"  # dcgmi prefixes "GPU <id> "; the API's per-entity info may not


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    pattern: re.Pattern[str]


FIGURES = (
    Figure("GFLOPS", "GFLOPS", re.compile(_GPU + r"calculated at approximately ([\d.]+) gigaflops")),
    Figure("relative stress level", "", re.compile(_GPU + r"relative stress level:?\s+([\d.]+)")),
    Figure("average power", "W", re.compile(_GPU + r"power average:\s*([\d.]+) W")),  # 3.x
    Figure("average power", "W", re.compile(_GPU + r"max power: [\d.]+ W average power usage: ([\d.]+) W")),
    Figure("GPU to Host bandwidth", "GB/s", re.compile(_GPU + r"GPU to Host bandwidth:\s*([\d.]+) GB/s")),
    Figure("Host to GPU bandwidth", "GB/s", re.compile(_GPU + r"Host to GPU bandwidth:\s*([\d.]+) GB/s")),
    Figure("bidirectional bandwidth", "GB/s", re.compile(_GPU + r"bidirectional bandwidth:\s*([\d.]+) GB/s")),
)


def figures(report: DiagReport) -> dict[tuple[str, str, str], dict[str, float]]:
    """(test, figure, unit) → DCGM GPU id → value, from the info of the results that passed."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in report.results:
        if r.status is not DiagStatus.PASS:
            continue
        for line in r.info:
            for fig in FIGURES:
                for m in fig.pattern.finditer(line):
                    gpu = m.group(1) or (r.gpu if r.gpu.isdigit() else None)
                    if gpu is not None:
                        out.setdefault((r.test, fig.name, fig.unit), {})[gpu] = float(m.group(2))
    return out


def _by_id(report: DiagReport, inv: GpuInventory | None) -> dict[str, Gpu]:
    """DCGM GPU id → the GPU NVML sees, where the run tested every GPU (then ids are NVML indexes;
    an engine that sees a subset numbers it from 0, so then no GPU is named by its id)."""
    if inv is None or len(report.gpus()) not in (0, len(inv.gpus)):
        return {}
    return {str(g.index): g for g in inv.gpus}


def _amount(value: float, unit: str) -> str:
    return f"{value:g} {unit}".strip()


def check_diag_peers(facts: NodeFacts, cfg: Config) -> CheckResult:
    report = typed_input(NAME, facts.dcgm_diag, DiagReport)
    if isinstance(report, CheckResult):
        return report
    if not report.completed:
        return CheckResult(NAME, skipped="DCGM diag not run yet")
    inv = facts.gpus if isinstance(facts.gpus, GpuInventory) else None
    models = sorted({g.name for g in inv.gpus if g.name}) if inv is not None else []
    if len(models) > 1:
        return CheckResult(NAME, skipped=f"GPUs of more than one model ({', '.join(models)}): no siblings")
    margin = cfg.peers.diag_margin_percent
    judged = {k: v for k, v in figures(report).items() if len(v) >= MIN_PEERS}
    if not judged:
        return CheckResult(
            NAME,
            skipped=f"the DCGM diag states no figure for {MIN_PEERS} or more GPUs: no siblings to compare",
        )
    words: dict[str, list[str]] = {}
    said: dict[str, list[Evidence]] = {}
    for (test, fig, unit), values in sorted(judged.items()):
        for gpu, (value, med) in sorted(behind_median(values, margin).items()):
            pct = (med - value) * 100 / med
            words.setdefault(gpu, []).append(
                f"{test} {fig} {_amount(value, unit)}, {pct:.0f} % below the median of the "
                f"{len(values)} GPUs ({_amount(med, unit)}; margin peers.diagMarginPercent {margin:g} %)"
            )
            others = ", ".join(f"GPU {k} {v:g}" for k, v in sorted(values.items(), key=lambda kv: int(kv[0])))
            said.setdefault(gpu, []).append(Evidence(report.source, None, f"{test} {fig}: {others}"))
    by_id = _by_id(report, inv)
    findings: list[Finding] = []
    for gpu, parts in sorted(words.items(), key=lambda kv: int(kv[0])):
        g = by_id.get(gpu)
        label = g.label if g is not None else f"DCGM GPU {gpu}"
        msg = f"{label}: slower than its siblings in the DCGM diag: {'; '.join(parts)}"
        evidence = tuple(said[gpu])
        if g is not None:
            findings.append(gpu_finding(cfg, NAME, BELOW, msg, g, evidence))
        else:
            findings.append(rule_finding(cfg, NAME, BELOW, msg, (f"GPU {gpu}",), f"dcgm-gpu-{gpu}", evidence))
    names = sorted({f"{t} {f}" for t, f, _ in judged})
    note = f"{len(names)} DCGM diag figure(s) compared across GPUs, none below the median by {margin:g} %"
    return CheckResult(NAME, findings=tuple(findings), note=note if not findings else "")


CHECKS = (CheckSpec(NAME, check_diag_peers, (Input.DCGM_DIAG, Input.GPUS), "dcgm-diag", (BELOW,)),)
