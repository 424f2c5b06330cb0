"""What the engine wants the Node to show. The Node writer turns Marks into API writes."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.severity import Severity, Status


@dataclass(frozen=True)
class NodeEvent:
    """An Event on the Node (reason in CamelCase, as kubectl shows it)."""

    reason: str
    message: str
    type: str = "Normal"  # or "Warning"


@dataclass(frozen=True)
class Marks:
    """The desired state of this agent's keys on its own Node.

    `taint` is the engine's wish (status fail, after hysteresis); the writer still honours the
    `<prefix>/taint=disabled` label and the cluster-wide brake before adding a taint.
    """

    status: Status
    severity: Severity
    results_json: str  # the compact `<prefix>/results` annotation value
    taint: bool
    condition_status: str  # "True" | "False" | "Unknown"
    condition_reason: str  # CamelCase, e.g. "GPUFailed", "AllChecksPassed"
    condition_message: str
    events: tuple[NodeEvent, ...] = field(default=())
    drop_annotations: tuple[str, ...] = field(default=())  # our annotations to remove (consumed requests)
