"""The taint brake: its cap (pure) and its slots across many writers on a real API server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from agent.core.marks import Marks
from agent.core.node_keys import TRUE, EventReason, Keys
from agent.core.record_kind import RecordKind
from agent.core.severity import Severity, Status
from agent.reporters.brake import Brake, names_in_list
from agent.reporters.brake_rule import brake_cap
from agent.reporters.brake_slots import Slots
from agent.reporters.kube_rest import KubeRest
from agent.reporters.node_writer import NodeWriter
from tests.conftest import brake_cfg, brake_kw, shipped
from tests.kubeenv.env import unique_name

K = Keys()
SLOT = RecordKind.TAINT  # the brake's slots
TAINT = K.taint


def _marks(fail: bool) -> Marks:
    status, sev = (Status.FAIL, Severity.RESET) if fail else (Status.PASS, Severity.NONE)
    doc = {"version": 1, "status": status.value, "severity": sev.label, "checks": [], "latched": []}
    return Marks(
        status=status,
        severity=sev,
        results_json=json.dumps(doc),
        taint=fail,
        condition_message="GPU 0: double-bit ECC error" if fail else "all checks passed",
    )


@pytest.mark.parametrize(
    ("total", "fraction", "max_nodes", "cap"),
    [
        (10, 0.2, 0, 2),  # a taint is allowed while fewer than 0.2 x 10 others carry one
        (11, 0.2, 0, 3),
        (3, 0.2, 0, 1),  # small pool: the first failing node can still be tainted
        (30, 0.1, 0, 3),  # exact arithmetic: 0.1 * 30 is 3, not 3.0000000000000004
        (100, 0.5, 5, 5),  # the absolute cap bites first
        (10, 1.0, 0, 10),  # fraction 1: the whole pool
        (10, 0.0, 0, 0),  # fraction 0: never a new taint
        (0, 0.2, 0, 1),  # no GPU nodes counted (this node is counted as one)
    ],
)
def test_brake_cap(total: int, fraction: float, max_nodes: int, cap: int) -> None:
    assert brake_cap(total, fraction, max_nodes) == cap


def test_names_in_list_reads_every_form_the_server_may_choose() -> None:
    table = {
        "kind": "Table",
        "columnDefinitions": [{"name": "Status", "format": ""}, {"name": "Name", "format": "name"}],
        "rows": [{"cells": ["Ready", "gpu-a"]}, {"cells": ["Ready", "gpu-b"], "object": None}],
    }
    assert names_in_list(table) == ["gpu-a", "gpu-b"]
    with_objects = {
        "kind": "Table",
        "columnDefinitions": [],
        "rows": [{"cells": [], "object": {"metadata": {"name": "gpu-c"}}}],
    }
    assert names_in_list(with_objects) == ["gpu-c"]
    meta = {"kind": "PartialObjectMetadataList", "items": [{"metadata": {"name": "gpu-d"}}]}
    assert names_in_list(meta) == ["gpu-d"]
    assert names_in_list({"kind": "NodeList", "items": None}) == []
    assert names_in_list({"kind": "Table", "columnDefinitions": [], "rows": None}) == []


@pytest.mark.parametrize(
    "doc",
    [
        {"kind": "Status", "status": "Failure"},  # an error body answered with 200 by a proxy
        {"items": []},  # no kind at all
        {"kind": "Table", "columnDefinitions": [{"format": "name"}], "rows": [{"cells": []}]},
        {"kind": "Table", "columnDefinitions": [{"format": "name"}], "rows": [{"cells": [""]}]},
    ],
)
def test_names_in_list_refuses_what_it_cannot_read(doc: dict[str, Any]) -> None:
    """'Could not count' (an error, the agent retries) is never '0 tainted' (a taint allowed)."""
    with pytest.raises(ValueError):
        names_in_list(doc)


# ---------------------------------------------------------------------------------------------- kube


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


@pytest.fixture
def pool(gpu_node: Any, kube_namespace: str) -> Any:
    """A pool of GPU Nodes of the test's own (a brake scope) and its brakes, whose slots live in the
    test's namespace: ``pool(n)`` makes the Nodes, ``pool.brake(**kw)`` a Brake."""

    class Pool:
        def __init__(self) -> None:
            self.tag = unique_name("pool")
            self.scope = f"nvidia.com/gpu.present=true,test.example/pool={self.tag}"
            self.namespace = kube_namespace

        def __call__(self, n: int, **labels: str) -> list[str]:
            return [
                gpu_node(labels={"test.example/pool": self.tag, **labels}).metadata.name for _ in range(n)
            ]

        def brake(self, core: Any, **kw: Any) -> Brake:
            kw.setdefault("cache_seconds", 0)
            return Brake(core, scope=self.scope, namespace=self.namespace, **brake_kw(kw))

        def slots(self, core: Any) -> list[str]:
            """The slots held now (names), as the API server has them (a consistent list)."""
            doc = KubeRest.of(core).json(
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                query={"labelSelector": f"gpu-healthcheck/record={SLOT}"},
            )
            return sorted(i["metadata"]["name"] for i in doc.get("items") or ())

    return Pool()


