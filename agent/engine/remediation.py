"""The remediation decision: what each of `node.remediationConditions` says, in one place. The
conditions remediation engines (Karpenter/EKS node repair, Cluster API MachineHealthCheck, medik8s
NodeHealthCheck) act on are decided here; reporters/node_patch.py only applies the decision to the
Node once the taint is decided (the brake and the taint label need the API, so the writer knows
them last), and writes what remediation_condition() returns, nothing of its own.

The rules, so that no engine replaces or reboots a node it should not:
- An entry wants its unhealthy status only in mode `taint`, for a failure at its minSeverity or
  above, and keeps it through hysteresis exactly as the taint does (recovery.Recovery): an `unknown`
  cycle never sets it, and a node that was unhealthy stays so through unknown cycles.
- The wish turns into the unhealthy status only where our taint is on after the brake: a node the
  brake holds back, labelled `<prefix>/taint=disabled`, or not tainted (or not in mode taint:
  NotEnforced) is not marked for the engines either, and the condition says why.
- While it fails, the reason names the fault class and the action (core/remediation_reasons.py:
  the worst finding's rule and recommendation; `reasonStyle: eks` the EKS agent's names).
- Each mark names the finding key a new mark is counted under by the repair budget and the wave
  hold (core/repair_budget.py); the writer asks them before a condition newly turns unhealthy, and a
  hold keeps the condition healthy (BudgetHeld, WaveHeld).
- Reason and message change only when the verdict (or the recovery count) does, as the node's own
  condition's, and ride in the same status PATCH: steady state costs no write. lastTransitionTime
  moves only with the status (node_patch.plan_entry).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.core.findings import Verdict
from agent.core.node_keys import CONDITION_MESSAGE_MAX, DISABLED, MODE_TAINT, Keys
from agent.core.remediation_reasons import FaultReason, reason_for
from agent.core.remediation_types import RemediationCondition, RemediationMark, RemediationReason
from agent.core.repair_budget import Hold, HoldReason, finding_key
from agent.core.severity import Severity, Status
from agent.engine.recovery import Recovery


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
    reason: RemediationReason | FaultReason
    for entry in entries:
        rec = recoveries.get(entry.type) or Recovery()
        failing = verdict.status is Status.FAIL and verdict.severity >= entry.min_severity
        if rec.wanted and mode != MODE_TAINT:
            reason, message = _not_marked(
                f"not marked for remediation in mode {mode} (mode taint would set "
                f"{entry.type}={entry.unhealthy_status})",
                now if failing else _recovering(rec, recover_after),
            )
        elif rec.wanted and failing and verdict.worst is not None:
            worst = verdict.worst
            reason = reason_for(worst.rule, worst.key, worst.recommendation.action, entry.reason_style)
            message = now
        elif rec.wanted:
            reason, message = RemediationReason.RECOVERING, _recovering(rec, recover_after)
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


def _recovering(rec: Recovery, recover_after: int) -> str:
    return f"{rec.note(recover_after)}; last failure: {rec.cause or '-'}"


def _not_marked(why: str, cause: str) -> tuple[RemediationReason, str]:
    """NotEnforced: the wish stands, but nothing enforces it (mode observe or label, or no taint)."""
    return RemediationReason.NOT_ENFORCED, f"{why}: {cause}"


def remediation_condition(
    mark: RemediationMark,
    *,
    taint_on: bool,
    brake_open: bool,
    disabled: bool,
    prefix: str,
    hold: Hold | None = None,
) -> tuple[str, RemediationReason | FaultReason, str]:
    """(status, reason, message) of one remediation condition, once the taint is decided: the wish
    for the unhealthy status holds only where our taint is on; a node the brake holds back (or that
    refuses our taint, or is not tainted) is not marked for the engines either, and says why. A
    *hold* (the repair budget or a wave, for a node not marked yet) keeps it healthy too."""
    if not mark.unhealthy:
        return mark.healthy_status, mark.reason, mark.message
    if taint_on and hold is not None:
        reason = RemediationReason.WAVE_HELD if hold.why is HoldReason.WAVE else RemediationReason.BUDGET_HELD
        text = f"not marked for remediation: {hold.message}; {mark.message}"
        return mark.healthy_status, reason, text[:CONDITION_MESSAGE_MAX]
    if taint_on:
        return mark.unhealthy_status, mark.reason, mark.message
    if brake_open:
        reason, why = (
            RemediationReason.BRAKE_HELD,
            "not marked for remediation: the brake holds this node back "
            "(node.maxTaintedFraction, node.maxTaintedNodes)",
        )
    elif disabled:
        reason, why = (
            RemediationReason.TAINT_DISABLED,
            f"not marked for remediation: label {Keys(prefix).taint_opt_out}={DISABLED} is set",
        )
    else:
        reason, why = _not_marked("not marked for remediation", "the node is not tainted")
    return mark.healthy_status, reason, f"{why}; {mark.message}"[:CONDITION_MESSAGE_MAX]


__all__ = ["describe", "remediation_condition", "remediation_marks"]
