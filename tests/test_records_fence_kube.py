"""The repair budget's records, fenced (docs/clusters/node-repair.md "Repair budget and wave hold"): on
the real API server, with manifests/ applied and an agent's Node-bound token of the manifests' own
ServiceAccount, the policy gpu-healthcheck-own-records lets the agent write its own node's `fail`
and `mark` records and refuses what would lift or fake the fleet's budget: a release, another
node's record (written, changed or deleted), a `by` that is not its own, a Lease that is not a
record. An operator's `gpu-healthcheck brake release` still works, under their own name; the
agent's real RepairBudget runs under its token without a refusal; the garbage collector removes a
fail record with its Node."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.record_kind import RecordKind
from agent.core.repair_budget import BudgetPolicy, WavePolicy
from agent.reporters.brake import Brake
from agent.reporters.budget_records import list_records
from agent.reporters.fence import FenceResult, prove_fence
from agent.reporters.kube_rest import KubeRest
from agent.reporters.repair_budget import RepairBudget
from tests.conftest import brake_cfg, node_cfg
from tests.kubeenv.env import unique_name

pytestmark = pytest.mark.kube

FAIL, MARK, RELEASE = RecordKind.FAIL, RecordKind.MARK, RecordKind.RELEASE
ROOT = Path(__file__).parent.parent
MANIFESTS = ROOT / "manifests"
NS, SA, PREFIX = "gpu-healthcheck", "gpu-healthcheck-agent", "gpu-healthcheck"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def lease(kind: str | None, node: str, **annotations: str) -> dict[str, Any]:
    labels = {f"{PREFIX}/record": kind} if kind else {}
    ann = {
        f"{PREFIX}/node": node,
        f"{PREFIX}/key": "xid/79",
        **{f"{PREFIX}/{k}": v for k, v in annotations.items()},
    }
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"generateName": f"{PREFIX}-{kind or 'other'}-", "labels": labels, "annotations": ann},
        "spec": {"holderIdentity": node},
    }


@pytest.fixture(scope="module")
def installed(kube: Any) -> Any:
    kube.kubectl("apply", "--server-side", "-f", str(MANIFESTS))
    return kube


@pytest.fixture
def agent(installed: Any, gpu_node: Any) -> Iterator[dict[str, Any]]:
    """Two GPU Nodes; a token of the agent's ServiceAccount bound to the first; the records policy in
    force (its first refusal seen)."""
    own = gpu_node()
    other = gpu_node()
    name, other_name = own.metadata.name, other.metadata.name
    token = installed.token_for(NS, SA, bound_node=name, expiration=600, create=False)
    deadline = time.monotonic() + 30
    while (
        got := installed.request("POST", LEASES, lease(RELEASE, name), query={"dryRun": "All"}, token=token)
    )[0] != 403:
        assert got[0] == 201 and time.monotonic() < deadline, f"the records policy never took effect: {got}"
        time.sleep(0.3)
    yield {"kube": installed, "node": name, "other": other_name, "token": token, "uid": own.metadata.uid}
    for r in list_records(KubeRest.of(installed.api_client()), NS, PREFIX):
        if r.node in (name, other_name):
            installed.request("DELETE", f"{LEASES}/{r.name}")


def denied(status_body: tuple[int, Any], why: str) -> None:
    status, body = status_body
    assert status == 403, (status, body)
    assert why in json.dumps(body), body


def test_an_agent_writes_only_its_own_nodes_fail_and_mark_records(agent: dict[str, Any]) -> None:
    kube, node, other, tok = agent["kube"], agent["node"], agent["other"], agent["token"]

    # forging a release (the production review's 201): refused, whoever it names
    denied(
        kube.request("POST", LEASES, lease(RELEASE, node, by="alice@example.com"), token=tok), "a release is"
    )
    denied(kube.request("POST", LEASES, lease(RELEASE, node), token=tok), "a release is an operator")
    # a record of another node, and a Lease that is no record
    denied(kube.request("POST", LEASES, lease(MARK, other), token=tok), "only the records of its own node")
    denied(kube.request("POST", LEASES, lease(FAIL, other), token=tok), "only the records of its own node")
    no_record = lease(None, node)
    denied(kube.request("POST", LEASES, no_record, token=tok), "only fail, mark, taint and wave records")
    # a `by` that is not the writer
    denied(
        kube.request("POST", LEASES, lease(MARK, node, by="alice@example.com"), token=tok),
        "must be its writer",
    )
    # owned by another Node
    owned = lease(FAIL, node)
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": other, "uid": "x"}]
    denied(kube.request("POST", LEASES, owned, token=tok), "owned by its own Node only")

    # its own node's records: written, and deleted by it
    ok = lease(FAIL, node)
    ok["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": agent["uid"]}
    ]
    status, mine = kube.request("POST", LEASES, ok, token=tok)
    assert status == 201, mine
    status, mark = kube.request("POST", LEASES, lease(MARK, node), token=tok)
    assert status == 201, mark

    # another node's mark (as its own agent wrote it): not deleted by this agent, nor changed
    status, theirs = kube.request("POST", LEASES, lease(MARK, other))
    assert status == 201, theirs
    denied(
        kube.request("DELETE", f"{LEASES}/{theirs['metadata']['name']}", token=tok),
        "only the records of its own node",
    )
    # an operator's release: the agent cannot delete it either (RBAC grants the agent no update)
    status, rel = kube.request("POST", LEASES, lease(RELEASE, "", by="an-operator"))
    assert status == 201, rel  # an identity the policy does not fence is never refused
    denied(kube.request("DELETE", f"{LEASES}/{rel['metadata']['name']}", token=tok), "a release is")
    assert kube.request("DELETE", f"{LEASES}/{rel['metadata']['name']}")[0] == 200

    for doc in (mine, mark):
        assert kube.request("DELETE", f"{LEASES}/{doc['metadata']['name']}", token=tok)[0] == 200
    assert kube.request("GET", f"{LEASES}/{theirs['metadata']['name']}")[0] == 200  # still there


def test_the_agents_fence_proof_covers_the_records(agent: dict[str, Any]) -> None:
    kube = agent["kube"]
    with kube.api_client_for_token(agent["token"]) as api:
        proof = prove_fence(api, agent["node"], PREFIX, NS)
    assert proof.result is FenceResult.FENCED and "a release record" in proof.detail, proof


def records_settled(rest: KubeRest, node: str, kinds: list[str]) -> list[Any]:
    """*node*'s records once their kinds are *kinds*: list_records reads the watch cache, which may
    show a write a moment after it was made."""
    deadline = time.monotonic() + 10
    while True:
        mine = [r for r in list_records(rest, NS, PREFIX) if r.node == node]
        if sorted(r.kind for r in mine) == kinds:
            return mine
        assert time.monotonic() < deadline, [r.kind for r in mine]
        time.sleep(0.1)


def test_the_agents_repair_budget_runs_under_its_token_without_a_refusal(agent: dict[str, Any]) -> None:
    """The real RepairBudget under the agent's token: its fail record (owned by its Node) and its
    mark land, a held node takes its own mark back, and a recovered node deletes its fail record."""
    kube, node, tok = agent["kube"], agent["node"], agent["token"]
    with kube.api_client_for_token(tok) as api:
        rest = KubeRest.of(api)
        brake = Brake(
            rest, scope=f"kubernetes.io/hostname={node}", node_name=node, cfg=brake_cfg(max_fraction=1.0)
        )
        repair = RepairBudget(
            rest,
            node,
            namespace=NS,
            brake=brake,
            cfg=node_cfg(BudgetPolicy(1, 1.0, 3600), WavePolicy(5, 0.0, 900), prefix=PREFIX),
            hold_cache_s=0,
        )
        node_doc = kube.request("GET", f"/api/v1/nodes/{node}")[1]
        assert repair.decide(node_doc, "xid/79") is None  # marked: the budget had room
        mine = records_settled(rest, node, [FAIL, MARK])
        fail = next(r for r in mine if r.kind == FAIL)
        got = kube.request("GET", f"{LEASES}/{fail.name}")[1]
        assert got["metadata"]["ownerReferences"][0]["name"] == node  # the garbage collector's link
        # another node marked since (as its agent writes it): asking again within the window (its
        # Node says nothing of the mark), this node is held, 2 nodes over a limit of 1
        status, theirs = kube.request("POST", LEASES, lease(MARK, agent["other"]))
        assert status == 201, theirs
        records_settled(rest, agent["other"], [MARK])
        hold = repair.decide(node_doc, "xid/79")
        assert hold is not None and hold.why == "budget", hold
        assert sum(r.kind == MARK for r in list_records(rest, NS, PREFIX) if r.node == node) == 1
        # recovered: its fail record goes (the agent's own delete)
        repair.recovered()
        records_settled(rest, node, [MARK])


def test_brake_release_as_an_admin_names_the_admin(agent: dict[str, Any], tmp_path: Path) -> None:
    """`gpu-healthcheck brake release` with the admin's kubeconfig: the release lands and its `by`
    is the user the API server authenticated (SelfSubjectReview)."""
    kube = agent["kube"]
    who = kube.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )[1]["status"]["userInfo"]["username"]
    key = f"test/{unique_name('k')}"
    argv = [sys.executable, "-m", "agent.cli", "brake", "release", "--key", key, "--reason", "INC-1: genuine"]
    argv += ["--kubeconfig", str(kube.kubeconfig)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"as {who}" in proc.stdout
    rel = [
        r
        for r in list_records(KubeRest.of(kube.api_client()), NS, PREFIX)
        if r.kind == RELEASE and r.key == key
    ]
    assert len(rel) == 1 and rel[0].by == who, rel
    kube.request("DELETE", f"{LEASES}/{rel[0].name}")


def test_the_garbage_collector_removes_a_fail_record_with_its_node(installed: Any, gpu_node: Any) -> None:
    kube = installed
    kcm = kube.plane.launch_controller_manager(
        unique_name("kcm-gc"), ("serviceaccount-controller", "garbage-collector-controller")
    )
    try:
        node = gpu_node(name=unique_name("gc-node"))
        name = node.metadata.name
        token = kube.token_for(NS, SA, bound_node=name, expiration=600, create=False)
        with kube.api_client_for_token(token) as api:
            rest = KubeRest.of(api)
            repair = RepairBudget(
                rest,
                name,
                namespace=NS,
                brake=Brake(
                    rest,
                    scope=f"kubernetes.io/hostname={name}",
                    node_name=name,
                    cfg=brake_cfg(max_fraction=1.0),
                ),
                cfg=node_cfg(BudgetPolicy(0, 1.0, 3600), WavePolicy(5, 0.0, 900), prefix=PREFIX),
                hold_cache_s=0,
            )
            assert repair.decide(kube.request("GET", f"/api/v1/nodes/{name}")[1], "xid/79") is None
        admin = KubeRest.of(kube.api_client())
        assert [r.kind for r in list_records(admin, NS, PREFIX) if r.node == name] == [FAIL]
        kube.delete_node(name)
        deadline = time.monotonic() + 60
        while [r for r in list_records(admin, NS, PREFIX) if r.node == name]:
            assert time.monotonic() < deadline, "the garbage collector never removed the fail record"
            time.sleep(0.5)
    finally:
        kcm.stop()


def test_brake_sweep_deletes_what_no_agent_may(agent: dict[str, Any]) -> None:
    """`brake sweep` (an operator's): marks older than its age (here: all, by a clock two hours
    ahead) and the fail records of Nodes that are gone; the fail record of a Node that is there
    stays."""
    from agent.cli.brake import sweep

    kube, node = agent["kube"], agent["node"]
    gone = unique_name("gone-node")
    made = {}
    for kind, who in ((MARK, node), (FAIL, node), (FAIL, gone)):
        status, doc = kube.request("POST", LEASES, lease(kind, who))
        assert status == 201, doc
        made[(kind, who)] = doc["metadata"]["name"]
    rest = KubeRest.of(kube.api_client())
    said = sweep(rest, namespace=NS, prefix=PREFIX, older_than_s=3600, now=time.time() + 7200)
    assert "fail records of Nodes that are gone" in said
    deleted = {made[(MARK, node)], made[(FAIL, gone)]}
    deadline = time.monotonic() + 15  # the list is the watch cache's: it shows a delete a moment later
    while deleted & (left := {r.name for r in list_records(rest, NS, PREFIX)}):
        assert time.monotonic() < deadline, f"still listed: {deleted & left}"
        time.sleep(0.2)
    assert made[(FAIL, node)] in left


def test_an_agent_takes_and_frees_only_its_own_nodes_brake_slot(agent: dict[str, Any]) -> None:
    """The brake's slots are records too: under its token the agent's Brake takes a slot for its
    own node (owned by its Node) and frees it; a slot named for another node is refused, and so is
    freeing another node's slot."""
    from agent.reporters.brake_slots import Slots

    kube, node, other, tok = agent["kube"], agent["node"], agent["other"], agent["token"]
    scope = f"kubernetes.io/hostname in ({node},{other})"
    with kube.api_client_for_token(tok) as api:
        rest = KubeRest.of(api)
        brake = Brake(
            rest, scope=scope, node_name=node, namespace=NS, cfg=brake_cfg(max_fraction=1.0, max_nodes=1)
        )
        ok, reason = brake.allows_new_taint(node)
        assert ok and brake.holds(node), reason
        mine = Slots(rest, NS, PREFIX, scope)
        status, body = kube.request(
            "POST",
            LEASES,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": mine.name(7),
                    "labels": {f"{PREFIX}/record": "taint"},
                    "annotations": {f"{PREFIX}/node": other},
                },
            },
            token=tok,
        )
        denied((status, body), "only the records of its own node")
        admin = Slots(KubeRest.of(kube.api_client()), NS, PREFIX, scope)
        assert admin.take(5, other)  # the other node's agent (here: the admin for it) takes one
        denied(
            kube.request("DELETE", f"{LEASES}/{admin.name(5)}", token=tok), "only the records of its own node"
        )
        brake.release(node)
        assert not brake.holds(node) and mine.held_by(node, consistent=True) == []
        admin.free(admin.name(5))
