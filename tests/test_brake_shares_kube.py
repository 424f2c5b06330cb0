"""The brake: one share per node, whatever a token writes, and exact in a mixed fleet (issue 44).

On the real API server with manifests/ applied, every writer under a Node-bound token of the agent's
own ServiceAccount (the pod's token; the admission policies in force):

- a stolen token fills every numbered slot for its own node (the policy accepts each: it names the
  writer's node). The other nodes' taints are unaffected: a slot its holder's Node does not claim
  counts for nothing once past its grace, and a node counts once however many slots it holds;
- nodes tainted without a slot (an older version's, or by hand) count against the cap;
- an agent that starts on an untainted node frees the slot that node holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.core.marks import Marks
from agent.core.node_keys import TRUE, Keys
from agent.core.severity import Severity, Status
from agent.reporters.brake import Brake
from agent.reporters.brake_slots import Slots
from agent.reporters.kube_rest import KubeRest
from agent.reporters.node_writer import NodeWriter
from tests.conftest import brake_kw, shipped

pytestmark = pytest.mark.kube

MANIFESTS = Path(__file__).parent.parent / "manifests"
NS, SA = "gpu-healthcheck", "gpu-healthcheck-agent"
K = Keys()
GRACE_S = 2.0  # the slots' grace, short for the test (shipped: 120 s)


def taints_soon(w: NodeWriter, tries: int = 20) -> bool:
    """Applies a failing Marks until tainted: a refused node checks one slot it tried per ask (a
    random one), so a forged slot is found within a few asks, not always the first."""
    return any(w.apply(marks(True)).tainted for _ in range(tries))


def marks(fail: bool) -> Marks:
    status, sev = (Status.FAIL, Severity.RESET) if fail else (Status.PASS, Severity.NONE)
    doc = {"version": 1, "status": status.value, "severity": sev.label, "checks": [], "latched": []}
    return Marks(status=status, severity=sev, results_json=json.dumps(doc), taint=fail,
                 condition_message="GPU 0: Xid 79" if fail else "all checks passed")  # fmt: skip


@pytest.fixture(scope="module")
def installed(kube: Any) -> Any:
    kube.kubectl("apply", "--server-side", "-f", str(MANIFESTS))
    return kube


class Fleet:
    """GPU Nodes of the test's own (a brake scope), each with its agent's Node-bound token."""

    def __init__(self, kube: Any, gpu_node: Any, n: int) -> None:
        self.kube = kube
        self.nodes = [gpu_node().metadata.name for _ in range(n)]
        self.scope = f"kubernetes.io/hostname in ({','.join(self.nodes)})"
        self.clients: list[k8s.ApiClient] = []
        self.tokens = {
            n: kube.token_for(NS, SA, bound_node=n, expiration=600, create=False) for n in self.nodes
        }
        self.admin = KubeRest.of(kube.api_client())

    def rest(self, node: str) -> KubeRest:
        api = self.kube.api_client_for_token(self.tokens[node])
        self.clients.append(api)
        return KubeRest.of(api)

    def brake(self, node: str, **kw: Any) -> Brake:
        kw.setdefault("max_fraction", 1.0)
        return Brake(self.rest(node), scope=self.scope, node_name=node, namespace=NS, cache_seconds=0,
                     slot_grace_s=GRACE_S, audit_period_s=0, **brake_kw(kw))  # fmt: skip

    def writer(self, node: str, **kw: Any) -> NodeWriter:
        """The agent's Node writer and brake for *node*, under its token."""
        api = self.kube.api_client_for_token(self.tokens[node])
        self.clients.append(api)
        return NodeWriter(k8s.CoreV1Api(api), node, brake=self.brake(node, **kw), cfg=shipped())

    def tainted(self) -> set[str]:
        out = set()
        for n in self.nodes:
            node = self.admin.json("GET", f"/api/v1/nodes/{n}")
            if any(t.get("key") == K.taint for t in (node.get("spec") or {}).get("taints") or ()):
                out.add(n)
        return out

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.admin.json("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels") or {})

    def slots(self) -> list[str]:
        return sorted(
            t.name for t in Slots(self.admin, NS, "gpu-healthcheck", self.scope).tickets(min_rv=None)
        )

    def close(self) -> None:
        for s in Slots(self.admin, NS, "gpu-healthcheck", self.scope).tickets():
            Slots(self.admin, NS, "gpu-healthcheck", self.scope).free(s.name)
        for c in self.clients:
            c.close()


