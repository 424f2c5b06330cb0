"""What `gpu-healthcheck status` shows of `diag` (cli/diag.py), as it shows `clear` (cli/status_clear.py):
a request on the Node whose diag has not started yet (pending: no idle window, no fleet slot, or no
agent with a DCGM engine there), and the last request an agent started, with its outcome, for
DIAG_WINDOW_S."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.cli.status_node import NodeStatus
from agent.cli.status_time import age, seconds_since
from agent.core.active_checks import DiagRequest
from agent.core.node_keys import DIAG_ABORTED, DIAG_STARTED, Keys
from agent.core.results_doc import LAST_DIAG_FIELD

DIAG_WINDOW_S = 24 * 3600  # a requested diag is shown this long after it started


def diag_pending(annotations: Mapping[str, Any], keys: Keys) -> dict[str, Any] | None:
    """A `diag-requested` annotation still on the Node (its diag has not started)."""
    raw = annotations.get(keys.diag_requested)
    if raw is None:
        return None
    request = DiagRequest.decode(str(raw))
    return {
        "by": request.by or None,
        "reason": request.reason or None,
        "at": request.at or None,
        "level": request.level,
    }


def last_diag(results: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """The agent's record of the last requested diag (lastDiag), when it started in the last 24 h."""
    done = results.get(LAST_DIAG_FIELD)
    if not isinstance(done, Mapping):
        return None
    secs = seconds_since(done.get("startedAt"), now)
    return dict(done) if secs is not None and secs <= DIAG_WINDOW_S else None


def _asked(request: Mapping[str, Any], at: Any, level: Any, now: datetime) -> str:
    """ "asked 3m ago by alice@example.com: INC-7 [level 3]"."""
    when = age(at, now)
    who = request.get("by") or "an unnamed requester (kubectl annotate)"
    why = f": {request['reason']}" if request.get("reason") else ""
    what = f"level {level}" if level else "the configured level"
    return f"asked {when + ' ago' if when != '-' else 'at an unknown time'} by {who}{why} [{what}]"


def diag_lines(statuses: Sequence[NodeStatus], now: datetime) -> list[str]:
    """The section under the table: requests whose diag has not started, then those an agent
    started in the last 24 h (started, completed, aborted and why; one aborted for work says when it runs
    again, and its retry which try it is)."""
    lines = []
    for s in statuses:
        asked = s.diagPending
        if asked:
            said = _asked(asked, asked.get("at"), asked.get("level"), now)
            lines.append(f"{s.node}  {said}: pending (the diag has not started yet)")
    for s in statuses:
        done = s.lastDiag
        if done:
            outcome = str(done.get("outcome") or "-")
            when = done.get("endedAt") if outcome != DIAG_STARTED else done.get("startedAt")
            how = f"{outcome} {age(when, now)} ago"
            if isinstance(done.get("attempt"), int) and done["attempt"] > 1:
                how += f" (try {done['attempt']}: the earlier ones were aborted for work)"
            if outcome == DIAG_ABORTED and done.get("abortReason"):
                how += f": {done['abortReason']}"
            if outcome == DIAG_ABORTED and done.get("retryAt"):
                how += f"; it runs again once the GPUs are idle, not before {done['retryAt']}"
            said = _asked(done, done.get("requestedAt"), done.get("level"), now)
            lines.append(f"{s.node}  {said}: {how}")
    return lines


__all__ = ["DIAG_WINDOW_S", "diag_lines", "diag_pending", "last_diag"]
