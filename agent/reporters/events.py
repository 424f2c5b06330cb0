"""The Events the Node writer posts (DESIGN.md §4): their wording and their posting.

The wording is pure: the taint decision of one apply against the state the last one left says
which transitions deserve an Event (TaintAdded, TaintRemoved, TaintRestored, TaintDisabled,
BrakeOpen, BrakeClosed), each said once. The posting is one POST per Event to the API server,
involving the Node (with its uid when known); a failed POST is logged, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import DISABLED, EVENT_MESSAGE_MAX, WARNING, EventReason, Keys
from agent.core.results_doc import now_iso
from agent.reporters.kube_rest import KubeRest, describe_error
from agent.reporters.taint_gate import TaintDecision, TaintState

log = logging.getLogger(__name__)

Note = Callable[[str, str], None]  # (kind, outcome): the writer's on_write hook


def transition_events(
    marks: Marks,
    decided: TaintDecision,
    prev: TaintState,
    *,
    had_taint: bool,
    prefix: str,
) -> list[NodeEvent]:
    """The Events our own decisions deserve (taint added/removed/restored, brake, disabled): what
    *decided* changes against *prev*, the state the last apply left; *had_taint*: our taint was on
    the Node this apply read."""
    taint_on, brake_open, disabled = decided.taint_on, decided.brake_open, decided.disabled
    brake_reason = decided.brake_reason
    keys = Keys(prefix)
    taint = f"{keys.taint}={marks.taint_value}:{marks.taint_effect}"
    disable_label = f"{keys.taint_opt_out}={DISABLED}"
    out: list[NodeEvent] = []
    if taint_on and not had_taint:
        if prev.taint_on:
            out.append(
                NodeEvent(
                    EventReason.TAINT_RESTORED,
                    f"Taint {taint} was removed while the node fails; "
                    f"put it back (to stop tainting this node, label it {disable_label})",
                    WARNING,
                )
            )
        else:
            if prev.brake_open:
                out.append(
                    NodeEvent(
                        EventReason.BRAKE_CLOSED,
                        "Tainted GPU nodes are below the brake limit again; tainting this node",
                    )
                )
            out.append(
                NodeEvent(EventReason.TAINT_ADDED, f"Tainted {taint}: {marks.condition_message}", WARNING)
            )
    elif not taint_on and had_taint:
        if disabled:
            out.append(
                NodeEvent(
                    EventReason.TAINT_OPTED_OUT,
                    f"Removed taint {keys.taint}: label {disable_label} is set",
                )
            )
        else:
            out.append(
                NodeEvent(EventReason.TAINT_REMOVED, f"Removed taint {keys.taint}: {marks.condition_message}")
            )
    elif disabled and not prev.disabled:
        out.append(
            NodeEvent(
                EventReason.TAINT_OPTED_OUT,
                f"Not tainting although the node fails: label {disable_label} is set",
            )
        )
    if brake_open and not prev.brake_open:
        out.append(
            NodeEvent(
                EventReason.BRAKE_OPEN, f"Not tainting although the node fails: {brake_reason}", WARNING
            )
        )
    elif prev.brake_open and not brake_open and not taint_on:
        out.append(NodeEvent(EventReason.BRAKE_CLOSED, "The node no longer needs a taint"))
    return out


class EventPoster:
    """Posts NodeEvents about one Node to the API server."""

    def __init__(
        self,
        rest: KubeRest,
        node_name: str,
        *,
        namespace: str,
        component: str,
        request_timeout: tuple[float, float],
        note: Note,
    ) -> None:
        self.rest = rest
        self.node_name = node_name
        self.namespace = namespace
        self.component = component
        self.request_timeout = request_timeout
        self._note = note

    def post(
        self, events: Sequence[NodeEvent], node: Mapping[str, Any], *, dry_run: bool
    ) -> tuple[EventReason, ...]:
        """Post *events* about *node* (its uid from this copy); the reasons of those posted (or, dry
        run, that would be). A failed POST is logged and dropped: Events are best effort."""
        posted: list[EventReason] = []
        uid = (node.get("metadata") or {}).get("uid")
        for ev in events:
            if dry_run:
                log.info(
                    "node %s: dry run, would post Event %s (%s): %s",
                    self.node_name,
                    ev.reason,
                    ev.type,
                    ev.message,
                )
                self._note("event", "skipped")
                posted.append(ev.reason)
                continue
            now = now_iso()
            body = {
                "metadata": {"generateName": f"{self.node_name}.", "namespace": self.namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node_name,
                    **({"uid": uid} if uid else {}),
                },
                "reason": ev.reason,
                "message": ev.message[:EVENT_MESSAGE_MAX],
                "type": ev.type,
                "source": {"component": self.component, "host": self.node_name},
                "reportingComponent": self.component,
                "reportingInstance": self.node_name,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            try:
                self.rest.json(
                    "POST",
                    f"/api/v1/namespaces/{self.namespace}/events",
                    body=body,
                    timeout=self.request_timeout,
                )
            except Exception as exc:
                log.warning(
                    "node %s: posting Event %s failed: %s", self.node_name, ev.reason, describe_error(exc)
                )
                self._note("event", "error")
                continue
            log.info("node %s: Event %s (%s): %s", self.node_name, ev.reason, ev.type, ev.message)
            self._note("event", "ok")
            posted.append(ev.reason)
        return tuple(posted)


__all__ = ["EventPoster", "transition_events"]
