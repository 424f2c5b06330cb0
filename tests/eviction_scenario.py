"""One run of "a broken GPU under a NoExecute taint" on an EvictionCluster, shared by
tests/test_taint_eviction.py (which asserts) and bench/taint_eviction.py (which repeats it and prints).

Two GPU Nodes, each with the same pods bound to it: one with no toleration, one that tolerates our
taint, one that tolerates it for ``toleration_seconds``, and one per DaemonSet of manifests/ carrying
that DaemonSet's own tolerations. On each Node the REAL agent process runs on a snapshot-backed node
with ``taintEffectBySeverity`` set to NoExecute: on ``broken`` the snapshot is healthy until an Xid 79
line is appended to its kernel log; on ``blind`` nvidia-smi's output cannot be read, so the verdict
is ``unknown``. A PodDisruptionBudget (``maxUnavailable: 0``) covers every pod of the namespace.
The scenario waits until the two pods that should go from ``broken`` are gone, then records every
pod's state, the audit log's times, and what the Eviction API answers for a pod under that budget.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.core.node_keys import Keys
from tests.kubeenv.env import unique_name
from tests.kubeenv.eviction import EvictionCluster, daemonset_tolerations
from tests.kubeenv.waiting import wait_for
from tests.readme import section_docs

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)
KEYS = Keys()


def documented_policy() -> dict[str, Any]:
    """The docs' `node:` block for NoExecute (the one with taintEffectBySeverity)."""
    (doc,) = [d for d in section_docs() if "taintEffectBySeverity" in (d.get("node") or {})]
    return dict(doc["node"])


def documented_toleration() -> dict[str, Any]:
    """The docs' toleration for a workload that stays a while on a node we tainted NoExecute."""
    (doc,) = [d for d in section_docs() if "tolerations" in d]
    (tol,) = doc["tolerations"]
    return dict(tol)


def config() -> str:
    """The agent's config.yaml: the docs' policy (Xid 79 is judged `reboot`, which it makes
    NoExecute), a short gpu interval, and a brake that lets the one failing node in."""
    node = {**documented_policy(), "maxTaintedFraction": 1}
    return yaml.safe_dump({"intervals": {"gpu": 2}, "node": node})


def our_toleration(seconds: int | None = None) -> dict[str, Any]:
    """The docs' toleration, for *seconds* (or for good when None)."""
    tol = {k: v for k, v in documented_toleration().items() if k != "tolerationSeconds"}
    if seconds is not None:
        tol["tolerationSeconds"] = seconds
    return tol


class Agent:
    """`gpu-healthcheck agent` on a snapshot-backed node, as a child process (stopped by its PID)."""

    def __init__(
        self, node: str, snap: Path, kubeconfig: Path, work: Path, config_yaml: str | None = None
    ) -> None:
        cfg = work / "config"
        cfg.mkdir(parents=True, exist_ok=True)
        (cfg / "config.yaml").write_text(config() if config_yaml is None else config_yaml)
        self.log = work / "agent.log"
        argv = [
            sys.executable, "-m", "agent.cli", "agent", "--node", node, "--from-snapshot", str(snap),
            "--kubeconfig", str(kubeconfig), "--config-dir", str(cfg), "--state-dir", str(work / "state"),
            "--metrics-port", "0",
        ]  # fmt: skip
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Outcome:
    namespace: str
    broken: str
    blind: str
    toleration_seconds: int
    # pod name -> (node, kind); kind is plain | tolerates | timed | a DaemonSet's name
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)
    evicted: dict[str, bool] = field(default_factory=dict)  # at the end: deletionTimestamp set
    disruption_reason: dict[str, str] = field(default_factory=dict)  # DisruptionTarget's reason
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> labels at the end
    taints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node -> taints at the end
    taint_at: float | None = None  # server time of the agent's PATCH adding the NoExecute taint
    evicted_at: dict[str, float] = field(default_factory=dict)  # pod -> server time of its DELETE
    agent_writes: list[Any] = field(default_factory=list)  # the agents' audited writes
    agent_logs: dict[str, str] = field(default_factory=dict)
    eviction_api: tuple[int, str] = (0, "")  # the Eviction API's answer for a pod under the PDB

    def pod(self, node: str, kind: str) -> str:
        return next(p for p, (n, k) in self.pods.items() if n == node and k == kind)

    def seconds_after_taint(self, pod: str) -> float | None:
        if self.taint_at is None or pod not in self.evicted_at:
            return None
        return self.evicted_at[pod] - self.taint_at


