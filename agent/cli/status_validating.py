"""What `gpu-healthcheck status` shows of the startup taint (docs/guides/validate-before-service.md): the
nodes that carry `<prefix>/validating`, for how long, and what each waits for.

A node whose agent reports says so itself (the results annotation's `validating`: since when, what
the pass still needs, engine/validation.py). A node whose agent never reported in this boot (no pod,
a pod that never started, a DCGM engine it cannot reach before its first verdict) says nothing: its
wait is counted from the Node's creation, the agent column says why, and that is the case the alert
GPUNodeValidatingWithoutAgent is for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.cli.status_node import NodeStatus
from agent.cli.status_time import human, seconds_since
from agent.core.node_keys import Keys
from agent.core.results_doc import VALIDATING_FIELD
from agent.engine.driver_wait import DRA_DRIVER
from agent.engine.validation import DRIVER_FIELD

NO_REPORT = "no report from an agent in this boot"


def validating(
    node: Mapping[str, Any], results: Mapping[str, Any], keys: Keys, now: datetime
) -> dict[str, Any] | None:
    """{since, seconds, waitingFor} while *node* carries the validating taint (None otherwise);
    waitingFor None: no agent said what it waits for."""
    taints = (node.get("spec") or {}).get("taints") or ()
    if not any(isinstance(t, Mapping) and t.get("key") == keys.validating for t in taints):
        return None
    meta = node.get("metadata") or {}
    boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
    said = results.get(VALIDATING_FIELD)
    if isinstance(said, Mapping) and (not boot or said.get("bootId") == boot):
        since, waiting = said.get("since"), [str(w) for w in said.get("waitingFor") or ()]
        driver = said.get(DRIVER_FIELD)  # the DRA driver wait, said ("… (7 of 8 published; …)")
        if isinstance(driver, str) and driver and DRA_DRIVER in waiting:
            waiting = [driver if w == DRA_DRIVER else w for w in waiting]
    else:
        since, waiting = meta.get("creationTimestamp"), None
    return {"since": since, "seconds": seconds_since(since, now), "waitingFor": waiting}


def validating_lines(statuses: Sequence[NodeStatus]) -> list[str]:
    """One line per validating node, the longest wait first: node, how long, what for."""
    waits = [s for s in statuses if s.validating is not None]
    waits.sort(key=lambda s: (-((s.validating or {}).get("seconds") or 0), s.node))
    width = max((len(s.node) for s in waits), default=0)
    out = []
    for s in waits:
        v = s.validating or {}
        secs = v.get("seconds")
        how_long = f"for {human(secs)}" if isinstance(secs, int) else "for ?"
        waiting = v.get("waitingFor")
        what = f"waiting for {', '.join(waiting)}" if waiting else f"{NO_REPORT} (agent: {s.agent})"
        out.append(f"{s.node.ljust(width)}   {how_long:<9} {what}")
    return out


__all__ = ["NO_REPORT", "validating", "validating_lines"]
