"""The DCGM host engines in this node's pods, for the dcgm-health check's second-engine finding.

The only pods list the agent makes (which pods hold GPUs comes from the kubelet): this node's pods by
field selector, at most every REFRESH_S (an engine appears with a rollout, not from one poll to the
next; 2,000 agents polling every 30 s would be 70 lists a second). agent/probes/dcgm/engines.py says
what counts as an engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.probes.dcgm.engines import engines_in
from agent.reporters.kube_rest import KubeRest

REFRESH_S = 600.0


def dcgm_engines_on_node(
    core: Any, node_name: str, refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic
) -> Callable[[], list[str]]:
    rest = KubeRest.of(core)
    selector = f"spec.nodeName={node_name},status.phase=Running"
    last: list[tuple[float, list[str]]] = []

    def engines() -> list[str]:
        if last and clock() - last[0][0] < refresh_s:
            return last[0][1]
        found = engines_in(
            rest.json("GET", "/api/v1/pods", query={"fieldSelector": selector}, timeout=(5, 15))
        )
        last[:] = [(clock(), found)]  # an error raises and is asked again next time
        return found

    return engines
