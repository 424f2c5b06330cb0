"""What the engine hands the Node writer: the desired state of our keys (NodeWrite), the Events to post
and the other context of a write (WriteContext), both as one (Marks), and an operator's clear request
as the CLI writes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.device_scope import Scope
from agent.core.node_keys import (
    CONDITIONS,
    DEFAULT_TAINT_EFFECT,
    NORMAL,
    ConditionReason,
    EventReason,
)
from agent.core.remediation_types import RemediationMark
from agent.core.results_doc import decode_results, encode, steady_results
from agent.core.severity import Severity, Status


@dataclass(frozen=True)
class NodeEvent:
    """An Event on the Node."""

    reason: EventReason
    message: str
    type: str = NORMAL  # or WARNING


TERM = "term"  # field metadata: the field's value as the fingerprint sees it
EXEMPT = "exempt"  # field metadata: why the field is not in the fingerprint


def _remediation_term(marks: tuple[RemediationMark, ...]) -> str:
    """Each condition's wish, reason and message (the unhealthy status comes from the config with the
    type; the key only counts a new mark)."""
    return repr([(m.type, m.unhealthy, m.reason, m.message) for m in marks])


def _scope_term(scope: Scope | None) -> str:
    return scope.as_text() if scope is not None else ""


@dataclass(frozen=True)
class NodeWrite:
    """What the Node PATCHes carry: the desired state of this agent's keys on its own Node.

    Every field is in the write's fingerprint (engine/write_policy.py: a change of any of them makes
    a write necessary), as str(value) or as its `term`, unless `exempt` says why not; the
    fingerprint is derived from these fields, and tests/test_write_policy.py fails for a field of
    Marks that is neither.

    `taint` is the engine's wish (status fail at taintMinSeverity or above, after hysteresis, mode
    `taint`); the writer still honours the `<prefix>/taint=disabled` label and the cluster-wide brake
    before adding a taint.
    """

    status: Status
    severity: Severity
    # the compact `<prefix>/results` annotation value; in the fingerprint without its timestamps,
    # durations and trend reads (those stand as trends_digest)
    results_json: str = field(metadata={TERM: steady_results})
    taint: bool
    condition_message: str
    # The taint's value: the last failing severity, kept while a tainted node recovers or is unknown
    # (None: the verdict's severity).
    taint_severity: Severity | None = None
    taint_effect: str = DEFAULT_TAINT_EFFECT  # node.taintEffect or node.taintEffectBySeverity
    # A DeviceTaintRule's effect for the same severity (node.deviceTaintEffectBySeverity)
    device_effect: str = DEFAULT_TAINT_EFFECT
    unhealthy_label: bool = False  # mode `label`: the label <prefix>/unhealthy instead of the taint
    config_rejected: bool = False  # the mounted config is invalid: the condition's reason says so
    # What of the annotation's trend reads makes a write necessary (core/trend_history.counters_digest).
    trends_digest: str = ""
    # node.remediationConditions
    remediation: tuple[RemediationMark, ...] = field(default=(), metadata={TERM: _remediation_term})
    # The validating taint (Keys.validating): True = put it on, False = lift it where it is (a
    # complete pass), None = leave it as it is (engine/validation.py).
    validating: bool | None = None
    # Where the failing findings lie (core/device_scope; None: none at taintMinSeverity now): the
    # device-taint writer turns a taint confined to GPUs into DRA device taints (node.isolation).
    scope: Scope | None = field(default=None, metadata={TERM: _scope_term})
    # Where the warnings lie (core/device_scope.warn_scope; mode taint only): a warning confined to
    # GPUs shows on those DRA devices as a taint of effect None, which moves no pod.
    warn_scope: Scope | None = field(default=None, metadata={TERM: _scope_term})
    # The testing taint (Keys.testing): True while an active check holds the node, False = lift it
    # where it is, None = leave it (core/active_checks.py).
    testing: bool | None = None
    # The risk label's value (core/node_risk.py: high | normal); "" leaves the label as it is.
    risk: str = ""
    # The gpus-in-service label ("7-of-8") of a degraded node; "" = absent (engine/degraded.py).
    in_service: str = ""

    @property
    def taint_value(self) -> str:
        return (self.taint_severity or self.severity).label

    @property
    def condition_status(self) -> str:
        """The condition follows the status, so that no writer or test can pair them otherwise."""
        return CONDITIONS[self.status].status

    @property
    def condition_reason(self) -> ConditionReason:
        """The status's reason, or ConfigRejected while the agent runs on a config it fell back to
        (the status still tells health; the message says which config is in force and why)."""
        return ConditionReason.CONFIG_REJECTED if self.config_rejected else CONDITIONS[self.status].reason


@dataclass(frozen=True, kw_only=True)
class WriteContext:
    """What goes with a write but is not the Node's desired state: no field makes a write necessary
    by itself, and each says why (its EXEMPT metadata)."""

    events: tuple[NodeEvent, ...] = field(
        default=(),
        metadata={EXEMPT: "posted once; the loop writes whenever there are Events, whatever the fingerprint"},
    )
    # our annotations to remove (consumed requests)
    drop_annotations: tuple[str, ...] = field(
        default=(),
        metadata={EXEMPT: "removed with the next write; a clear's comes with its LatchesCleared Event"},
    )
    # For the `<prefix>/history` annotation (core/history_annotation.py): the worst finding's key of a
    # fail or warn ("" otherwise) and the boot the verdict is of.
    worst_key: str = field(
        default="",
        metadata={EXEMPT: "read by the history entry a write adds; the worst finding is in the results"},
    )
    boot_id: str = field(
        default="",
        metadata={EXEMPT: "read by the history entry a write adds; the results annotation's bootId has it"},
    )
    # The cleared keys whose kernel-log lines this agent process met again and did not fail the node
    # on (the results annotation's clearCover): the history entry says so (`clear-kept`).
    clear_kept: tuple[str, ...] = field(
        default=(),
        metadata={EXEMPT: "said once per process; the loop writes whenever there are some, as for Events"},
    )
    # The same verdict written as a degraded node (engine/degraded.py): the device-taint writer shows
    # it where every failing GPU is isolated by a rule the server accepted; None: not possible now.
    degraded: Marks | None = field(
        default=None,
        metadata={EXEMPT: "derived from the verdict, the scope and the GPUs, which the fingerprint holds"},
    )
    # Per failing GPU (normalised PCI address): what fails it and the pods on it, for the writer's
    # GPUIsolated Event (the device and the rule are the writer's).
    gpu_notes: Mapping[str, str] = field(
        default_factory=dict,
        metadata={EXEMPT: "derived from the results, which the fingerprint holds"},
    )
    # The GPUs (PCI addresses) our DRA device taints hold after this write, as the device-taint writer
    # (reporters/device_isolation.py) sets it for the history's per-GPU risk counts; () in a node-wide
    # episode; None: not known (no such writer, or its rules unread): the history keeps its last.
    isolated: tuple[str, ...] | None = field(
        default=None,
        metadata={EXEMPT: "set by the device-taint writer, not the engine; the scope it follows is in"},
    )


@dataclass(frozen=True)
class Marks(NodeWrite, WriteContext):
    """What the engine hands the Node writer: the write and its context, read as one (marks.taint,
    marks.events)."""


@dataclass(frozen=True)
class ClearRequest:
    """Who asked to clear latched findings and why: the `<prefix>/clear-latched-by` annotation that
    `gpu-healthcheck clear` writes beside `<prefix>/clear-latched` (JSON)."""

    by: str  # the requester's Kubernetes identity (SelfSubjectReview), else the kubeconfig user
    reason: str
    at: str = ""  # RFC 3339, when it was asked
    force: bool = False  # asked although a current check still failed
    failing: tuple[str, ...] = ()  # with force: the checks that still failed then

    def encode(self) -> str:
        doc: dict[str, Any] = {"by": self.by, "reason": self.reason, "at": self.at}
        if self.force:
            doc["force"] = True
            doc["failing"] = list(self.failing)
        return encode(doc)

    @classmethod
    def decode(cls, raw: str | None) -> ClearRequest | None:
        """The request, or None when absent or unreadable (an Event then says by whom is unknown)."""
        doc = decode_results(raw)
        if doc is None or not isinstance(doc.get("by"), str) or not isinstance(doc.get("reason"), str):
            return None
        failing = doc.get("failing")
        return cls(
            by=doc["by"],
            reason=doc["reason"],
            at=str(doc.get("at") or ""),
            force=doc.get("force") is True,
            failing=tuple(str(x) for x in failing) if isinstance(failing, list) else (),
        )