def _ours(core: k8s.CoreV1Api, name: str) -> bool:
    return any(t.key == TAINT for t in core.read_node(name).spec.taints or ())


def _reasons(core: k8s.CoreV1Api, name: str) -> list[str]:
    items = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [e.reason for e in items]


@pytest.mark.kube
def test_brake_holds_at_its_limit_across_writers(core: k8s.CoreV1Api, pool: Any) -> None:
    """10 GPU nodes, maxTaintedFraction 0.2: 5 fail, 2 are tainted, 3 labelled only (BrakeOpen);
    when the 2 recover their slots are freed and two others get tainted, never more than 2 at once."""
    names = pool(10)
    writers = {n: NodeWriter(core, n, brake=pool.brake(core, max_fraction=0.2), cfg=shipped()) for n in names}
    failing = names[:5]
    for n in names:
        writers[n].apply(_marks(n in failing))
    for _ in range(3):  # several cycles: nobody gets through once the slots are held
        results = {n: writers[n].apply(_marks(True)) for n in failing}
    tainted = [n for n in names if _ours(core, n)]
    assert len(tainted) == 2 and len(pool.slots(core)) == 2
    held = [n for n in failing if n not in tainted]
    for n in held:
        assert results[n].ok and results[n].brake_open and not results[n].tainted
        labels = core.read_node(n).metadata.labels
        assert labels[K.status] == "fail" and K.tainted not in labels  # labelled, not tainted
        assert _reasons(core, n).count(EventReason.BRAKE_OPEN) == 1  # said once, not every cycle
    st = writers[held[0]].brake.state  # type: ignore[union-attr]
    assert st is not None and st.open and (st.cap, st.total) == (2, 10)
    assert "2/10 GPU nodes may be tainted (maxTaintedFraction=0.2)" in st.reason

    for n in tainted:  # the two tainted nodes recover: their taints come off, then their slots
        assert not writers[n].apply(_marks(False)).tainted
    assert pool.slots(core) == []
    for n in held:
        writers[n].apply(_marks(True))
        assert sum(_ours(core, m) for m in names) <= 2
    now_tainted = [n for n in names if _ours(core, n)]
    assert len(now_tainted) == 2 and set(now_tainted) <= set(held)
    for n in now_tainted:
        assert EventReason.BRAKE_CLOSED in _reasons(core, n) and EventReason.TAINT_ADDED in _reasons(core, n)


@pytest.mark.kube
def test_absolute_cap(core: k8s.CoreV1Api, pool: Any) -> None:
    """One brake shared by four writers (a tool's): it keeps each node's slot apart."""
    names = pool(4)
    brake = pool.brake(core, max_fraction=1.0, max_nodes=1)
    res = [NodeWriter(core, n, brake=brake, cfg=shipped()).apply(_marks(True)) for n in names]
    assert [r.tainted for r in res] == [True, False, False, False]
    assert all(r.brake_open for r in res[1:])
    assert sum(_ours(core, n) for n in names) == 1