@pytest.fixture
def fleet(installed: Any, gpu_node: Any) -> Iterator[Any]:
    made: list[Fleet] = []

    def make(n: int) -> Fleet:
        made.append(Fleet(installed, gpu_node, n))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_one_stolen_token_filling_every_slot_leaves_the_other_nodes_taints_unaffected(fleet: Any) -> None:
    """Cap 2 (maxTaintedNodes). The attacker's token creates slots 0 and 1 for its own node: both
    accepted (201). Two failing nodes are still tainted, each on an overflow slot it claims; a third
    is refused at the cap. When the attacker also claims a slot and taints its own Node, it counts
    as one node: its one share."""
    f = fleet(5)
    x, a, b, c, _spare = f.nodes
    stolen = Slots(f.rest(x), NS, "gpu-healthcheck", f.scope)
    node_x = f.admin.json("GET", f"/api/v1/nodes/{x}")
    assert stolen.take(0, x, node_x) and stolen.take(1, x, node_x)  # the policy accepts both
    time.sleep(GRACE_S + 0.5)

    writers = {n: f.writer(n, max_nodes=2) for n in (a, b, c)}
    assert taints_soon(writers[a])
    assert taints_soon(writers[b])
    held = writers[c].apply(marks(True))
    assert held.brake_open and not held.tainted
    assert f.tainted() == {a, b}
    for n in (a, b):  # each claims the slot it holds on its own Node
        claim = f.labels(n).get(K.brake_slot, "")
        assert claim and f"gpu-healthcheck-taint-{claim}" in f.slots(), (claim, f.slots())
    state = writers[c].brake.state  # type: ignore[union-attr]
    assert state is not None and "2 nodes count now" in state.reason, state

    # a recovered node frees its share: the held one gets it
    assert not writers[a].apply(marks(False)).tainted
    assert taints_soon(writers[c])
    assert f.tainted() == {b, c}


def test_the_attacker_claiming_a_slot_counts_once(fleet: Any) -> None:
    f = fleet(4)
    x, a, b, _spare = f.nodes
    rest_x = f.rest(x)
    stolen = Slots(rest_x, NS, "gpu-healthcheck", f.scope)
    node_x = f.admin.json("GET", f"/api/v1/nodes/{x}")
    assert stolen.take(0, x, node_x) and stolen.take(1, x, node_x)
    # its own Node claims slot 0 and carries our taint (the Node policy lets a token change its own keys)
    rest_x.json("PATCH", f"/api/v1/nodes/{x}", body={"metadata": {"labels": {
        K.brake_slot: stolen.claim(stolen.name(0)), K.tainted: TRUE}}},
        content_type="application/merge-patch+json")  # fmt: skip
    time.sleep(GRACE_S + 0.5)
    wa, wb = f.writer(a, max_nodes=2), f.writer(b, max_nodes=2)
    assert taints_soon(wa)  # x counts once: 1 < 2
    assert not taints_soon(wb, tries=6)  # x and a: 2, the cap
    assert f.tainted() == {a}


def test_nodes_tainted_without_a_slot_count_against_the_cap(fleet: Any) -> None:
    """Two nodes carry our taint from an older version (taint and label, no slot, no claim): with a
    cap of 2 a new failing node is refused; when one of them recovers, it is tainted."""
    f = fleet(4)
    old1, old2, new, _spare = f.nodes
    taint = {"key": K.taint, "value": "reset", "effect": "NoSchedule"}
    for n in (old1, old2):
        f.admin.json("PATCH", f"/api/v1/nodes/{n}", body={"metadata": {"labels": {K.tainted: TRUE}},
                     "spec": {"taints": [taint]}}, content_type="application/merge-patch+json")  # fmt: skip
    w = f.writer(new, max_nodes=2)
    refused = w.apply(marks(True))
    assert refused.brake_open and not refused.tainted
    assert f.tainted() == {old1, old2}
    f.admin.json("PATCH", f"/api/v1/nodes/{old2}", body={"metadata": {"labels": {K.tainted: None}},
                 "spec": {"taints": []}}, content_type="application/merge-patch+json")  # fmt: skip
    deadline = time.monotonic() + 15  # the watch cache shows the untaint a moment later
    while not w.apply(marks(True)).tainted:
        assert time.monotonic() < deadline, w.brake.state  # type: ignore[union-attr]
        time.sleep(0.5)
    assert f.tainted() == {old1, new}


def test_an_agent_starting_on_an_untainted_node_frees_the_slot_it_holds(fleet: Any) -> None:
    f = fleet(2)
    n, _spare = f.nodes
    left = Slots(f.rest(n), NS, "gpu-healthcheck", f.scope)
    assert left.take(0, n, f.admin.json("GET", f"/api/v1/nodes/{n}"))  # its last life's, never freed
    assert f.slots() != []
    f.writer(n, max_nodes=1).apply(marks(False))
    deadline = time.monotonic() + 15  # the list is the watch cache's: it shows a delete a moment later
    while f.slots():
        assert time.monotonic() < deadline, f.slots()
        time.sleep(0.2)
