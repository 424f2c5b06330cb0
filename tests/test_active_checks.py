"""Active checks, the pure parts (core/active_checks.py, engine/active.py, the testing taint in the Node
PATCH, what counts as a pod that came for the GPUs, the record of the last request in the results
annotation and what `status` shows of requests). The window with the diag runner:
test_dcgm_window.py. On the real API server: test_active_checks_kube.py."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from agent.checks.registry import RULE_BOOK
from agent.cli.status import node_status, render
from agent.config import parse_config, yaml_safe
from agent.config.schema import ConfigError
from agent.core.active_checks import (
    RESTARTED,
    ActivePolicy,
    ActiveState,
    DiagRequest,
    parse_max_concurrent,
    restored_record,
    slots_before,
)
from agent.core.marks import Marks
from agent.core.node_keys import Keys
from agent.core.repair_budget import Record
from agent.core.severity import Severity, Status
from agent.engine.active import step
from agent.engine.engine import Engine
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import SnapshotSource
from agent.reporters.active_checks import wants_gpu
from agent.reporters.node_patch import plan_node_patch
from tests.conftest import cfg

K = Keys()
ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def stamp(ago: timedelta) -> str:
    return (NOW - ago).isoformat().replace("+00:00", "Z")


def test_the_bound_is_a_count_or_a_share_of_the_gpu_nodes_at_least_one() -> None:
    default = cfg().node.active_checks
    assert default == ActivePolicy("5%", 300.0)
    assert [default.limit(n) for n in (1, 10, 39, 40, 100, 2000)] == [1, 1, 1, 2, 5, 100]
    assert ActivePolicy("2").limit(1000) == 2
    assert cfg({"node": {"activeChecks": {"maxConcurrent": 3}}}).node.active_checks.limit(10) == 3
    for bad in (0, "0%", "150%", "five", True, -1):
        with pytest.raises(ValueError):
            parse_max_concurrent(bad)
        with pytest.raises(ConfigError, match="maxConcurrent"):
            parse_config({"node": {"activeChecks": {"maxConcurrent": bad}}}, rules=RULE_BOOK)


def test_a_node_counts_the_live_slots_written_before_its_own() -> None:
    def slot(node: str, rv: int, at: float = 1000.0) -> Record:
        return Record(f"s-{node}", "slot", node, at=at, rv=rv)

    own = slot("c", 30)
    records = [slot("a", 10), slot("b", 20), own, slot("d", 40), slot("old", 5, at=0.0)]
    records.append(Record("m", "mark", "e", at=1000.0, rv=1))  # the repair budget's: not a slot
    assert [r.node for r in slots_before(records, own, now=1100.0, expire_s=600.0)] == ["a", "b"]
    assert slots_before([slot("c", 10), own], own, 1100.0, 600.0) == []  # its own older one


def test_a_nodes_slots_count_once_however_many_it_wrote() -> None:
    """One token can write any number of slot records of its own node (production review 3, C3): its
    node counts once, by its earliest live record, so it takes one slot of the bound, not all."""

    def slot(node: str, rv: int, at: float = 1000.0) -> Record:
        return Record(f"s-{node}-{rv}", "slot", node, at=at, rv=rv)

    own = slot("y", 40)
    forged = [slot("x", 10), slot("x", 20), slot("x", 30)]
    before = slots_before([*forged, own], own, now=1100.0, expire_s=600.0)
    assert [(r.node, r.rv) for r in before] == [("x", 10)]
    assert len(before) < ActivePolicy("2").limit(10)  # y runs beside x's one share
    # x's earliest expired: it counts by its earliest live one, still once
    aged = [slot("x", 5, at=0.0), *forged, slot("a", 35), own]
    assert [(r.node, r.rv) for r in slots_before(aged, own, 1100.0, 600.0)] == [("x", 10), ("a", 35)]
    # records x wrote after y's do not count against y (resourceVersion order)
    assert slots_before([slot("x", 50), slot("x", 60), own], own, 1100.0, 600.0) == []


def test_the_testing_taint_goes_on_and_off_beside_everyone_elses() -> None:
    node: dict[str, Any] = {
        "metadata": {"labels": {K.status: "pass", K.severity: "none"}, "annotations": {K.results: "{}"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
    }
    marks = Marks(Status.PASS, Severity.NONE, "{}", False, "m", testing=True)
    patch = plan_node_patch(node, marks, prefix=K.prefix, taint_on=False)
    assert patch == {
        "spec": {
            "taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": K.testing, "effect": "NoSchedule"},
            ]
        }
    }
    node["spec"] = patch["spec"]
    assert plan_node_patch(node, marks, prefix=K.prefix, taint_on=False) is None  # on: steady
    off = Marks(Status.PASS, Severity.NONE, "{}", False, "m", testing=False)
    assert plan_node_patch(node, off, prefix=K.prefix, taint_on=False) == {
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    }
    left = Marks(Status.PASS, Severity.NONE, "{}", False, "m", testing=None)
    assert plan_node_patch(node, left, prefix=K.prefix, taint_on=False) is None


def test_a_request_on_the_node_makes_the_diag_due_and_goes_once_started() -> None:
    request = DiagRequest("alice@example.com", "after a reseat", "2026-11-28T10:00:00Z", 3)
    assert DiagRequest.decode(request.encode()) == request
    assert DiagRequest.decode("now").who() == "unnamed (kubectl annotate)"
    node = node_from_dict(
        {"metadata": {"name": "n", "annotations": {K.diag_requested: request.encode()}}, "spec": {}}
    )
    state, due = ActiveState(), {"dcgm-diag": 999.0}
    first = step(state, node, K.prefix, "taint", due)
    assert due["dcgm-diag"] == 0.0 and first.drop == () and first.testing is False
    due["dcgm-diag"] = 999.0
    assert step(state, node, K.prefix, "taint", due).drop == () and due["dcgm-diag"] == 999.0  # pending
    state.hold(True)
    assert state.start() == request
    held = step(state, node, K.prefix, "taint", due)
    assert held.drop == (K.diag_requested,) and held.testing is True
    assert step(state, node, K.prefix, "observe", due).testing is False  # observe and label: no taint
    assert step(None, node, K.prefix, "taint", due).testing is None  # no live DCGM here: leave it


def test_what_counts_as_a_pod_that_came_for_the_gpus() -> None:
    def pod(**spec: Any) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "c"}], **spec}, "status": {"phase": "Pending"}}

    gpu = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    mig = {"initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}]}
    assert wants_gpu(pod(**gpu)) == "nvidia.com/gpu"
    assert wants_gpu(pod(**mig)) == "nvidia.com/mig-1g.10gb"
    assert (
        wants_gpu(pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "x"}])) == "a DRA resource claim"
    )
    assert wants_gpu(pod()) is None
    assert wants_gpu(pod(containers=[{"resources": {"limits": {"vpc.amazonaws.com/efa": "1"}}}])) is None
    done = {**pod(**gpu), "status": {"phase": "Succeeded"}}
    assert wants_gpu(done) is None


def test_the_fence_lists_the_testing_taint_and_the_slot_policy() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for path in (root / "manifests", root / "charts" / "gpu-healthcheck" / "templates"):
        text = (path / "30-admission-policy.yaml").read_text()
        assert "variables.prefix + 'testing']" in text
        assert "name: gpu-healthcheck-own-slots" in text
    docs = list(yaml_safe.load_all((root / "manifests" / "30-admission-policy.yaml").read_text()))
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ValidatingAdmissionPolicyBinding", "gpu-healthcheck-own-slots") in names


def test_the_last_request_is_recorded_started_then_ended_and_a_restart_aborts_it() -> None:
    request = DiagRequest("alice@example.com", "after a reseat", "2026-11-28T10:00:00Z", None)
    state = ActiveState()
    state.end("completed", "2026-11-28T10:09:00Z")  # no request started: nothing to end
    assert state.record is None
    state.ask(request)
    state.hold(True)
    assert state.start() == request
    state.began(request, 2, "2026-11-28T10:05:00Z")
    started = state.record
    assert started == {
        "by": "alice@example.com",
        "reason": "after a reseat",
        "requestedAt": "2026-11-28T10:00:00Z",
        "level": 2,
        "outcome": "started",
        "startedAt": "2026-11-28T10:05:00Z",
    }
    node = node_from_dict(
        {"metadata": {"name": "n", "annotations": {K.diag_requested: request.encode()}}, "spec": {}}
    )
    assert step(state, node, K.prefix, "taint", {}).record == started  # the engine writes it
    state.end("aborted", "2026-11-28T10:06:00Z", "level 2 diag aborted: pod a/b arrived" + "x" * 500)
    state.end("completed", "2026-11-28T10:09:00Z")  # ended once: a later end changes nothing
    done = state.record
    assert done is not None and done["outcome"] == "aborted" and done["endedAt"] == "2026-11-28T10:06:00Z"
    assert len(done["abortReason"]) == 200 and done["abortReason"].startswith("level 2 diag aborted")
    # A restarted agent finds a diag `started`: it died with the agent that ran it.
    died = restored_record(started)
    assert died == {
        **started,
        "outcome": "aborted",
        "endedAt": started["startedAt"],
        "abortReason": RESTARTED,
    }
    assert restored_record(done) == done
    assert restored_record({"outcome": "exploded"}) is None and restored_record("x") is None
    unnamed = ActiveState()
    unnamed.began(DiagRequest.decode("now"), 2, "2026-11-28T10:05:00Z")
    assert (unnamed.record or {})["by"] is None  # a `kubectl annotate`: no one named


def test_the_results_annotation_keeps_the_last_request_across_a_restart(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy", snap, symlinks=True)
    eng = Engine(SnapshotSource(snap), cfg())
    started = {
        "by": "alice",
        "reason": "r",
        "level": 3,
        "outcome": "started",
        "startedAt": stamp(timedelta()),
    }
    eng.restore({"status": "pass", "lastDiag": started})
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    kept = json.loads(marks.results_json)["lastDiag"]
    assert kept["outcome"] == "aborted" and kept["abortReason"] == RESTARTED and kept["by"] == "alice"
    # This agent's own record, once it has one, replaces the restored one.
    eng.active = ActiveState()
    eng.active.began(DiagRequest("bob", "again", "", 2), 2, stamp(timedelta(0)))
    _, marks = eng.evaluate()
    assert json.loads(marks.results_json)["lastDiag"]["by"] == "bob"
    fresh = Engine(SnapshotSource(snap), cfg())
    fresh.run_tier("gpu")
    assert "lastDiag" not in json.loads(fresh.evaluate()[1].results_json)  # none asked: no field


def test_a_diag_aborted_for_work_retries_after_retry_seconds_then_ever_more_slowly() -> None:
    """The rule (docs/guides/active-checks.md): retrySeconds after the first abort in a row, doubling with
    each further one, at most intervals.dcgmDiag, never under retrySeconds."""
    policy = ActivePolicy("5%", 300.0)
    assert [policy.retry_after(n, 21600.0) for n in range(1, 9)] == [
        300.0, 600.0, 1200.0, 2400.0, 4800.0, 9600.0, 19200.0, 21600.0,
    ]  # fmt: skip
    assert policy.retry_after(10_000, 21600.0) == 21600.0  # no overflow however long it went on
    assert policy.retry_after(0, 21600.0) == 300.0
    assert ActivePolicy("1", 5.0).retry_after(1, 3600.0) == 5.0  # the review's retrySeconds: 5
    assert policy.retry_after(3, 60.0) == 300.0  # an interval under retrySeconds: retrySeconds
    # The aborts in a row count until a diag ends otherwise (completed, or could not run).
    state = ActiveState()
    wait = lambda n: policy.retry_after(n, 21600.0)  # noqa: E731
    first = state.retry_later(None, wait, now=100.0, wall=NOW.timestamp())
    assert (first.aborts, first.due, first.at, first.request) == (
        1,
        400.0,
        stamp(-timedelta(seconds=300)),
        None,
    )
    assert state.retry_later(None, wait, now=500.0, wall=NOW.timestamp()).due == 1100.0
    assert state.start() is None  # a routine diag's retry runs no request
    state.settled()
    assert state.retry is None and state.retry_later(None, wait, 0.0, NOW.timestamp()).aborts == 1


def test_a_request_aborted_for_work_is_tried_again_and_its_record_says_so() -> None:
    request = DiagRequest("alice@example.com", "INC-7", "2026-11-28T10:00:00Z", 3)
    state = ActiveState()
    state.ask(request)
    assert state.start() == request
    state.began(request, 3, "2026-11-28T10:05:00Z")
    retry = state.retry_later(request, lambda n: 300.0, 0.0, NOW.timestamp())
    state.end("aborted", "2026-11-28T10:06:00Z", "level 3 diag aborted: pod a/b arrived", retry.at)
    record = state.record
    assert record is not None and record["retryAt"] == "2026-11-28T12:05:00Z" and "attempt" not in record
    assert state.pending is None and state.start() == request  # its retry: the same request
    state.began(request, 3, "2026-11-28T10:11:00Z")
    again = state.record
    assert again is not None and again["attempt"] == 2 and again["outcome"] == "started"
    assert "retryAt" not in again and again["startedAt"] == "2026-11-28T10:11:00Z"
    state.end("completed", "2026-11-28T10:20:00Z")
    state.settled()
    assert (state.record or {})["attempt"] == 2 and state.start() is None  # nothing more to run
    # A new request while a retry waits runs first, as its own first try.
    state.retry_later(request, lambda n: 300.0, 0.0, NOW.timestamp())
    newer = DiagRequest("bob", "INC-8", "2026-11-28T11:00:00Z", 2)
    assert state.ask(newer) and state.start() == newer
    state.began(newer, 3, "2026-11-28T11:01:00Z")
    assert "attempt" not in (state.record or {})


def test_status_lists_a_pending_request_and_the_last_one_started_for_24_hours() -> None:
    def node(results: dict[str, Any] | None = None, **ann: str) -> dict[str, Any]:
        if results is not None:
            ann[K.results] = json.dumps({"status": "pass", "checks": [], **results})
        return {"metadata": {"name": "n1", "annotations": ann, "labels": {}}}

    def status_of(n: dict[str, Any]) -> Any:
        return node_status(n, None, prefix=K.prefix, now=NOW, pods_known=True)

    request = DiagRequest("alice@example.com", "INC-7", stamp(timedelta(minutes=3)), 3)
    pending = status_of(node({}, **{K.diag_requested: request.encode()}))
    assert pending.diagPending == {"by": "alice@example.com", "reason": "INC-7", "at": request.at, "level": 3}
    out = render([pending], "table", NOW)
    assert "DIAGS ASKED FOR" in out
    said = "n1  asked 3m ago by alice@example.com: INC-7 [level 3]: pending (the diag has not started yet)"
    assert said in out
    unnamed = status_of(node(None, **{K.diag_requested: "now"}))
    assert "asked at an unknown time by an unnamed requester (kubectl annotate) [the configured level]" in (
        render([unnamed], "table", NOW)
    )
    done = {
        "by": "alice@example.com",
        "reason": "INC-7",
        "requestedAt": stamp(timedelta(hours=3)),
        "level": 3,
        "outcome": "aborted",
        "startedAt": stamp(timedelta(hours=2)),
        "endedAt": stamp(timedelta(minutes=90)),
        "abortReason": "level 3 diag aborted: pod a/b arrived asking for nvidia.com/gpu",
    }
    ran = status_of(node({"lastDiag": done}))
    assert ran.lastDiag == done and ran.diagPending is None
    said = "n1  asked 3h ago by alice@example.com: INC-7 [level 3]: aborted 90m ago: level 3 diag aborted"
    assert said in render([ran], "table", NOW)
    assert json.loads(render([ran], "json", NOW))[0]["lastDiag"]["by"] == "alice@example.com"
    retried = {**done, "attempt": 2, "retryAt": stamp(timedelta(minutes=80))}
    said = render([status_of(node({"lastDiag": retried}))], "table", NOW)
    assert "aborted 90m ago (try 2: the earlier ones were aborted for work): level 3 diag aborted" in said
    assert f"it runs again once the GPUs are idle, not before {retried['retryAt']}" in said
    old = status_of(node({"lastDiag": {**done, "startedAt": stamp(timedelta(hours=25))}}))
    assert old.lastDiag is None and "DIAGS ASKED FOR" not in render([old], "table", NOW)
