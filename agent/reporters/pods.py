"""The pods on this node that hold GPUs: the DCGM diag's idle gate asks before it stresses them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.reporters.kube_rest import KubeRest


def gpu_pods_on_node(core: Any, node_name: str) -> Callable[[], list[str]]:
    """Pods on this node that request nvidia.com/gpu and have not finished (idle gating)."""
    rest = KubeRest.of(core)
    selector = f"spec.nodeName={node_name},status.phase!=Succeeded,status.phase!=Failed"

    def pods() -> list[str]:
        listing = rest.json("GET", "/api/v1/pods", query={"fieldSelector": selector}, timeout=(5, 15))
        return gpu_pod_names(listing)

    return pods


def gpu_pod_names(listing: dict[str, Any]) -> list[str]:
    """Pure: namespace/name of the pods in a PodList whose containers or init containers request or
    limit nvidia.com/gpu."""
    out = []
    for pod in listing.get("items") or ():
        spec = pod.get("spec") or {}
        for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
            res = c.get("resources") or {}
            wanted = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            if str(wanted.get("nvidia.com/gpu", "0")) not in ("0", ""):
                meta = pod.get("metadata") or {}
                out.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
                break
    return out


def pods_unknown() -> list[str]:
    """Without API access nobody can tell whether a GPU pod runs here: never call the GPUs idle."""
    raise RuntimeError("no Kubernetes API access: cannot tell whether GPU pods run on this node")
