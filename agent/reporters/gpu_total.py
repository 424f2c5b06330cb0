"""The GPU-node total the brake's fraction and the repair budget are taken of, without listing the fleet.

The agent's DaemonSet runs on every GPU node (its node affinity is the GPU-node selection,
core/gpu_nodes.py, written into manifests/60-agent.yaml and the chart by gen-configmap), so its
status.desiredNumberScheduled, kept by the DaemonSet controller, is the number of GPU nodes: one
read of the agents' own namespace, whatever the fleet's size, and nothing an agent can write (RBAC
gives it no write on DaemonSets). Every DaemonSet there whose pods run as the agent's
ServiceAccount counts (an image canary's DaemonSet beside the main one: they share the nodes
between them). None when there is none, it cannot be read, or its count is 0 (not counted yet: this
agent is one of its pods): the caller lists the Nodes instead.
"""

from __future__ import annotations

import logging

from agent.reporters.kube_rest import KubeRest, api_status, describe_error

log = logging.getLogger(__name__)

DEFAULT_SERVICE_ACCOUNT = "gpu-healthcheck-agent"  # manifests/10-rbac.yaml; $POD_SERVICE_ACCOUNT in a pod
TIMEOUT = (5, 30)


def daemonset_total(rest: KubeRest, namespace: str, service_account: str) -> int | None:
    """The GPU nodes the agent's DaemonSets are to run on (the sum of their desiredNumberScheduled),
    from the watch cache; None when no such DaemonSet is there or it cannot be read (403, 404)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    try:
        doc = rest.json("GET", path, query={"resourceVersion": "0"}, timeout=TIMEOUT)
    except Exception as exc:
        if api_status(exc) in (401, 403, 404):
            log.info("brake: the agent's DaemonSets cannot be read (%s): counting Nodes", describe_error(exc))
            return None
        raise
    ours = [
        d
        for d in doc.get("items") or ()
        if ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("serviceAccountName")
        == service_account
    ]
    total = sum(int((d.get("status") or {}).get("desiredNumberScheduled") or 0) for d in ours)
    return total or None  # 0: the controller has not counted yet (this agent is one of its pods)


__all__ = ["DEFAULT_SERVICE_ACCOUNT", "daemonset_total"]
