"""One identity, one share (production review 3, C2 and C3; issue 44 item 1): on the real API server,
with manifests/ applied, a stolen node-bound agent token (the pod's own, TokenRequest bound to its
Node) writes what the admission policies let it write of its own node, and the other nodes' agents,
each under its own node-bound token, are not held back by it:

- forged `mark` records (three of its own node): they count as one node of the repair budget;
- a forged `wave` marker for a key (with fail records of its own node): without its quorum of
  distinct failing nodes it holds back no other node;
- forged active-check `slot` records (as many as the bound): the node takes one slot, not all;
- forged fail records of its own node, named to fill the bounded list that confirms a marker's
  quorum: a genuine wave still holds (the full count decides).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.repair_budget import BudgetPolicy, WavePolicy
from agent.reporters.active_checks import FleetSlots
from agent.reporters.brake import Brake
from agent.reporters.budget_records import list_records
from agent.reporters.kube_rest import KubeRest
from agent.reporters.repair_budget import RepairBudget
from tests.conftest import brake_cfg, node_cfg
from tests.kubeenv.env import unique_name

pytestmark = pytest.mark.kube

ROOT = Path(__file__).parent.parent
NS, SA, PREFIX = "gpu-healthcheck", "gpu-healthcheck-agent", "gpu-healthcheck"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
NO_BUDGET, NO_WAVE = BudgetPolicy(max_nodes=0, max_fraction=1.0), WavePolicy(min_nodes=0)


def record(
    kind: str, node: str, uid: str, labels: dict[str, str] | None = None, **ann: str
) -> dict[str, Any]:
    """A Lease as a forger writes it: a record of its own node, owned by its own Node."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "generateName": f"{PREFIX}-{kind}-forged-",
            "labels": {f"{PREFIX}/record": kind, **(labels or {})},
            "annotations": {f"{PREFIX}/node": node, **{f"{PREFIX}/{k}": v for k, v in ann.items()}},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 86400},
    }


class Fleet:
    """GPU Nodes in a pool of their own, a node-bound agent token each; the forger is the first."""

    def __init__(self, kube: Any, gpu_node: Any, n: int) -> None:
        pool = unique_name("pool")
        self.kube, self.scope = kube, f"nvidia.com/gpu.present=true,test.example/pool={pool}"
        nodes = [gpu_node(labels={"test.example/pool": pool}) for _ in range(n)]
        self.names = [x.metadata.name for x in nodes]
        self.uids = {x.metadata.name: x.metadata.uid for x in nodes}
        self.tokens = {
            x: kube.token_for(NS, SA, bound_node=x, expiration=600, create=False) for x in self.names
        }
        self.clients: list[Any] = []

    def rest(self, node: str) -> KubeRest:
        client = self.kube.api_client_for_token(self.tokens[node])
        self.clients.append(client)
        return KubeRest.of(client)

    def forge(self, body: dict[str, Any]) -> int:
        """The forger's POST: 201 (the policy lets it through) or 403 (refused)."""
        status, doc = self.kube.request("POST", LEASES, body, token=self.tokens[self.names[0]])
        assert status in (201, 403), (status, doc)
        return int(status)

    def repair(self, node: str, budget: BudgetPolicy, wave: WavePolicy) -> RepairBudget:
        rest = self.rest(node)
        brake = Brake(
            rest, scope=self.scope, node_name=node, cache_seconds=0, cfg=brake_cfg(max_fraction=1.0)
        )
        return RepairBudget(
            rest, node, namespace=NS, brake=brake, cfg=node_cfg(budget, wave, prefix=PREFIX), hold_cache_s=0
        )

    def node_doc(self, node: str) -> dict[str, Any]:
        return dict(self.kube.request("GET", f"/api/v1/nodes/{node}")[1])

    def close(self) -> None:
        for c in self.clients:
            c.close()
        slots = {"labelSelector": f"{PREFIX}/record=slot"}
        with self.kube.api_client() as api:
            records = list_records(KubeRest.of(api), NS, PREFIX, kinds=("fail", "mark", "wave"))
        names = [r.name for r in records if r.node in self.names]
        for item in self.kube.request("GET", LEASES, query=slots)[1]["items"]:
            if item["metadata"].get("annotations", {}).get(f"{PREFIX}/node") in self.names:
                names.append(item["metadata"]["name"])
        for name in names:
            self.kube.request("DELETE", f"{LEASES}/{name}")

    def policy_in_force(self) -> None:
        """The records policy refuses the forger's release (a dry run): manifests/ is in force."""
        release = record("release", self.names[0], self.uids[self.names[0]])
        deadline = time.monotonic() + 30
        while True:
            got = self.kube.request(
                "POST", LEASES, release, query={"dryRun": "All"}, token=self.tokens[self.names[0]]
            )
            if got[0] == 403:
                return
            assert got[0] == 201 and time.monotonic() < deadline, (
                f"the records policy never took effect: {got}"
            )
            time.sleep(0.3)


@pytest.fixture
def fleets(kube: Any, gpu_node: Any) -> Iterator[Callable[[int], Fleet]]:
    """Fleets of *n* GPU Nodes; manifests/ applied and its records policy in force (a release
    refused)."""
    kube.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests"))
    made: list[Fleet] = []

    def make(n: int) -> Fleet:
        made.append(Fleet(kube, gpu_node, n))
        made[-1].policy_in_force()
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.fixture
def fleet(fleets: Callable[[int], Fleet]) -> Fleet:
    return fleets(3)


