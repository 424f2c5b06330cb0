"""Kubernetes' own taint-based eviction on a control plane of its own, for tests and bench/.

``EvictionCluster`` starts etcd + kube-apiserver with the audit log on (tests/kubeenv/audit.py), and
one kube-controller-manager running the ``taint-eviction-controller`` (with the node-lifecycle
controller it needs, see EVICTION_CONTROLLERS, and the serviceaccount controller, so namespaces get
their ``default`` ServiceAccount and pods are admitted). It is a
cluster of its own because the taint-eviction controller acts on every Node: on the session's shared
API server it would delete other tests' pods, and the audit flags must be given at start.

No kubelet runs. A pod the controller evicts is *deleted*: the API server sets its
``deletionTimestamp`` (and the controller first adds the ``DisruptionTarget`` condition, reason
``DeletionByTaintManager``); a kubelet would then stop its containers within the pod's grace period
and remove the object. Here the object stays Terminating, so "evicted" means: the controller's
DELETE was accepted (``deletionTimestamp`` set). Figures are the server's own audit timestamps, from
the completion of the agent's PATCH that added the taint to the completion of the controller's DELETE.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.config import yaml_safe

from .audit import AuditEvent, audit_args, read_audit
from .binaries import KubeBinaries
from .env import KubeEnv
from .server import ControlPlane, ControlPlaneError, ManagedProcess

__all__ = [
    "AGENT_NAMESPACE",
    "AGENT_SERVICE_ACCOUNT",
    "EVICTION_CONTROLLERS",
    "EvictionCluster",
    "daemonset_tolerations",
    "eviction_cluster",
]

# The taint-eviction controller finds a Node's pods through the shared pod informer's spec.nodeName
# index, which (v1.34 to v1.37) only the node-lifecycle, daemonset and podgc controllers add: alone it
# logs "Index with name spec.nodeName does not exist" and evicts nothing. Real clusters run it with
# node-lifecycle, so this does too, with the heartbeat grace periods long enough that it never
# marks these kubelet-less Nodes unreachable (which would taint them NoExecute itself).
EVICTION_CONTROLLERS = ("serviceaccount-controller", "node-lifecycle-controller", "taint-eviction-controller")
EVICTION_CONTROLLER_ARGS = ("--node-monitor-grace-period=1h", "--node-startup-grace-period=1h")
# kube-controller-manager (v1.34 to v1.37) builds the taint-eviction controller's client as "node-controller".
TAINT_EVICTION_USER = "system:serviceaccount:kube-system:node-controller"
AGENT_NAMESPACE = "gpu-healthcheck"
AGENT_SERVICE_ACCOUNT = "agent-under-test"
MANIFESTS = Path(__file__).resolve().parent.parent.parent / "manifests"


def daemonset_tolerations(manifests: Path = MANIFESTS) -> dict[str, list[dict[str, Any]]]:
    """DaemonSet name -> its pod template's tolerations, as the shipped manifests/ declare them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(manifests.glob("*.yaml")):
        for doc in yaml_safe.load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "DaemonSet":
                spec = doc["spec"]["template"]["spec"]
                out[doc["metadata"]["name"]] = list(spec.get("tolerations") or [])
    return out


class EvictionCluster:
    """etcd + kube-apiserver (audit log on) + kube-controller-manager's taint-eviction controller."""

    def __init__(self, binaries: KubeBinaries) -> None:
        self.plane = ControlPlane(binaries)
        self.audit_log = self.plane.workdir / "audit" / "audit.log"
        self.plane.extra_apiserver_args += audit_args(self.audit_log.parent)
        self.env: KubeEnv | None = None
        self.kcm: ManagedProcess | None = None
        self.agent_user = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"

    @property
    def kube(self) -> KubeEnv:
        assert self.env is not None, "not started"
        return self.env

    def start(self) -> EvictionCluster:
        self.plane.start()
        self.env = KubeEnv(self.plane)
        self.kcm = self.plane.launch_controller_manager(
            "kcm-taint-eviction", EVICTION_CONTROLLERS, EVICTION_CONTROLLER_ARGS
        )
        self.wait_service_account("default")
        return self

    def stop(self) -> None:
        self.plane.stop()

    # -- objects --------------------------------------------------------------------------------
    def wait_service_account(self, namespace: str, timeout: float = 60) -> None:
        """Pods are admitted once the serviceaccount controller made *namespace*'s ``default``."""
        assert self.kcm is not None
        deadline = time.monotonic() + timeout
        while self.kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] != 200:
            if not self.kcm.running():
                raise self.kcm.failure("exited")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"no default ServiceAccount in {namespace} after {timeout:.0f}s")
            time.sleep(0.2)

    def agent_kubeconfig(self) -> Path:
        """A kubeconfig for the agent under test: a ServiceAccount of its own (so the audit log tells
        its requests apart), bound to cluster-admin, so that a delete or an eviction it attempted
        would succeed and be seen rather than be refused by RBAC."""
        kube = self.kube
        kube.create_service_account(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT)
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "agent-under-test-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE}
            ],
        }
        status, body = kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        assert status in (201, 409), body
        token = kube.token_for(AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, create=False)
        return kube.kubeconfig_for_token(token)

    def make_pod(
        self, namespace: str, name: str, node: str, tolerations: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """A pod bound to *node* (``spec.nodeName``: no scheduler runs) with these tolerations."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "nodeName": node,
                "tolerations": [dict(t) for t in tolerations],
                "automountServiceAccountToken": False,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        status, out = self.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        assert status == 201, out
        return dict(out)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        status, out = self.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert status == 200, out
        return dict(out)

    def evicted(self, namespace: str, name: str) -> bool:
        """The pod's deletion was accepted (it stays Terminating: no kubelet runs)."""
        return bool(self.pod(namespace, name)["metadata"].get("deletionTimestamp"))

    # -- the audit log --------------------------------------------------------------------------
    def audit(self) -> list[AuditEvent]:
        return read_audit(self.audit_log)

    def agent_writes(self) -> list[AuditEvent]:
        return [e for e in self.audit() if e.user == self.agent_user]

    def taint_added_at(self, node: str, taint_key: str, effect: str = "NoExecute") -> float | None:
        """Server time the agent's first PATCH that put *taint_key* with *effect* on *node* completed."""
        for e in self.agent_writes():
            if e.resource != "nodes" or e.name != node or e.verb != "patch" or e.code >= 300:
                continue
            taints = ((e.request or {}).get("spec") or {}).get("taints") or []
            if any(t.get("key") == taint_key and t.get("effect") == effect for t in taints):
                return e.completed
        return None

    def evictions(self, namespace: str) -> dict[str, float]:
        """Pod name -> server time the taint-eviction controller's DELETE of it completed."""
        return {
            e.name: e.completed
            for e in self.audit()
            if e.user == TAINT_EVICTION_USER
            and e.verb == "delete"
            and e.resource == "pods"
            and e.namespace == namespace
            and e.code < 300
        }


@contextmanager
def eviction_cluster(binaries: KubeBinaries) -> Iterator[EvictionCluster]:
    cluster = EvictionCluster(binaries)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def pretty(events: Sequence[AuditEvent]) -> str:
    return json.dumps([e.what for e in events], indent=1)
