"""What the engine hands the Node writer: the desired state of our keys (Marks), the Events to post, and an
operator's clear request as the CLI writes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.core.device_scope import Scope
from agent.core.node_keys import (
    CONDITIONS,
    CONFIG_REJECTED_REASON,
    DEFAULT_TAINT_EFFECT,
    NORMAL,
)
from agent.core.remediation_types import RemediationMark
from agent.core.results_doc import decode_results, encode
from agent.core.severity import Severity, Status


@dataclass(frozen=True)
class NodeEvent:
    """An Event on the Node (reason from Reason)."""

    reason: str
    message: str
    type: str = NORMAL  # or WARNING


@dataclass(frozen=True)
class Marks:
    """The desired state of this agent's keys on its own Node.

    `taint` is the engine's wish (status fail at taintMinSeverity or above, after hysteresis, mode
    `taint`); the writer still honours the `<prefix>/taint=disabled` label and the cluster-wide brake
    before adding a taint.
    """

    status: Status
    severity: Severity
    results_json: str  # the compact `<prefix>/results` annotation value
    taint: bool
    condition_message: str
    events: tuple[NodeEvent, ...] = field(default=())
    drop_annotations: tuple[str, ...] = field(default=())  # our annotations to remove (consumed requests)
    # The taint's value: the last failing severity, kept while a tainted node recovers or is unknown
    # (None: the verdict's severity).
    taint_severity: Severity | None = None
    taint_effect: str = DEFAULT_TAINT_EFFECT  # node.taintEffect or node.taintEffectBySeverity
    unhealthy_label: bool = False  # mode `label`: the label <prefix>/unhealthy instead of the taint
    config_rejected: bool = False  # the mounted config is invalid: the condition's reason says so
    # What of the annotation's trend reads makes a write necessary (core/trend_history.counters_digest).
    trends_digest: str = ""
    remediation: tuple[RemediationMark, ...] = field(default=())  # node.remediationConditions
    # The validating taint (Keys.validating): True = put it on, False = lift it where it is (a
    # complete pass), None = leave it as it is (engine/validation.py).
    validating: bool | None = None
    # Where the failing findings lie (core/device_scope; None: none at taintMinSeverity now): the
    # device-taint writer turns a taint confined to GPUs into DRA device taints (node.isolation).
    scope: Scope | None = None
    # Where the warnings lie (core/device_scope.warn_scope; mode taint only): a warning confined to
    # GPUs shows on those DRA devices as a taint of effect None, which moves no pod.
    warn_scope: Scope | None = None
    # For the `<prefix>/history` annotation (core/history_annotation.py): the worst finding's key of a
    # fail or warn ("" otherwise) and the boot the verdict is of.
    worst_key: str = ""
    boot_id: str = ""
    # The testing taint (Keys.testing): True while an active check holds the node, False = lift it
    # where it is, None = leave it (core/active_checks.py).
    testing: bool | None = None
    # The risk label's value (core/node_risk.py: high | normal); "" leaves the label as it is.
    risk: str = ""

    @property
    def taint_value(self) -> str:
        return (self.taint_severity or self.severity).label

    @property
    def condition_status(self) -> str:
        """The condition follows the status, so that no writer or test can pair them otherwise."""
        return CONDITIONS[self.status].status

    @property
    def condition_reason(self) -> str:
        """The status's reason, or ConfigRejected while the agent runs on a config it fell back to
        (the status still tells health; the message says which config is in force and why)."""
        return CONFIG_REJECTED_REASON if self.config_rejected else CONDITIONS[self.status].reason


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
