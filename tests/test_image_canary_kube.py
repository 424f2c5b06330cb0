"""The image canary and the staged image rollout with the real DaemonSet controller (kube-controller-
manager's daemonset-controller) on the real API server: the shipped DaemonSets (manifests/60-agent.yaml
and manifests/optional/agent-canary.yaml) in a namespace of the test's own, held to the test's nodes
by a nodeSelector (the affinity, the strategy and minReadySeconds are the shipped ones).

- every GPU node runs exactly one agent: the main one, or the canary's where the node is labelled
  `gpu-healthcheck/track=canary`; the label moves a node from one to the other and back;
- `minReadySeconds`: a new image whose pod turns Ready and then crashes stops the rolling update at
  its first node; without minReadySeconds the same crash lets the wave go on.

No kubelet or scheduler runs here: the test binds each pod to the node it is made for, writes its
Ready condition and finishes its deletion as they would (class Kubelets, ready())."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import yaml_safe
from agent.core.node_keys import CANARY, TRACK_LABEL
from tests.kubeenv.env import unique_name

pytestmark = pytest.mark.kube

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "manifests" / "60-agent.yaml"
CANARY_DS = ROOT / "manifests" / "optional" / "agent-canary.yaml"
POOL = "test.example/pool"


@pytest.fixture
def daemonset_controller(kube: Any) -> Iterator[Any]:
    """The daemonset controller, for this test only (it makes pods for every DaemonSet there is)."""
    dsc = kube.plane.launch_controller_manager(unique_name("kcm-canary"), ["daemonset-controller"])
    yield dsc
    dsc.stop()


def install(kube: Any, ns: str, pool: str, *, min_ready: int | None = None) -> dict[str, dict[str, Any]]:
    """The shipped agent DaemonSets in *ns*, on the nodes of *pool* only; *min_ready*: another
    minReadySeconds (the shipped 180 s, shortened so that a test can wait it out)."""
    kube.ensure_namespace(ns)
    kube.create_service_account(ns, "gpu-healthcheck-agent")
    out = {}
    for path in (MAIN, CANARY_DS):
        ds = copy.deepcopy(yaml_safe.load(path.read_text()))
        ds["metadata"]["namespace"] = ns
        ds["spec"]["template"]["spec"]["nodeSelector"] = {POOL: pool}
        if min_ready is not None:
            ds["spec"]["minReadySeconds"] = min_ready
        out[ds["metadata"]["name"]] = ds
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(list(out.values())))
    return out


def pods(kube: Any, ns: str) -> list[dict[str, Any]]:
    status, doc = kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
    assert status == 200, doc
    return [p for p in doc["items"] if not p["metadata"].get("deletionTimestamp")]


def target(pod: dict[str, Any]) -> str:
    """The node a DaemonSet pod is made for (its matchFields term, as the controller writes it)."""
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        for field in term.get("matchFields") or ():
            return str(field["values"][0])
    raise AssertionError(f"no target node: {pod['metadata']['name']}")


def placement(kube: Any, ns: str) -> dict[str, list[str]]:
    """DaemonSet name -> the nodes its pods are for, sorted."""
    out: dict[str, list[str]] = {}
    for pod in pods(kube, ns):
        out.setdefault(pod["metadata"]["ownerReferences"][0]["name"], []).append(target(pod))
    return {k: sorted(v) for k, v in out.items()}


def until(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out: {what}: {got}")


class Kubelets:
    """What the scheduler and the kubelets would write for the pods of *ns* (none runs here): bind
    each new pod to the node it is made for, and finish a deletion (the kubelet's final DELETE with
    no grace period). The controller's node-update path finds pods by their bound node."""

    def __init__(self, kube: Any, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        base = f"/api/v1/namespaces/{self.ns}/pods"
        while not self.stop.wait(0.3):
            status, doc = self.kube.request("GET", base)
            for pod in doc.get("items") or () if status == 200 else ():
                name = pod["metadata"]["name"]
                if pod["metadata"].get("deletionTimestamp"):
                    self.kube.request("DELETE", f"{base}/{name}", {"gracePeriodSeconds": 0})
                elif not pod["spec"].get("nodeName"):
                    binding = {
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {"name": name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": target(pod)},
                    }
                    self.kube.request("POST", f"{base}/{name}/binding", binding)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def ready(kube: Any, ns: str, name: str, is_ready: bool, since: datetime | None = None) -> None:
    """Write a pod's Ready condition as its kubelet would."""
    at = (since or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cond = {"type": "Ready", "status": "True" if is_ready else "False", "lastTransitionTime": at}
    body = {"status": {"phase": "Running", "conditions": [cond]}}
    code, out = kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        body,
        content_type="application/merge-patch+json",
    )
    assert code == 200, out


def test_every_gpu_node_runs_one_agent_and_the_canary_label_moves_it(
    kube: Any, gpu_node: Callable[..., Any], daemonset_controller: Any
) -> None:
    pool, ns = unique_name("canary"), unique_name("gpuhc-canary", max_len=40)
    nodes = sorted(gpu_node(labels={POOL: pool}).metadata.name for _ in range(3))
    install(kube, ns, pool)
    kubelets = Kubelets(kube, ns)
    try:
        main, canary = "gpu-healthcheck-agent", "gpu-healthcheck-agent-canary"
        until(lambda: placement(kube, ns) == {main: nodes}, "one main agent on every node, no canary")
        kube.kubectl("label", "node", nodes[1], f"{TRACK_LABEL}={CANARY}")
        moved = {main: [nodes[0], nodes[2]], canary: [nodes[1]]}
        until(lambda: placement(kube, ns) == moved, "the labelled node's agent is the canary's")
        (pod,) = [p for p in pods(kube, ns) if target(p) == nodes[1]]
        assert pod["metadata"]["labels"][TRACK_LABEL] == CANARY
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-healthcheck-agent"
        time.sleep(3)  # settled: still one agent a node
        assert placement(kube, ns) == moved, daemonset_controller.tail()
        kube.kubectl("label", "node", nodes[1], f"{TRACK_LABEL}-")
        until(lambda: placement(kube, ns) == {main: nodes}, "back on the main DaemonSet")
    finally:
        kubelets.close()
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("min_ready", "crashes", "stops"),
    [(10, True, True), (0, True, False), (10, False, False)],
    ids=["min-ready-crash-stops", "no-min-ready-crash-goes-on", "min-ready-healthy-goes-on"],
)
def test_min_ready_seconds_stops_a_crashing_image_at_its_first_node(
    kube: Any,
    gpu_node: Callable[..., Any],
    daemonset_controller: Any,
    min_ready: int,
    crashes: bool,
    stops: bool,
) -> None:
    """Four nodes (maxUnavailable 10 %: one at a time). A new image: its first pod turns Ready, then
    crashes 3 s later (Ready False: a crash loop's restart). With minReadySeconds the pod never
    counted as available, so no other node is touched; without it the wave went on at once; a
    healthy pod goes on once Ready for minReadySeconds."""
    pool, ns = unique_name("wave"), unique_name("gpuhc-wave", max_len=40)
    for _ in range(4):
        gpu_node(labels={POOL: pool})
    shipped = yaml_safe.load(MAIN.read_text())["spec"]["minReadySeconds"]
    assert shipped == 180  # the tests shorten it only to wait it out
    main = install(kube, ns, pool, min_ready=min_ready)["gpu-healthcheck-agent"]
    kubelets = Kubelets(kube, ns)
    try:
        old = until(lambda: len(p := pods(kube, ns)) == 4 and p, "four agents")
        long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
        for pod in old:
            ready(kube, ns, pod["metadata"]["name"], True, long_ago)
        old_names = {p["metadata"]["name"] for p in old}
        image = main["spec"]["template"]["spec"]["containers"][0]["image"]
        kube.kubectl("-n", ns, "set", "image", "daemonset/gpu-healthcheck-agent", f"agent={image}-broken")

        def new_pods() -> list[dict[str, Any]]:
            return [p for p in pods(kube, ns) if p["metadata"]["name"] not in old_names]

        (first,) = until(new_pods, "the first pod of the new image")
        ready(kube, ns, first["metadata"]["name"], True)
        time.sleep(3)
        if crashes:
            ready(kube, ns, first["metadata"]["name"], False)  # it crashed
        watched = min_ready + 10.0
        deadline = time.monotonic() + watched
        while time.monotonic() < deadline and len(new_pods()) < 2:
            time.sleep(0.5)
        replaced = len(new_pods())
        left = len([p for p in pods(kube, ns) if p["metadata"]["name"] in old_names])
        if stops:
            assert (replaced, left) == (1, 3), (replaced, left, daemonset_controller.tail())
        else:
            assert replaced >= 2 and left <= 2, (replaced, left)
    finally:
        kubelets.close()
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
