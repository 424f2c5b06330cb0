"""Human-readable output: the check table."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping

from agent.core.facts import NodeFacts
from agent.core.findings import Evidence, Verdict
from agent.core.severity import Severity, Status


def table(verdict: Verdict, facts: NodeFacts, title: str = "") -> str:
    width = max(80, min(shutil.get_terminal_size((120, 20)).columns, 160))
    itype = facts.instance_type or "unknown"
    prof = "profile found" if facts.profile else "no profile"
    if facts.instance_type_source:
        prof += f", from {facts.instance_type_source}"
    lines = []
    if title:
        lines.append(title)
    lines.append(
        f"node: status={verdict.status.value} severity={verdict.severity.label} "
        f"instance-type={itype} ({prof})"
    )
    head = f"{'CHECK':<20} {'STATUS':<8} {'SEVERITY':<9} MESSAGE"
    lines += [head, "-" * min(width, 120)]
    msg_width = max(30, width - 40)
    for r in verdict.results:
        wrapped = textwrap.wrap(r.message, msg_width) or [""]
        lines.append(f"{r.name:<20} {r.status.value:<8} {r.severity.label:<9} {wrapped[0]}")
        lines += [" " * 40 + more for more in wrapped[1:4]]
    steps = _next_steps(verdict)
    if steps:
        lines += ["", "NEXT STEP (then, if it comes back)", *steps]
    return "\n".join(lines)


def explain(verdict: Verdict, files: Mapping[str, str] | None = None) -> str:
    """`check --explain`: for each check that did not pass, its findings and the lines of input each
    rests on (file or tool, line number, the text), and why a check could not look. `files` maps a
    tool ("nvidia-smi -q") to the snapshot file that holds its output."""
    names = files or {}

    def where(e: Evidence) -> str:
        at = names.get(e.source, e.source)
        return f"{at}:{e.line}" if e.line is not None else at

    out: list[str] = []
    for r in verdict.results:
        if r.status in (Status.PASS, Status.SKIPPED):
            continue
        out.append(f"{r.name}: {r.status.value} ({r.severity.label})")
        for f in r.findings:
            out.append(f"  - [{f.severity.label}] {f.message}")
            out += [f"      {where(e)}: {e.text}" for e in f.evidence]
            if not f.evidence:
                out.append("      (no input line recorded for this finding)")
        if r.unknown is not None:
            out.append(f"  - could not look: {r.unknown}")
    return "\n".join(out) if out else "every check passed or was skipped: nothing to explain"


def _next_steps(verdict: Verdict) -> list[str]:
    """One line per check with a finding: its worst finding's step and escalation."""
    out = []
    for r in verdict.results:
        worst = max(r.findings, key=lambda f: f.severity, default=None)
        if worst is not None and worst.severity > Severity.NONE:
            rec = worst.recommendation
            out.append(f"{r.name:<20} {rec.describe()}: {rec.action.text}")
    return out
