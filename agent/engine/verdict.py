"""The node verdict (DESIGN.md §3): the highest severity wins; unknown only when nothing failed."""

from __future__ import annotations

from collections.abc import Iterable

from agent.core.findings import CheckResult, Verdict
from agent.core.severity import Severity, Status


def decide(results: Iterable[CheckResult]) -> Verdict:
    """Highest severity wins and is never masked by a milder finding; unknown only when nothing failed."""
    results = tuple(results)
    severity = max((r.severity for r in results), default=Severity.NONE)
    if severity >= Severity.RESET:
        status = Status.FAIL
    elif any(r.status is Status.UNKNOWN for r in results):
        status = Status.UNKNOWN
    elif severity == Severity.MONITOR:
        status = Status.WARN
    else:
        status = Status.PASS
    return Verdict(status=status, severity=severity, results=results)
