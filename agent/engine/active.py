"""The engine's side of active checks (core/active_checks.py): an operator's diag request seen on the
Node makes the DCGM diag due now; once the diag started, the request's annotation goes; the testing
taint is wanted while the diag thread holds the node (mode taint only: observe and label never taint)
and lifted otherwise, so a taint left by an agent that died mid-diag goes at the next write. The
record of the last request (the results annotation's `lastDiag`) is the diag thread's once it has
one, else the one a restarted agent found on the Node (restored)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.core.active_checks import ActiveState, DiagRequest, restored_record
from agent.core.node import NodeObject
from agent.core.node_keys import MODE_TAINT, Keys
from agent.core.results_doc import LAST_DIAG_FIELD
from agent.engine.side_step import SideStep

DIAG_TIER = "dcgm-diag"


@dataclass(frozen=True)
class ActiveStep(SideStep):
    """The testing taint, the request's annotation to remove, the Events to post (a SideStep), and
    the last request's record (None: this agent started none)."""

    record: dict[str, Any] | None = None


def restored(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """lastDiag from the results annotation a restarted agent read (core/active_checks.restored_record)."""
    return restored_record((doc or {}).get(LAST_DIAG_FIELD)) if isinstance(doc, dict) else None


def step(
    state: ActiveState | None, node: Any, prefix: str, mode: str, next_due: dict[str, float]
) -> ActiveStep:
    """One verdict's step. *state* None: no live DCGM tiers run here (a snapshot): nothing to do,
    and a request stays on the Node for an agent that can act on it."""
    if state is None:
        return ActiveStep()
    keys = Keys(prefix)
    drop: tuple[str, ...] = ()
    raw = node.annotations.get(keys.diag_requested) if isinstance(node, NodeObject) else None
    if raw is not None:
        request = DiagRequest.decode(raw)
        if state.ask(request):
            next_due[DIAG_TIER] = 0.0  # at the next idle window: now, if it is one
        elif state.done_with(request):
            drop = (keys.diag_requested,)
    return ActiveStep(
        testing=state.holding and mode == MODE_TAINT,
        drop=drop,
        events=state.take_events(),
        record=state.record,
    )


__all__ = ["ActiveStep", "restored", "step"]
