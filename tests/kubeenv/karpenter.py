"""Karpenter's real node repair on a control plane of its own, for tests (and later agent-driven ones).

``KarpenterCluster`` starts etcd + kube-apiserver, applies Karpenter's CRDs (copied out of the
sigs.k8s.io/karpenter module by scripts/build-karpenter.sh), and runs ``karpenter-kwok``
(tools/kube-bins/karpenter-kwok: Karpenter's own KWOK operator, whose provider gets one more repair policy,
``AcceleratedHardwareReady=False`` as Karpenter's AWS provider declares it) with the NodeRepair and
StaticCapacity feature gates on. A static NodePool (``spec.replicas``) makes Karpenter launch
NodeClaims without any pod; the KWOK provider creates their Nodes.

No kubelet runs, and KWOK's own node controller (which marks its nodes Ready in Karpenter's e2e
tests) does not either: ``NodeReadier`` plays that part, setting ``Ready=True`` on every Node Karpenter
launched, and nothing else. kube-controller-manager's node-lifecycle controller then lifts the
``node.kubernetes.io/not-ready`` taint that admission put on the new Node, as in any cluster (its
heartbeat grace periods are an hour, so it never marks these kubelet-less Nodes unreachable).
Everything Karpenter decides — which node is unhealthy, when its toleration ran out, the
replacement, the NodeClaim's deletion and the Node's removal — is Karpenter's own code.

It is a cluster of its own because Karpenter watches every Node and pod of the API server it runs
against; on the session's shared server it would see other tests' objects (and they its Nodes).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import go_tools
from .binaries import KubeBinaries
from .env import KubeEnv
from .server import ControlPlane, ControlPlaneError, ManagedProcess, free_ports

__all__ = ["BUILD_SCRIPT", "KarpenterCluster", "NodeReadier", "build_karpenter", "karpenter_cluster"]

ROOT = Path(__file__).resolve().parent.parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "build-karpenter.sh"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
KWOK_GROUP = "karpenter.kwok.sh"
NODE_LIFECYCLE_ARGS = ("--node-monitor-grace-period=1h", "--node-startup-grace-period=1h")
INSTANCE_TYPE = "c-1x-amd64-linux"  # one of the KWOK provider's built-in instance types


def build_karpenter() -> Path:
    """scripts/build-karpenter.sh's output directory (cached; about 5 min cold on 2 cores, usually
    built in the background since collection: tests/kubeenv/go_tools.py)."""
    built = go_tools.wait("karpenter")
    if built.error:
        raise ControlPlaneError(built.error)
    return Path(built.path)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeReadier:
    """Stands in for the kubelet (KWOK's node controller in Karpenter's own e2e): every Node that
    Karpenter launched gets ``Ready=True`` once. It writes nothing else."""

    def __init__(self, kube: KubeEnv, interval: float = 0.2) -> None:
        self.kube = kube
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-readier", daemon=True)
        self.readied: list[str] = []

    def start(self) -> NodeReadier:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self._once()

    def _once(self) -> None:
        status, nodes = self.kube.request("GET", "/api/v1/nodes", query={"labelSelector": NODEPOOL_LABEL})
        if status != 200:
            return
        for node in nodes["items"]:
            conditions = node.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" for c in conditions) or node["metadata"].get("deletionTimestamp"):
                continue
            now = _now()
            ready = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "set by the test's NodeReadier (no kubelet runs)",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            name = node["metadata"]["name"]
            code, _ = self.kube.request(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": {"conditions": [ready]}},
                content_type="application/strategic-merge-patch+json",
            )
            if code == 200:
                self.readied.append(name)


class KarpenterCluster:
    """etcd + kube-apiserver + Karpenter's CRDs + the karpenter-kwok operator + NodeReadier."""

    def __init__(self, binaries: KubeBinaries, build: Path, *, toleration: str = "5s") -> None:
        self.build = build
        self.toleration = toleration
        self.plane = ControlPlane(binaries)
        self.env: KubeEnv | None = None
        self.operator: ManagedProcess | None = None
        self.readier: NodeReadier | None = None
        self.health_port = 0

    @property
    def kube(self) -> KubeEnv:
        assert self.env is not None, "not started"
        return self.env

    @property
    def log(self) -> str:
        return self.operator.log_path.read_text(errors="replace") if self.operator else ""

    def start(self) -> KarpenterCluster:
        self.plane.start()
        self.env = kube = KubeEnv(self.plane)
        crds = sorted(str(p) for p in (self.build / "crds").glob("*.yaml"))
        kube.kubectl("apply", "--server-side", *(f"-f={p}" for p in crds))
        kube.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        self._node_class()
        self.plane.launch_controller_manager(
            "kcm-node-lifecycle", ["node-lifecycle-controller"], NODE_LIFECYCLE_ARGS
        )
        metrics, self.health_port = free_ports(2)
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env.update(
            KUBECONFIG=str(kube.kubeconfig),
            DISABLE_LEADER_ELECTION="true",
            METRICS_PORT=str(metrics),
            HEALTH_PROBE_PORT=str(self.health_port),
            FEATURE_GATES="NodeRepair=true,StaticCapacity=true",
            LOG_LEVEL="debug",
            GPUHC_REPAIR_TOLERATION=self.toleration,
            HOME=str(self.plane.workdir / "home"),
        )
        self.operator = ManagedProcess(
            "karpenter-kwok",
            [str(self.build / "karpenter-kwok")],
            self.plane.workdir / "karpenter-kwok.log",
            env=env,
            cwd=self.plane.workdir,
        )
        self.plane.extra_processes.append(self.operator)
        self._wait_ready(120)
        self.readier = NodeReadier(kube).start()
        return self

    def stop(self) -> None:
        if self.readier is not None:
            self.readier.stop()
        self.plane.stop()

    def _wait_ready(self, timeout: float) -> None:
        assert self.operator is not None
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with contextlib.suppress(OSError), opener.open(url, timeout=2) as r:
                if r.status == 200:
                    return
            if not self.operator.running():
                raise self.operator.failure("exited before it was ready")
            if time.monotonic() > deadline:
                raise self.operator.failure(f"not ready after {timeout:.0f}s")
            time.sleep(0.25)

    def _node_class(self) -> None:
        """The KWOK NodeClass every NodePool points at, Ready (as KWOK's e2e setup leaves it)."""
        kube = self.kube
        path = f"/apis/{KWOK_GROUP}/v1alpha1/kwoknodeclasses"
        body = {
            "apiVersion": f"{KWOK_GROUP}/v1alpha1",
            "kind": "KWOKNodeClass",
            "metadata": {"name": "default"},
        }
        status, out = kube.request("POST", path, body)
        assert status in (201, 409), out
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "Ready",
            "message": "",
            "lastTransitionTime": _now(),
        }
        status, out = kube.request(
            "PATCH",
            f"{path}/default/status",
            {"status": {"conditions": [ready]}},
            content_type="application/merge-patch+json",
        )
        assert status == 200, out

    # -- what tests do --------------------------------------------------------------------------
    def static_pool(
        self,
        name: str,
        replicas: int,
        instance_type: str = INSTANCE_TYPE,
        labels: dict[str, str] | None = None,
        startup_taints: list[dict[str, str]] | None = None,
    ) -> None:
        """A static NodePool of *replicas* nodes (with *labels*, and *startup_taints*: Karpenter puts
        them on each Node and calls it Initialized only once something else removed them), every
        disruption budget open (repair is paced by budgets), nothing consolidated or expired: node
        repair is the only thing that replaces. A repair in a static pool can race its replica
        count (two replacements, then any node of the pool scaled away), so a test keeps the nodes
        it expects to stay in a pool apart from the node it expects repaired."""
        pool = {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "template": {
                    "metadata": {"labels": dict(labels or {})},
                    "spec": {
                        "nodeClassRef": {"group": KWOK_GROUP, "kind": "KWOKNodeClass", "name": "default"},
                        "requirements": [
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "In",
                                "values": [instance_type],
                            }
                        ],
                        "expireAfter": "Never",
                        **({"startupTaints": list(startup_taints)} if startup_taints else {}),
                    },
                },
                "disruption": {"budgets": [{"nodes": "100%"}]},
            },
        }
        status, out = self.kube.request("POST", "/apis/karpenter.sh/v1/nodepools", pool)
        assert status == 201, out

    def nodeclaims(self, pool: str) -> list[dict[str, Any]]:
        status, out = self.kube.request(
            "GET", "/apis/karpenter.sh/v1/nodeclaims", query={"labelSelector": f"{NODEPOOL_LABEL}={pool}"}
        )
        assert status == 200, out
        return list(out["items"])

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        status, out = self.kube.request(
            "GET", "/api/v1/nodes", query={"labelSelector": f"{NODEPOOL_LABEL}={pool}"}
        )
        assert status == 200, out
        return list(out["items"])

    def initialized_nodes(self, pool: str) -> list[str]:
        """Node names of the pool's NodeClaims that Karpenter calls Initialized and not deleting."""
        names = []
        for claim in self.nodeclaims(pool):
            conditions = {c["type"]: c["status"] for c in claim.get("status", {}).get("conditions") or []}
            node = claim.get("status", {}).get("nodeName")
            if (
                node
                and conditions.get("Initialized") == "True"
                and not claim["metadata"].get("deletionTimestamp")
            ):
                names.append(node)
        return sorted(names)

    def initialized(self, node: str) -> str | None:
        """The Initialized condition's status of *node*'s NodeClaim (None: no claim or no condition)."""
        claim = self.claim_of(node) or {}
        found = [c for c in claim.get("status", {}).get("conditions") or [] if c["type"] == "Initialized"]
        return str(found[0]["status"]) if found else None

    def claim_of(self, node: str) -> dict[str, Any] | None:
        status, out = self.kube.request("GET", "/apis/karpenter.sh/v1/nodeclaims")
        assert status == 200, out
        return next((c for c in out["items"] if c.get("status", {}).get("nodeName") == node), None)

    def node(self, name: str) -> dict[str, Any] | None:
        status, out = self.kube.request("GET", f"/api/v1/nodes/{name}")
        return dict(out) if status == 200 else None

    def set_condition(self, node: str, ctype: str, status: str, reason: str, message: str) -> None:
        """Write one Node condition through nodes/status, as a node agent does."""
        now = _now()
        cond = {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        code, out = self.kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": {"conditions": [cond]}},
            content_type="application/strategic-merge-patch+json",
        )
        assert code == 200, out

    def events_for(self, name: str) -> list[dict[str, Any]]:
        status, out = self.kube.request(
            "GET", "/api/v1/events", query={"fieldSelector": f"involvedObject.name={name}"}
        )
        return list(out["items"]) if status == 200 else []


@contextlib.contextmanager
def karpenter_cluster(binaries: KubeBinaries, build: Path, **kwargs: Any) -> Iterator[KarpenterCluster]:
    cluster = KarpenterCluster(binaries, build, **kwargs)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[-3000:]
