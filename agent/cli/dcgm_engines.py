"""The DCGM host engines in this node's pods, for the dcgm-health check's second-engine finding.

The agent already lists this node's pods for the diag's idle gate (its ClusterRole: list pods); this
reads the same list for engines (agent/probes/dcgm/engines.py says what counts as one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.probes.dcgm.engines import engines_in
from agent.reporters.kube_rest import KubeRest


def dcgm_engines_on_node(core: Any, node_name: str) -> Callable[[], list[str]]:
    rest = KubeRest.of(core)
    selector = f"spec.nodeName={node_name},status.phase=Running"

    def engines() -> list[str]:
        return engines_in(
            rest.json("GET", "/api/v1/pods", query={"fieldSelector": selector}, timeout=(5, 15))
        )

    return engines
