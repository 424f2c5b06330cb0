"""The repair budget and the wave hold on the real API server (issue 28 item 2): several Node
writers, each with its own Brake and RepairBudget, as the agents of several nodes would have; the
records are Leases in a namespace of the test's own."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.cli.brake import brake_footer, release
from agent.cli.status import render_status
from agent.core.marks import Marks
from agent.core.node_keys import EventReason
from agent.core.record_kind import RecordKind
from agent.core.remediation_types import RemediationMark, RemediationReason
from agent.core.repair_budget import BudgetPolicy, WavePolicy
from agent.core.results_doc import CONFIG_FIELD, WOULD_FIELD
from agent.core.severity import Severity, Status
from agent.reporters.brake import Brake
from agent.reporters.budget_records import list_records
from agent.reporters.kube_rest import KubeRest
from agent.reporters.node_writer import NodeWriter
from agent.reporters.repair_budget import RepairBudget
from tests.conftest import brake_cfg, node_cfg, shipped
from tests.kubeenv.env import unique_name

pytestmark = pytest.mark.kube

FAIL, MARK, RELEASE, WAVE = RecordKind.FAIL, RecordKind.MARK, RecordKind.RELEASE, RecordKind.WAVE
R = RemediationReason
AHR = "AcceleratedHardwareReady"
NO_BUDGET = BudgetPolicy(max_nodes=0, max_fraction=1.0)
NO_WAVE = WavePolicy(min_nodes=0)


def marks(key: str = "xid/79", fail: bool = True) -> Marks:
    status, sev = (Status.FAIL, Severity.REBOOT) if fail else (Status.PASS, Severity.NONE)
    doc = {"version": 1, "status": status.value, "severity": sev.label, "checks": [], "latched": []}
    # what the engine writes in every mode (engine/rollout.py): the config in force, what taint does
    doc[CONFIG_FIELD] = {"source": "main", "digest": "abc", "mode": "taint"}
    if fail:
        doc[WOULD_FIELD] = {"taint": "reboot:NoSchedule", "mark": [AHR]}
    return Marks(
        status=status,
        severity=sev,
        results_json=json.dumps(doc),
        taint=fail,
        condition_message=f"fail (reboot): {key}" if fail else "pass",
        remediation=(
            RemediationMark(
                AHR,
                "False",
                fail,
                R.FAILED if fail else R.PASSED,
                f"fail (reboot): {key}" if fail else "pass",
                key,
            ),
        ),
    )


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


class Fleet:
    """*n* GPU nodes in a pool of their own, one writer (Brake without a limit + RepairBudget) each."""

    def __init__(
        self,
        core: k8s.CoreV1Api,
        gpu_node: Any,
        namespace: str,
        n: int,
        budget: BudgetPolicy,
        wave: WavePolicy,
    ) -> None:
        pool = unique_name("pool")
        self.core, self.namespace = core, namespace
        self.scope = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
        self.names = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(n)]
        self.writers = {name: self.writer(name, budget, wave) for name in self.names}

    def writer(self, name: str, budget: BudgetPolicy, wave: WavePolicy) -> NodeWriter:
        brake = Brake(
            self.core, scope=self.scope, node_name=name, cache_seconds=0, cfg=brake_cfg(max_fraction=1.0)
        )
        repair = RepairBudget(
            self.core,
            name,
            namespace=self.namespace,
            brake=brake,
            cfg=node_cfg(budget, wave),
            hold_cache_s=0,
            marker_recheck_s=0,
        )
        return NodeWriter(self.core, name, brake=brake, repair=repair, cfg=shipped())

    def condition(self, name: str) -> tuple[str, str, str]:
        node = self.core.read_node(name)
        c = next(c for c in node.status.conditions if c.type == AHR)
        return c.status, c.reason, c.message

    def tainted(self, name: str) -> bool:
        return any(t.key == "gpu-healthcheck/unhealthy" for t in self.core.read_node(name).spec.taints or ())

    def events(self, name: str) -> list[str]:
        items = self.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
        return [e.reason for e in items]

    def records(self) -> list[Any]:
        return list_records(KubeRest.of(self.core), self.namespace, "gpu-healthcheck")

    def records_of(self, kind: str) -> list[Any]:
        return list_records(KubeRest.of(self.core), self.namespace, "gpu-healthcheck", kinds=(kind,))


def test_budget_reached_holds_the_next_node_with_its_reason_and_the_taint_stays(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    """Budget 2 per hour: the first two failing nodes are marked, the third and fourth keep our taint
    but their condition says GPUHealthcheckBudgetHeld, with one RemediationHeld Event each."""
    fleet = Fleet(core, gpu_node, kube_namespace, 4, BudgetPolicy(2, 1.0, 3600), NO_WAVE)
    results = {}
    for _ in range(2):  # two cycles: a held node stays held, and says so once
        results = {n: fleet.writers[n].apply(marks()) for n in fleet.names}
    a, b, c, d = fleet.names
    for n in (a, b):
        assert fleet.condition(n)[:2] == ("False", R.FAILED) and fleet.tainted(n)
        assert not results[n].remediation_held
    for n in (c, d):
        status, reason, message = fleet.condition(n)
        assert (status, reason) == ("True", R.BUDGET_HELD), message
        assert "the repair budget is spent: 2 GPU nodes newly marked" in message
        assert fleet.tainted(n)  # the taint still applies within the brake
        assert results[n].ok and results[n].remediation_held == "budget" and results[n].held_key == "xid/79"
        assert fleet.events(n).count(EventReason.REMEDIATION_HELD) == 1
    assert sum(r.kind == MARK for r in fleet.records()) == 2  # the held nodes' own marks were taken back
    # `gpu-healthcheck status` reads it from the Nodes: marked and held, not "4 would be marked"
    out, _ = render_status(core, selectors=[fleet.scope], namespace=kube_namespace)
    assert "taint (4 nodes): 4 nodes would be tainted (4 tainted), 2 marked for remediation, 2 held" in out, (
        out
    )
    assert f"GPUHealthcheckBudgetHeld: 2 node(s): {', '.join(sorted((c, d)))}" in out, out


def test_a_deleted_node_does_not_free_budget_within_the_window(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str, kube: Any
) -> None:
    """Budget 1 per 6 s: node a is marked, then deleted (as a repair engine does); node b, failing
    next, is still held until the window has passed; then it is marked."""
    fleet = Fleet(core, gpu_node, kube_namespace, 2, BudgetPolicy(1, 1.0, 6.0), NO_WAVE)
    a, b = fleet.names
    assert not fleet.writers[a].apply(marks()).remediation_held
    fleet.writers[a].stop()
    kube.delete_node(a)
    assert fleet.writers[b].apply(marks()).remediation_held == "budget"
    assert fleet.condition(b)[1] == R.BUDGET_HELD
    deadline = time.monotonic() + 30
    while fleet.writers[b].apply(marks()).remediation_held:
        assert time.monotonic() < deadline, "the budget's window never passed"
        time.sleep(1)
    assert fleet.condition(b)[:2] == ("False", R.FAILED)


def test_budget_races_never_mark_more_than_the_limit(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str, kube: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight agents ask at the same instant (a barrier, no brake in between), budget 3, and their
    first look finds no mark at all (a watch cache behind every write, the worst case): each writes
    its mark and counts the ones written before it, so exactly three go ahead, and the others take
    their marks back."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import agent.reporters.repair_budget as rb

    real = rb.list_records
    monkeypatch.setattr(
        rb,
        "list_records",
        lambda rest, ns, prefix, min_rv=None, **kw: real(rest, ns, prefix, min_rv, **kw) if min_rv else [],
    )

    fleet = Fleet(core, gpu_node, kube_namespace, 8, BudgetPolicy(3, 1.0, 3600), NO_WAVE)
    clients = [kube.api_client() for _ in fleet.names]  # a connection each, as separate agents have
    repairs = [
        RepairBudget(
            KubeRest.of(c),
            n,
            namespace=kube_namespace,
            brake=Brake(KubeRest.of(c), scope=fleet.scope, node_name=n, cfg=brake_cfg()),
            cfg=node_cfg(BudgetPolicy(3, 1.0, 3600), NO_WAVE),
            hold_cache_s=0,
        )
        for c, n in zip(clients, fleet.names, strict=True)
    ]
    barrier = threading.Barrier(len(repairs))

    def ask(repair: Any) -> Any:
        barrier.wait()
        return repair.decide({"metadata": {"name": repair.node_name}}, "xid/79")

    for r in repairs:
        r.brake.gpu_node_total()  # the GPU-node total read before the race (cached)
    with ThreadPoolExecutor(len(repairs)) as pool:
        holds = list(pool.map(ask, repairs))
    for c in clients:
        c.close()
    assert sum(h is None for h in holds) == 3
    assert sum(r.kind == MARK for r in fleet.records()) == 3


def test_the_wave_holds_at_n_nodes_on_one_key_not_another_ends_when_they_recover_and_release_is_audited(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    fleet = Fleet(core, gpu_node, kube_namespace, 6, NO_BUDGET, WavePolicy(3, 0.0, 900))
    a, b, c, d, e, f = fleet.names
    for n in (a, b, c, d):
        fleet.writers[n].apply(marks("xid/79"))
    assert [fleet.condition(n)[1] for n in (a, b, c, d)] == [R.FAILED, R.FAILED, R.WAVE_HELD, R.WAVE_HELD]
    assert "3 GPU nodes fail on xid/79" in fleet.condition(c)[2]
    assert fleet.tainted(c) and fleet.tainted(d)
    assert EventReason.REMEDIATION_HELD in fleet.events(c)
    # another key is no part of the wave
    assert not fleet.writers[e].apply(marks("gpu.responsive/timeout")).remediation_held
    assert fleet.condition(e)[:2] == ("False", R.FAILED)
    assert {r.node for r in fleet.records() if r.kind == FAIL and r.key == "xid/79"} == {a, b, c, d}

    # an operator releases it: audited, and the held nodes are marked at their next ask
    rest = KubeRest.of(core)
    said = release(
        rest,
        namespace=kube_namespace,
        prefix="gpu-healthcheck",
        key="xid/79",
        reason="bad AMI rolled back",
        who="sre-alice",
    )
    assert "released the wave hold on xid/79 as sre-alice: bad AMI rolled back" in said
    rel = [r for r in fleet.records() if r.kind == RELEASE]
    assert len(rel) == 1 and (rel[0].by, rel[0].reason, rel[0].key) == (
        "sre-alice",
        "bad AMI rolled back",
        "xid/79",
    )
    node_d = core.api_client.sanitize_for_serialization(core.read_node(d))
    footer = brake_footer(core, [node_d], kube_namespace, "gpu-healthcheck", datetime.now(timezone.utc))
    assert "HOLDS RELEASED BY HAND" in footer and "sre-alice: xid/79: bad AMI rolled back" in footer
    assert R.WAVE_HELD in footer
    for n in (c, d):
        assert not fleet.writers[n].apply(marks("xid/79")).remediation_held
        assert fleet.condition(n)[:2] == ("False", R.FAILED)
    # only failures after the release count toward a new wave: f is the first
    fleet.writers[f].apply(marks("xid/79"))
    assert fleet.condition(f)[1] == R.FAILED


def test_the_wave_ends_when_its_nodes_recover(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    fleet = Fleet(core, gpu_node, kube_namespace, 4, NO_BUDGET, WavePolicy(3, 0.0, 900))
    a, b, c, d = fleet.names
    for n in (a, b, c):
        fleet.writers[n].apply(marks())
    assert fleet.condition(c)[1] == R.WAVE_HELD
    assert fleet.writers[d].apply(marks()).remediation_held == "wave"
    for n in (a, b):  # two nodes of the wave recover: fewer than 3 still fail on xid/79
        fleet.writers[n].apply(marks(fail=False))
    assert not fleet.writers[c].apply(marks()).remediation_held
    assert fleet.condition(c)[:2] == ("False", R.FAILED)


def test_a_reloaded_budget_counts_from_the_next_ask(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    """node.repairBudget is live: the agent's reload hands the new policy to RepairBudget.reconfigure
    (cli/agent.py LiveParts), and the next apply of a held node is judged by it. Budget 1: the second
    node is held; raised to 2, the same node is marked at its next apply; the third stays held."""
    fleet = Fleet(core, gpu_node, kube_namespace, 3, BudgetPolicy(1, 1.0, 3600), NO_WAVE)
    a, b, c = fleet.names
    for n in fleet.names:
        fleet.writers[n].apply(marks())
    assert fleet.condition(a)[:2] == ("False", R.FAILED)
    assert fleet.condition(b)[:2] == ("True", R.BUDGET_HELD) and fleet.condition(c)[:2] == (
        "True",
        R.BUDGET_HELD,
    )

    for n in fleet.names:
        repair = fleet.writers[n].repair
        assert repair is not None
        repair.apply_config(repair.cfg, node_cfg(BudgetPolicy(2, 1.0, 3600), NO_WAVE))
    for n in (b, c):
        fleet.writers[n].apply(marks())
    assert fleet.condition(b)[:2] == ("False", R.FAILED)  # room for one more under the new budget
    status, reason, message = fleet.condition(c)
    assert (status, reason) == ("True", R.BUDGET_HELD) and "the limit is 2" in message, message


def test_a_wave_is_counted_by_few_and_held_for_the_rest_by_a_marker(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    """The node that finds the wave leaves a marker (its own record); a node failing later on the key
    is held by it with two small lists (the markers; the key's fail records up to a bound, the
    marker's quorum), without listing every fail record of the wave or the failing Nodes (what one
    agent reads does not grow with the wave); the marker goes when its node recovers."""
    fleet = Fleet(core, gpu_node, kube_namespace, 4, NO_BUDGET, WavePolicy(3, 0.0, 900))
    a, b, c, d = fleet.names
    for n in (a, b, c):
        fleet.writers[n].apply(marks("xid/79"))
    assert fleet.condition(c)[1] == R.WAVE_HELD
    [marker] = [r for r in fleet.records_of(WAVE) if r.key == "xid/79"]
    assert marker.node == c and "3 GPU nodes fail on xid/79" in marker.reason

    repair = fleet.writers[d].repair
    assert repair is not None
    asked: list[str] = []

    class Counting(KubeRest):
        def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            query = kw.get("query") or {}
            asked.append(f"{method} {path} {query.get('labelSelector', '')} limit={query.get('limit')}")
            return super().json(method, path, **kw)

    repair.rest = Counting(core.api_client)
    node_d = core.api_client.sanitize_for_serialization(core.read_node(d))
    hold = repair.decide(node_d, "xid/79")
    assert hold is not None and hold.why == "wave" and "3 GPU nodes fail on xid/79" in hold.message
    assert not [q for q in asked if "/api/v1/nodes" in q], asked
    fail_lists = [q for q in asked if "record in (fail)" in q]
    assert fail_lists and all(q.endswith("limit=6") for q in fail_lists), asked  # 2 x minNodes
    # asked again while the same markers stand, within marker_recheck_s: the quorum seen is kept
    again = RepairBudget(
        Counting(core.api_client), d, namespace=kube_namespace, brake=repair.brake,
        cfg=node_cfg(NO_BUDGET, WavePolicy(3, 0.0, 900)), hold_cache_s=0, marker_recheck_s=60,
    )  # fmt: skip
    asked.clear()
    assert all(again.decide(node_d, "xid/79") is not None for _ in range(3))
    assert sum("record in (fail)" in q for q in asked) == 1, asked
    fleet.writers[c].apply(marks(fail=False))  # the marker's node recovers: its marker goes with it
    assert not [r for r in fleet.records_of(WAVE) if r.node == c]