@pytest.mark.kube
def test_a_race_of_simultaneous_taints_never_passes_the_limit(
    core: k8s.CoreV1Api, pool: Any, kube: Any
) -> None:
    """10 GPU nodes, 0.2: 8 agents (a connection each) ask at the same instant. A slot is a create
    of a fixed name, so exactly 2 get one and are tainted; a watch of every Node of the pool never
    sees more than 2 tainted at once (no yield after the fact: nothing to yield)."""
    names = pool(10)
    clients = [kube.api_client() for _ in names]
    writers = {
        n: NodeWriter(
            k8s.CoreV1Api(c), n, brake=pool.brake(k8s.CoreV1Api(c), max_fraction=0.2), cfg=shipped()
        )
        for n, c in zip(names, clients, strict=True)
    }
    for n in names:
        writers[n].apply(_marks(False))
    seen: set[str] = set()
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        w = KubeRest.of(core).watch(
            "/api/v1/nodes",
            query={"labelSelector": f"test.example/pool={pool.tag}", "timeoutSeconds": 60},
            timeout=(5, 70),
        )
        for ev in w:
            node = ev.get("object") or {}
            name = node.get("metadata", {}).get("name", "")
            if any(t.get("key") == TAINT for t in (node.get("spec") or {}).get("taints") or ()):
                seen.add(name)
            else:
                seen.discard(name)
            peak[0] = max(peak[0], len(seen))
            if stop.is_set():
                w.stop()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.5)
    failing = names[:8]
    start = threading.Barrier(len(failing))

    def go(n: str) -> None:
        start.wait()
        writers[n].apply(_marks(True))

    threads = [threading.Thread(target=go, args=(n,)) for n in failing]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    time.sleep(1.0)
    stop.set()
    core.patch_node(names[9], {"metadata": {"labels": {"test.example/poke": "1"}}})  # wakes the watch
    watcher.join(10)
    for c in clients:
        c.close()
    assert sum(_ours(core, n) for n in names) == 2
    assert len(pool.slots(core)) == 2
    assert peak[0] == 2


@pytest.mark.kube
def test_a_restarted_agent_finds_its_slot_and_a_tainted_node_without_one_takes_one(
    core: k8s.CoreV1Api, pool: Any
) -> None:
    """A restarted agent (a new Brake) whose Node carries our taint finds the slot its last life
    took, and takes no second one. A node tainted by an older agent (no slot) takes a free slot at its
    first apply, or keeps its taint without one when none is free (never taken away)."""
    a, b, c, _d = pool(4)
    brake_a = pool.brake(core, max_fraction=0.5)  # cap 2
    assert NodeWriter(core, a, brake=brake_a, cfg=shipped()).apply(_marks(True)).tainted
    first = pool.slots(core)
    assert len(first) == 1
    again = pool.brake(core, max_fraction=0.5)
    assert NodeWriter(core, a, brake=again, cfg=shipped()).apply(_marks(True)).tainted
    assert again.holds(a) and pool.slots(core) == first

    taint = {"key": TAINT, "value": "reset", "effect": "NoSchedule"}
    for n in (b, c):  # tainted by an agent that took no slot
        core.patch_node(n, {"metadata": {"labels": {K.tainted: TRUE}}, "spec": {"taints": [taint]}})
    brake_b = pool.brake(core, max_fraction=0.5)
    assert NodeWriter(core, b, brake=brake_b, cfg=shipped()).apply(_marks(True)).tainted
    assert brake_b.holds(b) and len(pool.slots(core)) == 2
    brake_c = pool.brake(core, max_fraction=0.5)
    assert (
        NodeWriter(core, c, brake=brake_c, cfg=shipped()).apply(_marks(True)).tainted
    )  # kept: never taken away
    assert not brake_c.holds(c) and len(pool.slots(core)) == 2