def snapshot(dest: Path, *, readable: bool = True) -> Path:
    """A copy of the healthy p5.48xlarge snapshot; *readable* False: nvidia-smi answers with bytes
    that are no nvidia-smi output (the verdict is unknown)."""
    shutil.copytree(HEALTHY, dest, symlinks=True)
    if not readable:
        (dest / "nvidia-smi-q.txt").write_bytes(b"\x00\x01 not nvidia-smi output")
    return dest


def append_xid79(snap: Path) -> None:
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)


def running(kube: Any, ns: str, name: str) -> None:
    """Mark a pod Running and Ready as a kubelet would (none runs here): the Eviction API lets a
    Pending pod go whatever its PodDisruptionBudget says, a Running one it holds to it."""
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
    code, body = kube.request("PATCH", path, {"status": status}, content_type="application/merge-patch+json")
    assert code == 200, body


def run(cluster: EvictionCluster, work: Path, toleration_seconds: int = 5, settle: float = 1.0) -> Outcome:
    """One run (see the module docstring). *settle*: seconds to keep watching after the timed pod
    went, so that a pod that should stay has had that long to be (wrongly) evicted."""
    kube = cluster.kube
    ns = unique_name("evict", max_len=30)
    kube.ensure_namespace(ns)
    cluster.wait_service_account(ns)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "no-disruption"},
        "spec": {"maxUnavailable": 0, "selector": {}},  # every pod of the namespace
    }
    created, body = kube.request("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb)
    assert created == 201, body
    out = Outcome(ns, unique_name("broken"), unique_name("blind"), toleration_seconds)
    kinds: dict[str, list[dict[str, Any]]] = {
        "plain": [],
        "tolerates": [our_toleration()],
        "timed": [our_toleration(toleration_seconds)],
        **daemonset_tolerations(),
    }
    kubeconfig = cluster.agent_kubeconfig()
    agents: dict[str, Agent] = {}
    try:
        for node in (out.broken, out.blind):
            kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
            for kind, tolerations in kinds.items():
                name = f"{node}-{kind}"[:63].rstrip("-")
                cluster.make_pod(ns, name, node, tolerations)
                running(kube, ns, name)
                out.pods[name] = (node, kind)
            snap = snapshot(work / node / "snap", readable=node != out.blind)
            agents[node] = Agent(node, snap, kubeconfig, work / node)

        def status(node: str) -> str | None:
            labels = kube.request("GET", f"/api/v1/nodes/{node}")[1]["metadata"].get("labels") or {}
            return labels.get(KEYS.status)

        wait_for(lambda: status(out.broken) == "pass", 60, "the healthy node's first verdict (pass)")
        wait_for(lambda: status(out.blind) == "unknown", 60, "the blind node's first verdict (unknown)")
        append_xid79(work / out.broken / "snap")
        for kind in ("plain", "timed"):
            pod = out.pod(out.broken, kind)
            wait_for(lambda p=pod: cluster.evicted(ns, p), 60 + toleration_seconds, f"{pod} evicted")
        time.sleep(settle)
    finally:
        for node, agent in agents.items():
            agent.stop()
            out.agent_logs[node] = agent.log.read_text()[-4000:]

    for name in out.pods:
        pod = cluster.pod(ns, name)
        out.evicted[name] = bool(pod["metadata"].get("deletionTimestamp"))
        target = [c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "DisruptionTarget"]
        if target:
            out.disruption_reason[name] = target[0].get("reason", "")
    for node in (out.broken, out.blind):
        obj = kube.request("GET", f"/api/v1/nodes/{node}")[1]
        out.labels[node] = obj["metadata"].get("labels") or {}
        out.taints[node] = obj["spec"].get("taints") or []
    stays = out.pod(out.blind, "plain")  # what `kubectl drain` would ask: refused by the budget
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": stays, "namespace": ns}}
    code, answer = kube.request("POST", f"/api/v1/namespaces/{ns}/pods/{stays}/eviction", eviction)
    out.eviction_api = (code, str(answer.get("message", "")) if isinstance(answer, dict) else str(answer))
    out.taint_at = cluster.taint_added_at(out.broken, KEYS.taint)
    out.evicted_at = cluster.evictions(ns)
    out.agent_writes = cluster.agent_writes()
    return out
