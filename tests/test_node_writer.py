"""The Node writer against a real kube-apiserver (tests/kubeenv), plus its pure merge logic without one."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import (
    CONDITIONS,
    DEFAULT_CONDITION_TYPE,
    DEFAULT_PREFIX,
    DISABLED,
    TRUE,
    WARNING,
    EventReason,
    Keys,
)
from agent.core.severity import Severity, Status
from agent.reporters.apply_result import ApplyResult
from agent.reporters.kube_rest import KubeRest, node_path
from agent.reporters.node_patch import find_our_taint, plan_condition, plan_node_patch
from agent.reporters.node_writer import NodeWriter
from tests.conftest import brake_cfg, shipped
from tests.kubeenv.env import unique_name

P = DEFAULT_PREFIX
K = Keys(P)
TAINT = K.taint
COND = DEFAULT_CONDITION_TYPE


def make_marks(
    status: Status,
    severity: Severity = Severity.NONE,
    *,
    taint: bool | None = None,
    message: str = "",
    events: tuple[NodeEvent, ...] = (),
    latched: list[Any] | None = None,
) -> Marks:
    msg = message or f"node is {status.value}"
    doc = {
        "version": 1,
        "status": status.value,
        "severity": severity.label,
        "checkedAt": "2026-01-01T00:00:00Z",
        "bootId": "b1",
        "instanceType": "p5.48xlarge",
        "agentVersion": "0.1.0",
        "checks": [
            {
                "name": "gpu",
                "status": status.value,
                "severity": severity.label,
                "message": msg,
                "at": "2026-01-01T00:00:00Z",
                "durationMs": 1.0,
                "entities": ["GPU 3"],
            }
        ],
        "latched": latched or [],
    }
    return Marks(
        status=status,
        severity=severity,
        results_json=json.dumps(doc, separators=(",", ":")),
        taint=status is Status.FAIL if taint is None else taint,
        condition_message=msg,
        events=events,
    )


FAIL = make_marks(Status.FAIL, Severity.REBOOT, message="GPU 3: Xid 79 (fallen off the bus)")
PASS = make_marks(Status.PASS)


# --- pure merge logic (no server) -----------------------------------------------------------------


def _node(
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n1",
            "resourceVersion": "7",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"taints": taints or []},
        "status": {"conditions": conditions or []},
    }


OTHER_TAINTS = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "example.com/maintenance", "value": "x", "effect": "NoExecute"},
]


def test_plan_adds_our_taint_and_keys_keeping_everything_else() -> None:
    node = _node(
        labels={"team": "ml", f"{P}/taint-note": "x"}, taints=OTHER_TAINTS, annotations={"other/ann": "1"}
    )
    patch = plan_node_patch(node, FAIL, prefix=P, taint_on=True)
    assert patch is not None
    assert patch["metadata"]["labels"] == {
        K.status: "fail",
        K.severity: "reboot",
        K.tainted: TRUE,
    }
    assert patch["metadata"]["annotations"] == {K.results: FAIL.results_json}
    assert patch["spec"]["taints"] == [
        *OTHER_TAINTS,
        {"key": TAINT, "value": "reboot", "effect": "NoSchedule"},
    ]
    assert "team" not in patch["metadata"]["labels"] and "other/ann" not in patch["metadata"]["annotations"]


def test_plan_removes_only_our_exact_taint_and_label() -> None:
    ours = {"key": TAINT, "value": "reboot", "effect": "NoSchedule"}
    node = _node(
        labels={K.status: "fail", K.severity: "reboot", K.tainted: TRUE},
        taints=[OTHER_TAINTS[0], ours, OTHER_TAINTS[1]],
        annotations={K.results: FAIL.results_json},
    )
    patch = plan_node_patch(node, PASS, prefix=P, taint_on=False)
    assert patch is not None
    assert patch["spec"]["taints"] == OTHER_TAINTS
    assert patch["metadata"]["labels"] == {
        K.status: "pass",
        K.severity: "none",
        K.tainted: None,
    }


def test_plan_is_none_when_all_ours_already_match() -> None:
    ours = {"key": TAINT, "value": "reboot", "effect": "NoSchedule"}
    node = _node(
        labels={K.status: "fail", K.severity: "reboot", K.tainted: TRUE, "x": "y"},
        taints=[*OTHER_TAINTS, ours],
        annotations={K.results: FAIL.results_json},
    )
    assert plan_node_patch(node, FAIL, prefix=P, taint_on=True) is None
    assert find_our_taint(node, P) == ours


def test_plan_updates_taint_value_in_place_when_severity_changes() -> None:
    node = _node(taints=[{"key": TAINT, "value": "reset", "effect": "NoSchedule"}, OTHER_TAINTS[0]])
    patch = plan_node_patch(node, FAIL, prefix=P, taint_on=True)
    assert patch is not None
    assert patch["spec"]["taints"] == [
        {"key": TAINT, "value": "reboot", "effect": "NoSchedule"},
        OTHER_TAINTS[0],
    ]


def test_any_taint_with_our_key_is_ours_and_an_effect_change_moves_it() -> None:
    stale = {"key": TAINT, "value": "reboot", "effect": "NoSchedule"}
    other_effect = {"key": TAINT, "value": "reset", "effect": "PreferNoSchedule"}
    node = _node(taints=[OTHER_TAINTS[0], stale, other_effect, OTHER_TAINTS[1]])
    moved = replace(FAIL, taint_effect="NoExecute")
    patch = plan_node_patch(node, moved, prefix=P, taint_on=True)
    assert patch is not None
    assert patch["spec"]["taints"] == [
        OTHER_TAINTS[0],
        {"key": TAINT, "value": "reboot", "effect": "NoExecute"},
        OTHER_TAINTS[1],
    ], "exactly one taint of ours remains, with the new effect, where ours was"
    off = plan_node_patch(node, PASS, prefix=P, taint_on=False)
    assert off is not None and off["spec"]["taints"] == [OTHER_TAINTS[0], OTHER_TAINTS[1]]


def test_label_mode_labels_where_the_taint_would_be() -> None:
    node = _node(taints=[OTHER_TAINTS[0]])
    patch = plan_node_patch(node, FAIL, prefix=P, taint_on=False, label_on=True)
    assert patch is not None and "spec" not in patch
    assert patch["metadata"]["labels"][K.unhealthy] == "reboot"
    assert K.tainted not in patch["metadata"]["labels"]


def test_condition_transition_time_moves_only_with_status() -> None:
    old = {
        "type": COND,
        "status": CONDITIONS[Status.FAIL].status,
        "reason": CONDITIONS[Status.FAIL].reason,
        "message": "old",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    node = _node(conditions=[{"type": "Ready", "status": "True"}, old])
    same_status = plan_condition(node, FAIL, condition_type=COND, now="2026-02-02T00:00:00Z")
    assert same_status is not None
    assert same_status["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same_status["lastHeartbeatTime"] == "2026-02-02T00:00:00Z"
    flipped = plan_condition(node, PASS, condition_type=COND, now="2026-02-02T00:00:00Z")
    assert flipped is not None and flipped["lastTransitionTime"] == "2026-02-02T00:00:00Z"
    unchanged = _node(conditions=[{**old, "message": FAIL.condition_message}])
    assert plan_condition(unchanged, FAIL, condition_type=COND, now="2026-02-02T00:00:00Z") is None


def test_unreachable_api_server_returns_failure_without_raising() -> None:
    cfg = k8s.Configuration()
    cfg.host = "https://127.0.0.1:9"  # discard port: nothing listens
    cfg.verify_ssl = False
    cfg.retries = 0
    with k8s.ApiClient(cfg) as api:
        seen: list[tuple[str, str]] = []
        w = NodeWriter(
            k8s.CoreV1Api(api), "nowhere", on_write=lambda k, o: seen.append((k, o)), cfg=shipped()
        )
        res = w.apply(FAIL)
        assert res.ok is False and res.error
        assert not res.wrote and not res.tainted
        assert w.read_results() is None
        w.start()
        w.stop()  # a watch on a dead server stops too


# --- against the real API server ------------------------------------------------------------------


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


class Writes:
    def __init__(self) -> None:
        self.c: Counter[tuple[str, str]] = Counter()

    def __call__(self, kind: str, outcome: str) -> None:
        self.c[(kind, outcome)] += 1


def events_for(core: k8s.CoreV1Api, node: str) -> list[Any]:
    return list(core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items)


def reasons(core: k8s.CoreV1Api, node: str) -> list[str]:
    return [e.reason for e in events_for(core, node)]


def our_taints(node: Any) -> list[Any]:
    return [t for t in node.spec.taints or () if t.key == TAINT]


def condition(node: Any, ctype: str = COND) -> Any:
    return next(c for c in node.status.conditions if c.type == ctype)


def wait_for(pred: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.mark.kube
@pytest.mark.parametrize(
    ("marks", "taint_value", "cond_status"),
    [
        (PASS, None, CONDITIONS[Status.PASS].status),
        (
            make_marks(Status.WARN, Severity.MONITOR, message="GPU 3: 2 retired pages"),
            None,
            CONDITIONS[Status.WARN].status,
        ),
        (FAIL, "reboot", CONDITIONS[Status.FAIL].status),
        (
            make_marks(Status.UNKNOWN, message="kernel log unreadable"),
            None,
            CONDITIONS[Status.UNKNOWN].status,
        ),
    ],
    ids=["pass", "warn", "fail", "unknown"],
)
def test_contract_is_written(
    core: k8s.CoreV1Api,
    gpu_node: Any,
    kube_node_name: str,
    marks: Marks,
    taint_value: str | None,
    cond_status: str,
) -> None:
    gpu_node()
    ev = NodeEvent("StatusChanged", f"status is now {marks.status.value}", "Normal")
    res = NodeWriter(core, kube_node_name, cfg=shipped()).apply(Marks(**{**marks.__dict__, "events": (ev,)}))
    assert res.ok and res.node_writes == 1 and res.status_writes == 1
    node = core.read_node(kube_node_name)
    labels = node.metadata.labels
    assert labels[K.status] == marks.status.value
    assert labels[K.severity] == marks.severity.label
    assert json.loads(node.metadata.annotations[K.results]) == json.loads(marks.results_json)
    c = condition(node)
    assert (c.status, c.reason, c.message) == (cond_status, marks.condition_reason, marks.condition_message)
    assert condition(node, "Ready").status == "True"  # kubelet's condition untouched
    got = our_taints(node)
    if taint_value is None:
        assert got == [] and K.tainted not in labels and res.tainted is False
    else:
        assert [(t.value, t.effect) for t in got] == [(taint_value, "NoSchedule")]
        assert labels[K.tainted] == TRUE and res.tainted is True
    assert "StatusChanged" in reasons(core, kube_node_name)
    assert (EventReason.TAINT_ADDED in reasons(core, kube_node_name)) is (taint_value is not None)
    assert node.spec.unschedulable is not True  # never cordons


@pytest.mark.kube
def test_steady_state_writes_nothing(core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str) -> None:
    gpu_node()
    writes = Writes()
    w = NodeWriter(core, kube_node_name, on_write=writes, cfg=shipped())
    assert w.apply(FAIL).wrote
    rv = core.read_node(kube_node_name).metadata.resource_version
    hb = condition(core.read_node(kube_node_name)).last_heartbeat_time
    before = sum(writes.c.values())
    for _ in range(5):
        res = w.apply(FAIL)
        assert res.ok and not res.wrote and res.tainted and res.events == ()
    assert sum(writes.c.values()) == before
    node = core.read_node(kube_node_name)
    assert node.metadata.resource_version == rv
    assert condition(node).last_heartbeat_time == hb  # no heartbeat writes in steady state
    # the same with the watch running (the cached Node is used instead of a GET)
    w.start()
    try:
        wait_for(lambda: w.node is not None, "the watch to sync")
        assert not w.apply(FAIL).wrote
    finally:
        w.stop()
    assert core.read_node(kube_node_name).metadata.resource_version == rv


@pytest.mark.kube
def test_status_change_moves_transition_time_and_removes_taint(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str
) -> None:
    gpu_node()
    w = NodeWriter(core, kube_node_name, cfg=shipped())
    assert w.apply(FAIL).tainted
    t0 = condition(core.read_node(kube_node_name)).last_transition_time
    time.sleep(1.1)  # RFC 3339 seconds: make a new transition time distinguishable
    worse = make_marks(Status.FAIL, Severity.ISOLATE, message="GPU 3: row remap failure")
    assert w.apply(worse).wrote
    node = core.read_node(kube_node_name)
    assert condition(node).last_transition_time == t0  # still False: no transition
    assert [t.value for t in our_taints(node)] == ["isolate"]
    res = w.apply(PASS)
    assert res.ok and not res.tainted and EventReason.TAINT_REMOVED in res.events
    node = core.read_node(kube_node_name)
    assert our_taints(node) == [] and K.tainted not in node.metadata.labels
    assert condition(node).last_transition_time > t0


@pytest.mark.kube
def test_others_keys_survive_hundreds_of_interleaved_writes(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str
) -> None:
    """A second controller does its own read-modify-write (replace with resourceVersion) of its label,
    annotation and taint while the writer flips between fail and pass; neither loses anything."""
    theirs_static = {"key": "other.example/static", "value": "theirs", "effect": "NoExecute"}
    gpu_node(labels={"team": "ml"}, taints=[theirs_static])
    rounds = 151  # the last round (150, even) leaves the other's taint on
    other_conflicts = 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        nonlocal other_conflicts
        try:
            for i in range(rounds):
                while True:
                    n = core.read_node(kube_node_name)
                    n.metadata.labels["other.example/counter"] = str(i)
                    n.metadata.annotations = {**(n.metadata.annotations or {}), "other.example/note": f"n{i}"}
                    taints = [t for t in n.spec.taints or () if t.key != "other.example/maint"]
                    if i % 2 == 0:
                        taints.append(
                            k8s.V1Taint(key="other.example/maint", value=str(i), effect="NoSchedule")
                        )
                    n.spec.taints = taints
                    try:
                        core.replace_node(kube_node_name, n)
                        time.sleep(0.01)  # a busy controller, not a tight loop that starves everyone
                        break
                    except k8s.ApiException as exc:
                        if exc.status != 409:
                            raise
                        other_conflicts += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    writes = Writes()
    w = NodeWriter(core, kube_node_name, on_write=writes, cfg=shipped())
    t = threading.Thread(target=other)
    t.start()
    results: list[ApplyResult] = []
    i = 0
    while i < rounds:  # both sides write ~150 times, at the same time
        results.append(w.apply(FAIL if i % 2 == 0 else PASS))
        i += 1
    t.join()
    final = w.apply(FAIL)
    assert not errors, errors
    assert all(r.ok for r in results) and final.ok
    node = core.read_node(kube_node_name)
    assert node.metadata.labels["team"] == "ml"
    assert node.metadata.labels["other.example/counter"] == str(rounds - 1)
    assert node.metadata.annotations["other.example/note"] == f"n{rounds - 1}"
    keys = sorted((t.key, t.value, t.effect) for t in node.spec.taints if t.key.startswith((P, "other.")))
    assert keys == sorted(
        [
            ("other.example/static", "theirs", "NoExecute"),
            (TAINT, "reboot", "NoSchedule"),
            ("other.example/maint", str(rounds - 1), "NoSchedule"),
        ]
    )
    assert node.metadata.labels[K.status] == "fail"
    assert json.loads(node.metadata.annotations[K.results])["status"] == "fail"
    conflicts = sum(r.conflicts for r in results)
    assert conflicts == writes.c[("node", "conflict")]
    assert writes.c[("node", "ok")] == rounds  # every flip was a real write


@pytest.mark.kube
def test_conflict_is_retried(kube: Any, gpu_node: Any, kube_node_name: str) -> None:
    """Someone writes the Node between our read and our patch: the API server answers 409 and the
    writer re-reads and writes again, keeping the other write. (The sneaking write goes just before
    our Node PATCH.)"""
    gpu_node()
    with kube.api_client() as api:
        real = k8s.CoreV1Api(api)
        sneaked: list[int] = []

        class Sneaky(KubeRest):
            def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
                if method == "PATCH" and path == node_path(kube_node_name) and len(sneaked) < 2:
                    sneaked.append(1)
                    real.patch_node(
                        kube_node_name,
                        {"metadata": {"labels": {"other.example/sneak": str(len(sneaked))}}},
                    )
                return super().json(method, path, **kw)

        writes = Writes()
        res = NodeWriter(Sneaky(api), kube_node_name, on_write=writes, cfg=shipped()).apply(FAIL)
        assert res.ok and res.conflicts == 2 and res.node_writes == 1
        assert writes.c[("node", "conflict")] == 2
        node = real.read_node(kube_node_name)
        assert node.metadata.labels["other.example/sneak"] == "2"
        assert node.metadata.labels[K.status] == "fail" and our_taints(node)


@pytest.mark.kube
def test_taint_disabled_label_is_honoured(core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str) -> None:
    gpu_node()
    w = NodeWriter(core, kube_node_name, cfg=shipped())
    assert w.apply(FAIL).tainted
    core.patch_node(kube_node_name, {"metadata": {"labels": {K.taint_opt_out: DISABLED}}})
    res = w.apply(FAIL)
    assert res.ok and res.taint_disabled and not res.tainted and EventReason.TAINT_OPTED_OUT in res.events
    node = core.read_node(kube_node_name)
    assert our_taints(node) == [] and K.tainted not in node.metadata.labels
    assert node.metadata.labels[K.status] == "fail"  # labels keep being written
    assert node.metadata.labels[K.taint_opt_out] == DISABLED  # the operator's label stays
    again = w.apply(make_marks(Status.FAIL, Severity.ISOLATE, message="worse"))
    assert again.ok and not again.tainted and EventReason.TAINT_OPTED_OUT not in again.events  # said once
    assert our_taints(core.read_node(kube_node_name)) == []
    assert core.read_node(kube_node_name).metadata.labels[K.severity] == "isolate"


@pytest.mark.kube
def test_removed_taint_is_restored_by_the_watch(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str
) -> None:
    gpu_node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    w = NodeWriter(core, kube_node_name, cfg=shipped())
    w.start()
    try:
        assert w.apply(FAIL).tainted
        # an operator (or a controller) removes our taint while the node still fails
        n = core.read_node(kube_node_name)
        n.spec.taints = [t for t in n.spec.taints if t.key != TAINT]
        core.replace_node(kube_node_name, n)
        wait_for(lambda: bool(our_taints(core.read_node(kube_node_name))), "the taint to come back")
        wait_for(
            lambda: EventReason.TAINT_RESTORED in reasons(core, kube_node_name),
            f"the {EventReason.TAINT_RESTORED} Event",
        )
        ev = next(e for e in events_for(core, kube_node_name) if e.reason == EventReason.TAINT_RESTORED)
        assert ev.type == WARNING
        node = core.read_node(kube_node_name)
        assert [t.key for t in node.spec.taints].count("nvidia.com/gpu") == 1
        assert w.restores == 1
    finally:
        t0 = time.monotonic()
        w.stop()
        stopped_in = time.monotonic() - t0
    assert not w.watch.running, f"watch still running after {stopped_in:.2f}s"
    assert our_taints(core.read_node(kube_node_name))  # stopping never removes the taint


@pytest.mark.kube
def test_watch_relists_after_node_recreated_and_read_results(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, kube: Any
) -> None:
    gpu_node()
    latched = [
        {
            "check": "xid",
            "key": "xid:79:GPU3",
            "severity": "reboot",
            "since": "2026-01-01T00:00:00Z",
            "message": "Xid 79",
        }
    ]
    w = NodeWriter(core, kube_node_name, cfg=shipped())
    assert w.apply(make_marks(Status.FAIL, Severity.REBOOT, latched=latched)).ok
    w.start()
    try:
        wait_for(lambda: w.node is not None, "the watch to sync")
        got = w.read_results()
        assert got is not None and got["latched"] == latched
        kube.delete_node(kube_node_name)
        wait_for(lambda: w.node is None, "the watch to see the delete")
        kube.make_gpu_node(kube_node_name)
        wait_for(lambda: w.node is not None, "the watch to see the new Node")
        # The recreated Node starts bare; the watch may already have restored our taint onto it
        # (the last Marks still fail), so read_results is either None or our own document again.
        again = w.read_results()
        assert again is None or again["status"] == "fail"
        assert w.apply(PASS).wrote
    finally:
        w.stop()


@pytest.mark.kube
def test_dry_run_writes_nothing(core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str) -> None:
    gpu_node()
    writes = Writes()
    rv = core.read_node(kube_node_name).metadata.resource_version
    res = NodeWriter(core, kube_node_name, dry_run=True, on_write=writes, cfg=shipped()).apply(
        make_marks(Status.FAIL, Severity.RESET, events=(NodeEvent("X", "y"),))
    )
    assert res.ok and res.dry_run and not res.wrote and EventReason.TAINT_ADDED in res.events
    assert writes.c[("node", "skipped")] == 1 and writes.c[("status", "skipped")] == 1
    assert core.read_node(kube_node_name).metadata.resource_version == rv
    assert reasons(core, kube_node_name) == []


@pytest.mark.kube
def test_a_taint_whose_answer_was_lost_keeps_its_brake_slot(
    kube: Any, gpu_node: Any, kube_namespace: str
) -> None:
    """The PATCH adding our taint lands but its answer never comes (a read timeout under load). The
    brake slot was taken before it, so the retry finds the taint on and keeps it, and no other node
    takes that slot meanwhile: a racer's brake (limit 1) refuses it."""
    from agent.reporters.brake import Brake

    pool = unique_name("lost")
    selector = f"nvidia.com/gpu.present=true,test.example/pool={pool}"
    first = gpu_node(name=f"a-{pool}", labels={"test.example/pool": pool}).metadata.name
    me = gpu_node(name=f"b-{pool}", labels={"test.example/pool": pool}).metadata.name
    lost: list[str] = []

    class LosesTheTaintAnswer(KubeRest):
        def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            out = super().json(method, path, **kw)
            if method == "PATCH" and (kw.get("body") or {}).get("spec", {}).get("taints") and not lost:
                lost.append(path)
                raise TimeoutError("read timed out (the write landed)")
            return out

    def brake(core: Any) -> Brake:
        return Brake(
            core,
            scope=selector,
            cache_seconds=0,
            namespace=kube_namespace,
            cfg=brake_cfg(max_fraction=1.0, max_nodes=1),
        )

    with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        writer = NodeWriter(LosesTheTaintAnswer(api), me, brake=brake(core), cfg=shipped())
        res = writer.apply(FAIL)
        assert not res.ok and lost == [node_path(me)]
        assert our_taints(core.read_node(me))  # it landed
        res = writer.apply(FAIL)
        assert res.ok and res.tainted
        racer = NodeWriter(core, first, brake=brake(core), cfg=shipped()).apply(FAIL)
        assert racer.ok and racer.brake_open and not racer.tainted
        assert our_taints(core.read_node(me)) and not our_taints(core.read_node(first))