@pytest.mark.kube
def test_a_create_whose_answer_was_lost_is_could_not_count_and_never_a_second_slot(
    kube: Any, core: k8s.CoreV1Api, pool: Any
) -> None:
    """The slot's create lands but its answer never comes (a read timeout under load): the brake
    says it could not count (an error: no taint this time), and the next ask finds the slot it took
    (a consistent look) instead of taking another."""
    (a,) = pool(1)
    lost: list[str] = []

    class LosesTheAnswer(KubeRest):
        def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            out = super().json(method, path, **kw)
            if method == "POST" and path.endswith("/leases") and not lost:
                lost.append(path)
                raise TimeoutError("read timed out (the create landed)")
            return out

    with kube.api_client() as api:
        brake = pool.brake(LosesTheAnswer(api), max_fraction=1.0, max_nodes=1)
        with pytest.raises(TimeoutError):
            brake.allows_new_taint(a)
        assert len(pool.slots(core)) == 1 and not brake.holds(a)
        ok, reason = brake.allows_new_taint(a)
        assert ok and brake.holds(a) and len(pool.slots(core)) == 1, reason


@pytest.mark.kube
def test_a_reconfigured_brake_counts_with_the_new_selector_and_limits(core: k8s.CoreV1Api, pool: Any) -> None:
    """A config reload: a new selector is a new GPU-node total, new limits apply to the next ask."""
    asker, other = pool(2, **{"test.example/kind": "small"})
    pool(3, **{"test.example/kind": "big"})
    brake = pool.brake(
        core, selectors=["test.example/kind=small"], max_fraction=0.2, max_nodes=0, cache_seconds=60
    )
    assert brake.allows_new_taint(other)[0]  # cap 1 of 2: other holds it
    ok, _ = brake.allows_new_taint(asker)
    assert not ok and brake.state is not None and (brake.state.cap, brake.state.total) == (1, 2)
    brake.apply_config(
        brake.cfg, brake_cfg(selectors=["test.example/kind=small"], max_fraction=1.0, max_nodes=0)
    )
    ok, _ = brake.allows_new_taint(asker)  # the cached refusal went with the old limits (brake off)
    assert ok
    brake.apply_config(
        brake.cfg, brake_cfg(selectors=["test.example/kind in (small,big)"], max_fraction=0.5, max_nodes=1)
    )
    ok, reason = brake.allows_new_taint(asker)
    assert not ok and "maxTaintedNodes=1" in reason
    assert brake.state is not None and brake.state.total == 5  # counted with the new selector


@pytest.mark.kube
def test_without_a_daemonset_the_total_is_listed_names_only_and_cached(
    core: k8s.CoreV1Api, pool: Any
) -> None:
    """A tool (no agent DaemonSet) or a scope: the GPU nodes listed as Table rows without objects
    (no annotations, managedFields, spec or status on the wire), read once and kept for
    total_cache_seconds."""
    names = sorted(pool(3))
    now = [1000.0]
    brake = pool.brake(core, clock=lambda: now[0], total_cache_seconds=300)
    doc = brake.list_doc(pool.scope)
    assert doc["kind"] == "Table" and all(row.get("object") is None for row in doc["rows"])
    assert sorted(names_in_list(doc)) == names
    assert brake.total() == 3
    pool(1)
    assert brake.total() == 3  # kept
    now[0] += 301
    deadline = time.monotonic() + 10
    while brake.total() != 4:  # read again (the watch cache has the new Node within moments)
        assert time.monotonic() < deadline
        now[0] += 301
        time.sleep(0.2)


@pytest.mark.kube
def test_the_total_is_the_agent_daemonsets_desired_count(kube: Any, core: k8s.CoreV1Api, pool: Any) -> None:
    """The agent's DaemonSet on the GPU nodes: the DaemonSet controller (kube-controller-manager's)
    counts them into desiredNumberScheduled, and the brake takes its total from there, one read of
    the agents' namespace whatever the fleet's size. A DaemonSet of another ServiceAccount (the host
    engine's) is not the agents'."""
    pool(3)
    kcm = kube.plane.launch_controller_manager(unique_name("kcm-ds"), ["daemonset-controller"])
    try:
        for name, sa in (("agent", "gpu-healthcheck-agent"), ("engine", "nvidia-dcgm")):
            body = {
                "metadata": {"name": name, "namespace": pool.namespace},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {
                            "serviceAccountName": sa,
                            "nodeSelector": {"test.example/pool": pool.tag},
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [{"name": "c", "image": "registry.invalid/x:1"}],
                        },
                    },
                },
            }
            status, doc = kube.request("POST", f"/apis/apps/v1/namespaces/{pool.namespace}/daemonsets", body)
            assert status == 201, doc
        brake = Brake(core, namespace=pool.namespace, total_cache_seconds=0, cfg=brake_cfg(max_fraction=0.2))
        deadline = time.monotonic() + 60
        while (got := brake.total()) != 3:
            assert time.monotonic() < deadline, f"the DaemonSet controller never counted 3 nodes: {got}"
            time.sleep(0.5)
    finally:
        kcm.stop()


