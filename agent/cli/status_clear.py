"""What `gpu-healthcheck status` shows of `clear` (cli/clear.py): the last request an agent acted on,
for CLEARED_WINDOW_S, and a request on the Node no agent acted on yet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.cli.status_node import NodeStatus
from agent.cli.status_time import age, seconds_since
from agent.core.marks import ClearRequest
from agent.core.node_keys import Keys
from agent.core.results_doc import LAST_CLEAR_FIELD

CLEARED_WINDOW_S = 24 * 3600  # a latch cleared by hand is shown this long


def cleared_by_hand(results: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The agent's record of the last clear-latched request, when it was acted on in the last 24 h."""
    done = results.get(LAST_CLEAR_FIELD)
    if not isinstance(done, Mapping):
        return None
    secs = seconds_since(done.get("at"), now)
    return dict(done) if secs is not None and secs <= CLEARED_WINDOW_S else None


def clear_pending(annotations: Mapping[str, Any], keys: Keys) -> dict[str, Any] | None:
    """A clear-latched request still on the Node (no agent has acted on it)."""
    value = annotations.get(keys.clear_latched)
    if value is None:
        return None
    request = ClearRequest.decode(annotations.get(keys.clear_latched_by))
    return {
        "requested": str(value),
        "by": request.by if request else None,
        "reason": request.reason if request else None,
        "at": request.at if request else None,
    }


def clear_lines(statuses: Sequence[NodeStatus], now: datetime) -> list[str]:
    """The section under the table: nodes whose latches were cleared by hand in the last 24 h, and
    requests no agent has acted on yet."""
    lines = []
    for s in statuses:
        for done, note in ((s.clearedByHand, ""), (s.clearPending, " (pending: no agent acted on it yet)")):
            if not done:
                continue
            who = done.get("by") or "an unnamed requester (kubectl annotate)"
            why = f": {done['reason']}" if done.get("reason") else ""
            latches = done.get("latches")
            what = ", ".join(latches) if isinstance(latches, list) else str(done.get("requested") or "-")
            forced = (
                f"; forced while {', '.join(done.get('failing') or ()) or 'a check'} failed"
                if done.get("force")
                else ""
            )
            lines.append(
                f"{s.node}  {age(done.get('at'), now)} ago by {who}{why} [{what or 'none'}]{forced}{note}"
            )
    return lines


__all__ = ["CLEARED_WINDOW_S", "clear_lines", "clear_pending", "cleared_by_hand"]
