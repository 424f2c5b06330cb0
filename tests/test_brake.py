"""The taint brake: its inequality (pure) and its hold across many writers on a real API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from agent.core.marks import Marks
from agent.core.node_keys import TRUE, EventReason, Keys
from agent.core.severity import Severity, Status
from agent.reporters.brake import Brake, names_in_list
from agent.reporters.brake_rule import brake_cap, brake_decision, must_back_off, rank_decision
from agent.reporters.node_writer import NodeWriter
from tests.kubeenv import unique_name

K = Keys()
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
    ("tainted", "total", "fraction", "max_nodes", "allowed"),
    [
        (0, 10, 0.2, 0, True),
        (1, 10, 0.2, 0, True),
        (2, 10, 0.2, 0, False),  # at the fraction: refuse
        (3, 10, 0.2, 0, False),
        (0, 3, 0.2, 0, True),  # small pool: the first failing node can still be tainted
        (1, 3, 0.2, 0, False),
        (2, 30, 0.1, 0, True),
        (3, 30, 0.1, 0, False),  # exact arithmetic: 0.1 * 30 is 3, not 3.0000000000000004
        (5, 100, 0.5, 5, False),  # the absolute cap bites first
        (4, 100, 0.5, 5, True),
        (50, 100, 1.0, 0, True),  # fraction 1: off
        (0, 100, 0.0, 0, False),  # fraction 0: never a new taint
        (0, 0, 0.2, 0, True),  # no GPU nodes counted (this node is counted as one)
    ],
)
def test_brake_inequality(tainted: int, total: int, fraction: float, max_nodes: int, allowed: bool) -> None:
    ok, reason = brake_decision(tainted, total, fraction, max_nodes)
    assert ok is allowed
    assert reason


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


def _count(brake: Brake, node_name: str | None = None, min_rv: str | None = None) -> tuple[int, int]:
    """(tainted GPU nodes but *node_name*, GPU nodes with *node_name*): the count behind the brake's
    answer (a Brake with cache_seconds=0 counts again on every ask). Raises on API errors."""
    brake.allows_new_taint(node_name, min_rv)
    st = brake.state
    assert st is not None
    return st.tainted, st.total


def _ours(core: k8s.CoreV1Api, name: str) -> bool:
    return any(t.key == TAINT for t in core.read_node(name).spec.taints or ())


@pytest.mark.kube
def test_brake_holds_at_its_limit_across_writers(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    """10 GPU nodes, maxTaintedFraction 0.2: 5 fail, 2 are tainted, 3 labelled only (BrakeOpen);
    when the 2 recover the brake closes and the others get tainted, never more than 2 at once."""
    pool = unique_name("pool")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    names = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(10)]
    writers = {
        n: NodeWriter(core, n, brake=Brake(core, scope=selector, max_fraction=0.2, cache_seconds=0))
        for n in names
    }
    failing = names[:5]
    for n in names:
        writers[n].apply(_marks(n in failing))
    for _ in range(3):  # several cycles: nobody gets through once the brake is open
        results = {n: writers[n].apply(_marks(True)) for n in failing}
    tainted = [n for n in names if _ours(core, n)]
    assert len(tainted) == 2
    held = [n for n in failing if n not in tainted]
    for n in held:
        assert results[n].ok and results[n].brake_open and not results[n].tainted
        labels = core.read_node(n).metadata.labels
        assert labels[K.status] == "fail" and K.tainted not in labels  # labelled, not tainted
        reasons = [
            e.reason
            for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={n}").items
        ]
        assert reasons.count(EventReason.BRAKE_OPEN) == 1  # said once, not every cycle
    st = writers[held[0]].brake.state  # type: ignore[union-attr]
    assert st is not None and st.open and (st.tainted, st.total) == (2, 10)

    for n in tainted:  # the two tainted nodes recover
        assert not writers[n].apply(_marks(False)).tainted
    for n in held:
        writers[n].apply(_marks(True))
        assert sum(_ours(core, m) for m in names) <= 2
    now_tainted = [n for n in names if _ours(core, n)]
    assert len(now_tainted) == 2 and set(now_tainted) <= set(held)
    for n in now_tainted:
        reasons = [
            e.reason
            for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={n}").items
        ]
        assert EventReason.BRAKE_CLOSED in reasons and EventReason.TAINT_ADDED in reasons


@pytest.mark.kube
def test_absolute_cap(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    pool = unique_name("cap")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    names = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(4)]
    brake = Brake(core, scope=selector, max_fraction=1.0, max_nodes=1)
    res = [NodeWriter(core, n, brake=brake).apply(_marks(True)) for n in names]
    assert [r.tainted for r in res] == [True, False, False, False]
    assert all(r.brake_open for r in res[1:])
    assert sum(_ours(core, n) for n in names) == 1


@pytest.mark.kube
def test_count_lists_names_only(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    """The count asks for Table rows without objects: no annotations, managedFields, spec or status of
    10,000 nodes on the wire, only their names."""
    pool = unique_name("meta")
    names = sorted(gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(3))
    brake = Brake(core, scope=f"test.example/pool={pool}", cache_seconds=0)
    rv = max(int(core.read_node(n).metadata.resource_version) for n in names)
    for min_rv in (str(rv), None):  # the cache as it is: after a read not older than the last write
        doc = brake.list_doc(f"test.example/pool={pool}", min_rv=min_rv)
        assert doc["kind"] == "Table"
        assert all(row.get("object") is None for row in doc["rows"])
        assert sorted(names_in_list(doc)) == names
    assert _count(brake) == (0, 3)
    assert _count(brake, names[0]) == (0, 3)


@pytest.mark.kube
def test_a_count_not_older_than_a_write_sees_every_write_before_it(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """The brake's lists come from the watch cache, but not older than our own last write: a taint
    label that landed just before it is always counted (20 write-then-count rounds, no sleep)."""
    pool = unique_name("fresh")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    names = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(20)]
    brake = Brake(core, scope=selector, max_fraction=1.0)
    for i, name in enumerate(names):
        other = core.patch_node(name, {"metadata": {"labels": {K.tainted: TRUE}}})
        mine = core.patch_node(names[0], {"metadata": {"labels": {"test.example/round": str(i)}}})
        assert int(mine.metadata.resource_version) > int(other.metadata.resource_version)
        tainted, total = _count(brake, None, mine.metadata.resource_version)
        assert (tainted, total) == (i + 1, 20)


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


@pytest.mark.parametrize(
    ("total", "fraction", "max_nodes", "cap"),
    [
        (10, 0.2, 0, 2),
        (3, 0.2, 0, 1),
        (30, 0.1, 0, 3),
        (11, 0.2, 0, 3),
        (100, 0.5, 5, 5),
        (10, 1.0, 0, 10),
        (10, 0.0, 0, 0),
    ],
)
def test_brake_cap_is_the_end_state_of_the_inequality(
    total: int, fraction: float, max_nodes: int, cap: int
) -> None:
    assert brake_cap(total, fraction, max_nodes) == cap
    # One more taint is allowed exactly while fewer than `cap` others are tainted.
    assert brake_decision(cap - 1, total, fraction, max_nodes)[0] or cap == 0
    assert not brake_decision(cap, total, fraction, max_nodes)[0] or fraction >= 1


def test_must_back_off_is_the_same_answer_everywhere() -> None:
    tainted = ["n3", "n1", "n2", "n4"]
    yielding = [n for n in tainted if must_back_off(n, tainted, 2)]
    assert yielding == ["n3", "n4"]
    assert not any(must_back_off(n, ["n1", "n2"], 2) for n in ("n1", "n2"))


@pytest.mark.kube
def test_a_race_of_simultaneous_taints_settles_at_the_limit(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    """10 GPU nodes, 0.2: 5 agents taint at the same instant. They take turns by name among the
    failing nodes they see; what one could not see (a write in flight) the post-taint re-count
    settles: the ones beyond the limit yield, by name order, without a lock."""
    import threading
    import time

    pool = unique_name("race")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    names = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(10)]
    writers = {
        n: NodeWriter(core, n, brake=Brake(core, scope=selector, max_fraction=0.2, cache_seconds=0))
        for n in names
    }
    for w in writers.values():
        w.verify_delay_s = 0.5
    for n in names:
        writers[n].apply(_marks(False))
    failing = names[:5]
    start = threading.Barrier(len(failing))

    def go(n: str) -> None:
        start.wait()
        writers[n].apply(_marks(True))

    threads = [threading.Thread(target=go, args=(n,)) for n in failing]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sum(_ours(core, n) for n in names) > 2:
        time.sleep(0.2)
    tainted = sorted(n for n in names if _ours(core, n))
    assert 1 <= len(tainted) <= 2, tainted


@pytest.mark.kube
def test_the_gpu_node_total_is_cached_and_tainted_nodes_are_always_fresh(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """The total (a list of every GPU node) is the heavy request: read ahead of need (warm), kept,
    and when old still used while a background read replaces it; tainted nodes are always fresh."""
    import time

    pool = unique_name("cache")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    now = [1000.0]
    brake = Brake(
        core,
        scope=selector,
        clock=lambda: now[0],
        total_cache_seconds=300,
        refresh_jitter_s=0,
        cache_seconds=0,
    )
    names = [gpu_node(labels={"test.example/pool": pool}).metadata.name for _ in range(3)]
    rv = max(int(core.read_node(n).metadata.resource_version) for n in names)
    brake.list_doc(selector, min_rv=str(rv))  # the cache has seen the 3 Nodes: warm reads it as it is
    warm = brake.warm()
    assert warm is not None
    warm.join(10)
    untainted = gpu_node(labels={"test.example/pool": pool})  # not in the warm total
    late = gpu_node(labels={"test.example/pool": pool, K.tainted: TRUE})
    late_rv = late.metadata.resource_version
    # a new tainted node is seen at once, and counted in the total (ours are GPU nodes); the rest
    # of the total is the warm one
    assert _count(brake, None, late_rv) == (1, 4)
    now[0] += 301
    assert _count(brake) == (1, 4)  # old: still answered at once, from the old total ...
    deadline = time.monotonic() + 10
    while _count(brake) != (1, 5) and time.monotonic() < deadline:  # ... while it is read again
        time.sleep(0.05)
    assert _count(brake) == (1, 5)
    assert untainted.metadata.name not in names
    assert len(names) == 3


@pytest.mark.kube
def test_without_a_total_the_first_count_reads_it(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    """Not older than the write the agent just made: a Node created a moment ago is counted."""
    pool = unique_name("cold")
    node = gpu_node(labels={"test.example/pool": pool})
    brake = Brake(core, scope=f"test.example/pool={pool}")
    assert _count(brake, None, node.metadata.resource_version) == (0, 1)


@pytest.mark.parametrize(
    ("node", "tainted", "total", "contenders", "allowed"),
    [
        ("n1", 0, 10, ["n1"], True),  # alone: the usual case
        ("n1", 0, 10, ["n1", "n2", "n3"], True),  # 2 free slots: n1 and n2 go
        ("n2", 0, 10, ["n1", "n2", "n3"], True),
        ("n3", 0, 10, ["n1", "n2", "n3"], False),  # two ahead of it want the 2 slots
        ("n3", 1, 10, ["n1", "n3"], False),  # one taint on, one slot: n1's turn
        ("n1", 1, 10, ["n1", "n3"], True),
        ("n3", 0, 10, ["n1", "n2"], False),  # its own label not seen yet: it still counts itself
        ("n1", 2, 10, ["n1"], False),  # the count refuses first
        ("n9", 0, 100, [f"n{i}" for i in range(10)], True),  # 20 slots, 10 contenders: all go
    ],
)
def test_rank_decision_shares_the_free_slots_in_name_order(
    node: str, tainted: int, total: int, contenders: list[str], allowed: bool
) -> None:
    ok, reason = rank_decision(node, tainted, total, contenders, 0.2)
    assert ok is allowed
    if not ok and tainted < 2:
        assert "ahead of this one" in reason


def test_rank_decision_every_view_of_one_burst_fills_the_limit_exactly() -> None:
    """Agents that see the same contenders agree: exactly the free slots are taken."""
    contenders = [f"gpu-{i:04d}" for i in range(800)]
    allowed = [n for n in contenders if rank_decision(n, 0, 2000, contenders, 0.2)[0]]
    assert allowed == contenders[:400]


@pytest.mark.kube
def test_a_contender_that_never_takes_its_slot_does_not_hold_a_node_back(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """A failing node whose agent is gone keeps its `status=fail` label and ranks first; after
    rank_patience_s of rank refusals with slots still free, the plain count lets this node go."""
    pool = unique_name("stale")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    labels = {"test.example/pool": pool}
    gpu_node(name=f"a-{pool}", labels={**labels, K.status: "fail", K.severity: "reboot"})  # no agent
    me = gpu_node(name=f"b-{pool}", labels=labels).metadata.name
    gpu_node(name=f"c-{pool}", labels=labels)
    now = [1000.0]
    brake = Brake(core, scope=selector, max_fraction=1.0, max_nodes=1, cache_seconds=0, clock=lambda: now[0])
    writer = NodeWriter(core, me, brake=brake)
    res = writer.apply(_marks(True))
    assert res.ok and not res.tainted and res.brake_open
    node = core.read_node(me)
    assert node.metadata.labels[K.status] == "fail"  # it shows itself as a contender
    assert "ahead of this one" in (brake.state.reason if brake.state else "")
    now[0] += 60
    assert not writer.apply(_marks(True)).tainted  # still within the patience
    now[0] += 31
    res = writer.apply(_marks(True))
    assert res.ok and res.tainted and not res.brake_open
    assert _ours(core, me)


@pytest.mark.kube
def test_a_node_that_sees_other_contenders_waits_for_the_burst_to_land(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """b sees c (after it by name) failing too: a burst. It waits settle_s and counts again; a, ahead
    of it by name, has shown up meanwhile, and the one free slot is a's."""
    import threading

    pool = unique_name("settle")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    labels = {"test.example/pool": pool}
    a = gpu_node(name=f"a-{pool}", labels=labels).metadata.name
    me = gpu_node(name=f"b-{pool}", labels=labels).metadata.name
    failing = {K.status: "fail", K.severity: "reboot"}  # as an agent labels a failing node
    gpu_node(name=f"c-{pool}", labels={**labels, **failing})
    brake = Brake(core, scope=selector, max_fraction=1.0, max_nodes=1, cache_seconds=0, settle_s=1.0)
    later = threading.Timer(0.3, lambda: core.patch_node(a, {"metadata": {"labels": failing}}))
    later.start()
    res = NodeWriter(core, me, brake=brake).apply(_marks(True))
    later.join()
    assert res.ok and not res.tainted and res.brake_open
    assert brake.state is not None and "1 failing nodes ahead of this one" in brake.state.reason