def settled(kube: Any, kind: str, node: str, n: int) -> None:
    """*node*'s *n* records of *kind* show in the watch cache the agents list from."""
    deadline = time.monotonic() + 10
    with kube.api_client() as api:
        while sum(r.node == node for r in list_records(KubeRest.of(api), NS, PREFIX, kinds=(kind,))) != n:
            assert time.monotonic() < deadline, f"{n} {kind} records of {node} never listed"
            time.sleep(0.1)


def test_forged_marks_of_one_node_spend_one_share_of_the_budget(fleet: Fleet) -> None:
    """Three marks of its own node (C2: "3 GPU nodes newly marked, the limit is 1"): with a budget of
    2, the next node is still marked (the forger counts once), and the one after it is held, by 2."""
    forger, b, c = fleet.names
    made = sum(fleet.forge(record("mark", forger, fleet.uids[forger])) == 201 for _ in range(3))
    settled(fleet.kube, "mark", forger, made)
    budget = BudgetPolicy(2, 1.0, 3600)
    assert fleet.repair(b, budget, NO_WAVE).decide(fleet.node_doc(b), "xid/79") is None
    held = fleet.repair(c, budget, NO_WAVE).decide(fleet.node_doc(c), "xid/79")
    if made:  # the forger's share and b's: c is the third node
        assert held is not None and held.why == "budget", held
        assert "2 GPU nodes newly marked" in held.message and "the limit is 2" in held.message, held
    else:
        assert held is None


def test_a_forged_wave_marker_holds_back_no_other_node(fleet: Fleet) -> None:
    """A wave marker of its own node on xid/79, with its own fail records (C2: "remediation held:
    forged wave: maintenance"): one node is no quorum of a wave of 3; the next node failing on the
    key is marked."""
    forger, b, _ = fleet.names
    uid, slug = fleet.uids[forger], {f"{PREFIX}/record-key": "xid_79"}
    for _ in range(2):
        fleet.forge(record("fail", forger, uid, slug, key="xid/79"))
    marker = record("wave", forger, uid, slug, key="xid/79", reason="forged wave: maintenance")
    if fleet.forge(marker) == 201:
        settled(fleet.kube, "wave", forger, 1)
    hold = fleet.repair(b, NO_BUDGET, WavePolicy(3, 0.0, 900)).decide(fleet.node_doc(b), "xid/79")
    assert hold is None, hold


def test_forged_fail_records_do_not_lift_a_genuine_wave_hold(fleets: Callable[[int], Fleet]) -> None:
    """A wave of 3 (its marker written by the node whose full count found it), and the forger's fail
    records of its own node named to come first in the key's list: the bounded list that confirms the
    marker's quorum shows one node; the full count decides, and the next node on the key is held."""
    fleet = fleets(5)
    forger, *wave, last = fleet.names
    for i in range(6):
        body = record("fail", forger, fleet.uids[forger], {f"{PREFIX}/record-key": "xid_79"}, key="xid/79")
        body["metadata"]["name"] = f"{PREFIX}-fail-0-{i}"
        fleet.forge(body)
    labels = {"metadata": {"labels": {f"{PREFIX}/status": "fail"}}}
    for n in [*wave, last]:  # what their Node writers show: failing
        fleet.kube.request("PATCH", f"/api/v1/nodes/{n}", labels, content_type="application/merge-patch+json")
    policy = WavePolicy(3, 0.0, 900)
    holds = [fleet.repair(n, NO_BUDGET, policy).decide(fleet.node_doc(n), "xid/79") for n in wave]
    assert holds[:2] == [None, None] and holds[2] is not None and holds[2].why == "wave", holds
    settled(fleet.kube, "wave", wave[2], 1)
    hold = fleet.repair(last, NO_BUDGET, policy).decide(fleet.node_doc(last), "xid/79")
    assert hold is not None and hold.why == "wave" and "GPU nodes fail on xid/79" in hold.message, hold


def test_forged_active_check_slots_take_one_slot(fleet: Fleet) -> None:
    """As many slot records of its own node as the bound (C3: every DCGM diag in the fleet stopped):
    with a bound of 2, the next node still takes a slot; the node after it waits (the forger holds
    one, the next node the other); once that one is given back, it takes it."""
    forger, b, c = fleet.names
    made = sum(fleet.forge(record("slot", forger, fleet.uids[forger])) == 201 for _ in range(2))

    def slots(node: str) -> FleetSlots:
        rest = fleet.rest(node)
        brake = Brake(rest, scope=fleet.scope, node_name=node, cfg=brake_cfg())
        cfg = node_cfg(activeChecks={"maxConcurrent": 2}, prefix=PREFIX)
        return FleetSlots(rest, node, namespace=NS, brake=brake, cfg=cfg)  # a slot counts 900 + 180 s

    second, third = slots(b), slots(c)
    assert second.acquire() is None
    got = third.acquire()
    assert (got is not None and "waiting for a fleet slot" in got) if made else got is None, got
    second.release()
    assert third.acquire() is None
    third.release()
