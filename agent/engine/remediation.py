"""What each of `node.remediationConditions` should say: the engine's half of the conditions that
remediation engines (Karpenter/EKS node repair, Cluster API MachineHealthCheck, medik8s
NodeHealthCheck) act on.

The rules, so that no engine replaces or reboots a node it should not:
- An entry wants its unhealthy status only in mode `taint`, for a failure at its minSeverity or
  above, and keeps it through hysteresis exactly as the taint does (state.Recovery): an `unknown`
  cycle never sets it, and a node that was unhealthy stays so through unknown cycles.
- The writer turns the wish into the unhealthy status only where our taint is on after the brake
  (reporters/node_writer.py): a node the brake holds back, or labelled `<prefix>/taint=disabled`,
  is not marked for the engines either, and the condition says why.
- Each mark names the finding key a new mark is counted under by the repair budget and the wave
  hold (core/repair_budget.py); the writer asks them before a condition newly turns unhealthy.
- Reason and message change only when the verdict (or the recovery count) does, as the node's own
  condition's, and ride in the same status PATCH: steady state costs no write.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.core.findings import Verdict
from agent.core.node_keys import CONDITION_MESSAGE_MAX, MODE_TAINT
from agent.core.remediation_types import RemediationCondition, RemediationMark, RemediationReason
from agent.core.repair_budget import finding_key
from agent.core.severity import Severity, Status
from agent.engine.state import Recovery


def describe(verdict: Verdict) -> str:
    """The verdict with its worst finding and the next step: "fail (reset): gpu.ecc: … → reset-gpu
    (then: reboot, service)"; for unknown, the checks that could not look."""
    worst = verdict.worst
    head = verdict.status.value
    if worst is not None and worst.severity > Severity.NONE:
        step = worst.recommendation.describe()
        return f"{head} ({worst.severity.label}): {worst.check}: {worst.message} → {step}"
    unknown = "; ".join(f"{r.name}: {r.message}" for r in verdict.results if r.status is Status.UNKNOWN)
    return f"{head}: {unknown or 'all checks passed'}"


def remediation_marks(
    entries: Sequence[RemediationCondition],
    recoveries: dict[str, Recovery],
    verdict: Verdict,
    *,
    mode: str,
    recover_after: int,
) -> tuple[RemediationMark, ...]:
    """One mark per configured entry, from its hysteresis (settled for this verdict)."""
    now = describe(verdict)
    key = finding_key(verdict.worst) if verdict.status is Status.FAIL else "unknown"
    out = []
    for entry in entries:
        rec = recoveries.get(entry.type) or Recovery()
        failing = verdict.status is Status.FAIL and verdict.severity >= entry.min_severity
        if rec.wanted:
            cause = now if failing else f"{rec.note(recover_after)}; last failure: {rec.cause or '-'}"
            if mode != MODE_TAINT:
                reason = RemediationReason.NOT_ENFORCED
                message = (
                    f"not marked for remediation in mode {mode} (mode taint would set "
                    f"{entry.type}={entry.unhealthy_status}): {cause}"
                )
            else:
                reason = RemediationReason.FAILED if failing else RemediationReason.RECOVERING
                message = cause
        elif verdict.status is Status.UNKNOWN:
            reason = RemediationReason.COULD_NOT_CHECK
            message = f"not marked unhealthy: an engine never acts on a node we could not check; {now}"
        elif verdict.status is Status.FAIL:
            reason = RemediationReason.BELOW_MIN_SEVERITY
            message = f"below this condition's minSeverity {entry.min_severity.label}; {now}"
        else:
            reason, message = RemediationReason.PASSED, now
        out.append(
            RemediationMark(
                type=entry.type,
                unhealthy_status=entry.unhealthy_status,
                unhealthy=rec.wanted and mode == MODE_TAINT,
                reason=reason,
                message=message[:CONDITION_MESSAGE_MAX],
                key=key,
            )
        )
    return tuple(out)


__all__ = ["describe", "remediation_marks"]
