"""One verdict written down as Marks (core/marks.py): the results annotation, the condition message,
the taint's, remediation conditions' and scope's parts, the history entry's key and the Events.

Pure: the engine hands in what one evaluation decided (Decided) and the state it keeps; nothing here
reads the machine, the Node or the clock, nor changes the state. A new field of the Node write is
one line of build() beside its field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.config import Config
from agent.core import trend_history
from agent.core.device_scope import ISOLATION_NODE, confined_scope, warn_scope
from agent.core.findings import CheckResult, Verdict
from agent.core.marks import Marks, NodeEvent
from agent.core.node import NodeObject
from agent.core.node_keys import CONDITION_MESSAGE_MAX, MODE_LABEL, MODE_TAINT, NORMAL, WARNING, EventReason
from agent.core.probed import Probed
from agent.core.results_doc import encode, results_document, stale_after_s
from agent.core.severity import Severity, Status
from agent.engine.degraded import degraded_marks, gpu_notes, isolable
from agent.engine.gpu_verdicts import pods_text
from agent.engine.history_annotation_reads import history_key, risk_outlook
from agent.engine.remediation import remediation_marks
from agent.engine.rollout import rollout_fields
from agent.engine.side_step import SideStep, summed
from agent.engine.state import EngineState, Latch
from agent.engine.validation import Validation


@dataclass(frozen=True)
class Decided:
    """What one evaluation decided (engine/engine.py evaluate), before it is written down."""

    verdict: Verdict
    results: Sequence[CheckResult]  # the current results, escalated (reboots, repairs)
    wanted: bool  # the taint's hysteresis wants the node marked unhealthy (any mode)
    node: Probed[NodeObject]  # the Node as the engine read it (the risk label reads its history)
    gpus: list[dict[str, Any]]  # one verdict per GPU (engine/gpu_verdicts.py)
    inventory: Any  # the gpu tier's last read: the GPUs the scope names
    # The side steps (engine/side_step.py): the clear request, the checks' Events, the active checks
    # (the testing taint), the validation (the validating taint), summed once in build()
    steps: tuple[SideStep, ...]
    last_status: Status | None  # the verdict before this one (the health Event says from what)
    new_latches: Sequence[Latch]  # latched since the last verdict: one Event each
    instance_type: str | None
    check_times: dict[str, str]  # when each check last ran
    checked_at: str  # now, RFC 3339
    doing: str  # what runs now (a DCGM diag in progress; "" or "idle": nothing)
    cleared: bool  # an operator's clear was acted on now
    kept: tuple[str, ...]  # cleared keys this process met again and did not fail on (clearCover)
    last_diag: dict[str, Any] | None  # the last `diag` request's record (lastDiag)


def build(d: Decided, state: EngineState, validation: Validation, cfg: Config) -> Marks:
    """The Marks of one verdict, its state settled (hysteresis, latches, validation)."""
    verdict, policy, boot_id = d.verdict, cfg.node, state.boot_id
    risk = risk_outlook(d, cfg, verdict.status, boot_id)  # the risk label, and each GPU's (node.risk)
    doc = results_document(
        verdict,
        checked_at=d.checked_at,
        boot_id=boot_id,
        instance_type=d.instance_type,
        latched=[latch.as_dict() for latch in state.latches.values()],
        check_times=d.check_times,
        taint=state.taint_document(),
        stale_after=stale_after_s(cfg.intervals.gpu),
        gpus=risk.gpus,
        history=[seen.as_dict() for seen in state.history.values()],
        trends=trend_history.to_doc(state.trends),
        remediation=state.remediation_document(),
        last_clear=state.last_clear,
        clear_cover=state.cover_document(),
        last_diag=d.last_diag,
        rollout=rollout_fields(cfg, state.taint, state.remediation),
        validated=validation.record,
        validating=validation.document(boot_id),
    )
    recovering = state.recovery_note(policy.recover_after) if verdict.status is not Status.FAIL else ""
    health = transition_events(verdict, d.last_status, d.new_latches, d.gpus)
    side = summed(d.steps)
    scope = confined_scope(d.results, d.inventory, policy.taint_min_severity, policy.isolation_node_at)
    marks = Marks(
        status=verdict.status,
        severity=verdict.severity,
        results_json=encode(doc),
        taint=d.wanted and policy.mode == MODE_TAINT,  # observe and label modes never taint
        condition_message=condition_message(verdict, d.results, (recovering, side.note), d.doing),
        events=health + side.events,
        drop_annotations=side.drop,
        clear_kept=d.kept,
        taint_severity=state.taint_severity if d.wanted else None,
        taint_effect=policy.effect_for(state.taint_severity),
        device_effect=policy.device_effect_for(state.taint_severity),
        unhealthy_label=d.wanted and policy.mode == MODE_LABEL,
        trends_digest=trend_history.counters_digest(state.trends),
        remediation=remediation_marks(
            policy.remediation_conditions,
            state.remediation,
            verdict,
            mode=policy.mode,
            recover_after=policy.recover_after,
        ),
        worst_key=history_key(verdict),
        boot_id=boot_id or "",
        scope=scope,
        warn_scope=warn_scope(d.results, d.inventory) if policy.mode == MODE_TAINT else None,
        validating=side.validating,
        testing=side.testing,
        risk=risk.node,
    )
    if policy.mode != MODE_TAINT or policy.isolation == ISOLATION_NODE or scope is None:
        return marks
    if not isolable(d.results, d.inventory, scope, verdict):
        return marks
    marks = replace(marks, gpu_notes=gpu_notes(d.results, scope, d.gpus))
    changed = health[0] if health and health[0].reason is EventReason.GPU_HEALTH_CHANGED else None
    variant = degraded_marks(
        marks,
        verdict=verdict,
        scope=scope,
        inventory=d.inventory,
        last_status=d.last_status,
        health_event=changed,
    )
    return replace(marks, degraded=variant)


def condition_message(
    verdict: Verdict, results: Sequence[CheckResult], notes: Sequence[str], doing: str
) -> str:
    """The status, what holds the node (*notes*: the recovery first, so that a long list of unknown
    checks cannot cut it off, then what the validating taint waits for), the worst finding or the
    checks that could not look, and what runs now (a DCGM diag)."""
    note = "; ".join(n for n in notes if n)
    worst = verdict.worst
    message = verdict.status.value + (f" ({note})" if note else "") + ": "
    message += (
        f"{worst.check}: {worst.message}"
        if worst is not None and worst.severity > Severity.NONE
        else "; ".join(f"{r.name}: {r.message}" for r in results if r.status is Status.UNKNOWN)
        or "all checks passed"
    )
    if doing and doing != "idle":
        message = f"{message} ({doing})"
    return message[:CONDITION_MESSAGE_MAX]


def transition_events(
    verdict: Verdict, last_status: Status | None, new_latches: Sequence[Latch], gpus: Sequence[dict[str, Any]]
) -> tuple[NodeEvent, ...]:
    """GPUHealthChanged when the status changed (with the worst finding, its next step and the pods
    on its GPUs), and one LatchedFinding per new latch."""
    events: list[NodeEvent] = []
    # A degraded node that fails is the same verdict (its GPUs isolated or not is the writer's to
    # say, reporters/device_isolation.py); any other change is told from what the Node showed.
    seen = Status.FAIL if last_status is Status.DEGRADED else last_status
    if verdict.status is not seen:
        worst = verdict.worst
        detail = ""
        if worst is not None:
            detail = f": {worst.check}: {worst.message}"
            if worst.severity > Severity.NONE:
                pods = pods_text(gpus, worst.key, *worst.entities)
                detail += f" → {worst.recommendation.describe()}{pods}"
        was = last_status.value if last_status else "none"
        kind = WARNING if verdict.status in (Status.FAIL, Status.UNKNOWN) else NORMAL
        events.append(
            NodeEvent(EventReason.GPU_HEALTH_CHANGED, f"{was} → {verdict.status.value}{detail}", kind)
        )
    for latch in new_latches:
        then = f" → {latch.next_step.describe()}" if latch.next_step else ""
        pods = pods_text(gpus, latch.key)
        events.append(
            NodeEvent(
                EventReason.LATCHED_FINDING, f"{latch.severity.label}: {latch.message}{then}{pods}", WARNING
            )
        )
    return tuple(events)


__all__ = ["Decided", "build", "condition_message", "transition_events"]