@pytest.mark.kube
def test_a_lone_failing_node_does_not_wait(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    import time

    pool = unique_name("alone")
    me = gpu_node(labels={"test.example/pool": pool}).metadata.name
    gpu_node(labels={"test.example/pool": pool})
    brake = Brake(core, scope=f"test.example/pool={pool}", max_fraction=1.0, settle_s=5.0)
    t0 = time.monotonic()
    assert NodeWriter(core, me, brake=brake).apply(_marks(True)).tainted
    assert time.monotonic() - t0 < 4.0


@pytest.mark.kube
def test_a_cache_behind_our_write_is_counted_as_it_is(core: k8s.CoreV1Api, gpu_node: Any) -> None:
    """The API server answers 504 when its cache cannot catch up with the asked resourceVersion
    within ~3 s (a server far behind a burst). The count goes on with the cache as it is instead of
    failing the write (which would be retried and add load)."""
    pool = unique_name("behind")
    name = gpu_node(labels={"test.example/pool": pool, K.tainted: TRUE}).metadata.name
    brake = Brake(core, scope=f"test.example/pool={pool}", cache_seconds=0)
    rv = core.read_node(name).metadata.resource_version
    assert _count(brake, None, rv) == (1, 1)  # the total, read not older than the Node's creation
    ahead = str(int(rv) + 10_000_000)
    assert _count(brake, None, ahead) == (1, 1)
    assert brake.stale_reads == 1


@pytest.mark.kube
def test_at_its_last_recount_a_node_above_the_limit_yields_whatever_its_name(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """a and b are tainted, the limit is 1. b (after a by name) should yield, but its re-counts may
    be over (a landed late, after a loaded API server held its writes). a's last re-count yields."""
    pool = unique_name("last")
    labels = {"test.example/pool": pool, K.tainted: TRUE}
    a = gpu_node(name=f"a-{pool}", labels=labels).metadata.name
    gpu_node(name=f"b-{pool}", labels=labels)
    brake = Brake(core, scope=f"test.example/pool={pool}", max_fraction=1.0, max_nodes=1)
    rv = max(int(core.read_node(n).metadata.resource_version) for n in (a, f"b-{pool}"))
    assert brake.overshoot(a, str(rv)) == (False, "")
    yielding, reason = brake.overshoot(a, last=True)
    assert yielding and "above the limit of 1" in reason


@pytest.mark.kube
def test_a_failed_background_read_of_the_total_is_tried_again(core: k8s.CoreV1Api) -> None:
    """The API server refuses the read (here: a selector it cannot parse, 400): no total is kept,
    the failure is not a pending read forever, and the next need reads (and fails) in the open."""
    brake = Brake(core, scope="test.example/pool in (unclosed")
    first = brake.warm()
    assert first is not None
    first.join(10)
    again = brake.warm()
    assert again is not None  # not stuck "pending"
    again.join(10)
    with pytest.raises(ApiException) as exc:
        brake.allows_new_taint("gpu-x")
    assert exc.value.status == 400


@pytest.mark.kube
def test_a_reconfigured_brake_counts_with_the_new_selector_and_limits(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """A config reload: a new selector is a new GPU-node total, new limits apply to the next ask."""
    small, big = unique_name("small"), unique_name("big")
    asker = gpu_node(labels={"test.example/pool": small}).metadata.name
    gpu_node(labels={"test.example/pool": small, K.tainted: TRUE})
    for _ in range(3):
        gpu_node(labels={"test.example/pool": big})
    both = f"test.example/pool in ({small},{big})"  # the scope keeps other tests' Nodes out
    brake = Brake(
        core, selectors=[f"test.example/pool={small}"], scope=both, max_fraction=0.2, cache_seconds=60
    )
    ok, _ = brake.allows_new_taint(asker)
    assert not ok and brake.state is not None and (brake.state.tainted, brake.state.total) == (1, 2)
    brake.reconfigure(selectors=[f"test.example/pool={small}"], max_fraction=1.0, max_nodes=0)
    ok, _ = brake.allows_new_taint(asker)  # the cached refusal went with the old limits
    assert ok
    brake.reconfigure(selectors=[both], max_fraction=0.5, max_nodes=1)
    ok, reason = brake.allows_new_taint(asker)
    assert not ok and "maxTaintedNodes=1" in reason
    assert brake.state is not None and brake.state.total == 5  # counted with the new selector


@pytest.mark.kube
def test_a_node_failing_below_the_lowest_severity_that_taints_is_no_contender(
    core: k8s.CoreV1Api, gpu_node: Any
) -> None:
    """node.taintMinSeverity reboot: a node failing at reset never taints, so it takes no slot."""
    pool = unique_name("minsev")
    selector = f"test.example/pool={pool}"
    mild = gpu_node(labels={"test.example/pool": pool, K.status: "fail", K.severity: "reset"}).metadata.name
    bad = gpu_node(labels={"test.example/pool": pool, K.status: "fail", K.severity: "isolate"}).metadata.name
    brake = Brake(core, scope=selector, min_severity="reboot")
    assert set(names_in_list(brake.list_doc(brake.contenders_selector))) == {bad}
    brake.reconfigure(selectors=brake.selectors, max_fraction=0.2, max_nodes=0)  # back to reset
    assert set(names_in_list(brake.list_doc(brake.contenders_selector))) == {mild, bad}