@pytest.mark.kube
def test_a_failing_read_is_could_not_count(core: k8s.CoreV1Api, pool: Any) -> None:
    """The API server refuses the total's read (here: a selector it cannot parse, 400): the brake
    raises (the writer keeps the Node as it is and asks again), never allows a taint."""
    brake = Brake(core, scope="test.example/pool in (unclosed", namespace=pool.namespace, cfg=brake_cfg())
    with pytest.raises(ApiException) as exc:
        brake.allows_new_taint("gpu-x")
    assert exc.value.status == 400


@pytest.mark.kube
def test_slots_are_named_by_number_and_owned_by_their_node(core: k8s.CoreV1Api, pool: Any) -> None:
    (a,) = pool(1)
    brake = pool.brake(core, max_fraction=1.0, max_nodes=1)
    assert brake.allows_new_taint(a)[0]
    rest = KubeRest.of(core)
    slots = Slots(rest, pool.namespace, "gpu-healthcheck", pool.scope)
    [name] = slots.held_by(a, consistent=True)
    assert name == slots.name(0)
    doc = rest.json("GET", f"/apis/coordination.k8s.io/v1/namespaces/{pool.namespace}/leases/{name}")
    assert doc["metadata"]["ownerReferences"][0]["name"] == a
    assert doc["metadata"]["annotations"]["gpu-healthcheck/node"] == a
    assert not slots.take(0, "someone-else")  # held: 409
    brake.release(a)
    assert slots.held_by(a, consistent=True) == []


@pytest.mark.kube
def test_a_slot_whose_node_is_gone_is_freed_by_an_unfenced_brake(
    core: k8s.CoreV1Api, pool: Any, kube: Any
) -> None:
    """Without the garbage collector (or before it acts), the slot of a deleted Node stays: a
    refused brake whose identity may delete it (not a fenced agent: tests/test_records_fence_kube)
    checks the holders of the slots it tried and frees the one whose Node is gone."""
    a, b = pool(2)
    assert pool.brake(core, max_fraction=1.0, max_nodes=1).allows_new_taint(a)[0]
    kube.delete_node(a)
    ok, reason = pool.brake(core, max_fraction=1.0, max_nodes=1).allows_new_taint(b)
    assert ok, reason
    assert len(pool.slots(core)) == 1


@pytest.mark.kube
def test_a_ghost_slot_is_freed_once_however_many_reap_it(core: k8s.CoreV1Api, pool: Any, kube: Any) -> None:
    """Two unfenced brakes reap the same slot of a Node that is gone: the delete names the slot as
    each read it (uid, resourceVersion), so the one that comes second finds the slot its rival took
    in between and frees nothing (two reapers of one ghost once both took it: cap + 1)."""
    from agent.reporters.brake_slots import Slots

    a, b, c = pool(3)
    assert pool.brake(core, max_fraction=1.0, max_nodes=1).allows_new_taint(a)[0]
    kube.delete_node(a)
    slots = Slots(KubeRest.of(core), pool.namespace, "gpu-healthcheck", pool.scope)
    (ghost,) = pool.slots(core)
    stale = slots.records.read(ghost)
    assert stale is not None
    assert slots.reap(0) and slots.take(0, b)  # the first reaper frees the ghost and takes the slot
    with pytest.raises(Exception) as refused:  # the second one's delete, as it read the ghost
        slots.records.delete(ghost, uid=stale["metadata"]["uid"], rv=stale["metadata"]["resourceVersion"])
    assert "409" in str(refused.value) or "Conflict" in str(refused.value), refused.value
    assert slots.get(0) is not None and slots.get(0).holder == b  # type: ignore[union-attr]
    assert not pool.brake(core, max_fraction=1.0, max_nodes=1).allows_new_taint(c)[0]
