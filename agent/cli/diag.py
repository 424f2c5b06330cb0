"""`gpu-healthcheck diag NODE`: ask for a DCGM diag at the next idle window on one node, audited.

It sets `<prefix>/diag-requested` on the Node: who asked (the Kubernetes identity the API server sees,
by SelfSubjectReview; else the kubeconfig's user), why, when, and the level (--level; else the
agent's dcgm.diagLevel). The agent makes the diag due at once; it still runs only in an idle window
(no GPU held, a fleet slot free, the testing taint on: docs/guides/active-checks.md). When it starts the
agent removes the annotation and posts an ActiveCheckStarted Event naming who asked and why, as it
answers a `clear` with LatchesCleared, adds a `diag` entry by the requester to the history annotation,
and keeps the request as `lastDiag` in its results annotation with its outcome (started, completed,
aborted), which `gpu-healthcheck status` lists for 24 h beside requests not started yet
(cli/status_diag.py); the diag's result is the dcgm-diag check's, as any.

Exit codes, as `clear`'s: 0 requested (with --wait: the diag started); 2 no agent started it within
--wait (the request stays until one does); 64 usage (unknown node, no reason, a bad level); 69 the
cluster cannot be read or written.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.cli.clear import EXIT_OK, EXIT_UNKNOWN, ClearUsageError, Outcome
from agent.core.active_checks import DiagRequest
from agent.core.node_keys import Keys
from agent.core.results_doc import now_iso
from agent.reporters.kube_rest import MERGE_PATCH, REQUEST_TIMEOUT, KubeRest, api_status, node_path


def request_diag(
    rest: KubeRest,
    node_name: str,
    *,
    prefix: str,
    reason: str,
    who: str,
    level: int | None = None,
    wait_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Write the request; with *wait_s*, wait until the agent started the diag (it removes it)."""
    key = Keys(prefix).diag_requested
    request = DiagRequest(by=who, reason=reason, at=now_iso(), level=level)
    try:
        rest.json(
            "PATCH",
            node_path(node_name),
            body={"metadata": {"annotations": {key: request.encode()}}},
            content_type=MERGE_PATCH,
            query={"fieldManager": "gpu-healthcheck-diag"},
            timeout=REQUEST_TIMEOUT,
        )
    except Exception as exc:
        if api_status(exc) == 404:
            raise ClearUsageError(f"no such Node: {node_name}") from exc
        raise
    which = f"level {level}" if level else "the configured level"
    said = f"{node_name}: asked for a DCGM diag ({which}) at the next idle window as {who}: {reason}"
    if wait_s <= 0:
        return Outcome(EXIT_OK, said + "; the agent answers with an ActiveCheckStarted Event")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        sleep(0.5)
        node = rest.json("GET", node_path(node_name), timeout=REQUEST_TIMEOUT)
        if key not in ((node.get("metadata") or {}).get("annotations") or {}):
            return Outcome(EXIT_OK, f"{said}\nthe diag started")
    return Outcome(
        EXIT_UNKNOWN,
        f"{said}\nit did not start within {wait_s:g} s (GPUs busy, no fleet slot free, or no agent "
        f"with a DCGM engine on {node_name}); the request stays on the Node until it does",
    )


__all__ = ["request_diag"]
