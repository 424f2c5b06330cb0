"""The engine's side of active checks (core/active_checks.py): an operator's diag request seen on the
Node makes the DCGM diag due now; once the diag started, the request's annotation goes; the testing
taint is wanted while the diag thread holds the node (mode taint only: observe and label never taint)
and lifted otherwise, so a taint left by an agent that died mid-diag goes at the next write."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.core.active_checks import ActiveState, DiagRequest
from agent.core.marks import NodeEvent
from agent.core.node import NodeObject
from agent.core.node_keys import MODE_TAINT, Keys

DIAG_TIER = "dcgm-diag"


@dataclass(frozen=True)
class ActiveStep:
    """Marks.testing, our annotations to remove, the Events to post."""

    testing: bool | None = None
    drop: tuple[str, ...] = ()
    events: tuple[NodeEvent, ...] = ()


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
    return ActiveStep(state.holding and mode == MODE_TAINT, drop, state.take_events())


__all__ = ["ActiveStep", "step"]
