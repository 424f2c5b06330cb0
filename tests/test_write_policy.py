"""The loop's write policy (also what bench/fleet.py simulates): back off, then ask the brake again; and
the one write contract: the fingerprint is every field of the Node write, and a field of the Marks
that is neither in it nor exempt with its reason fails here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pytest

from agent.config import parse_config
from agent.core.device_scope import Scope
from agent.core.marks import EXEMPT, Marks, NodeEvent, NodeWrite, WriteContext
from agent.core.remediation_types import RemediationMark
from agent.core.severity import Severity, Status
from agent.engine.write_policy import TERMS, WritePolicy, brake_reask_s, fingerprint, unaccounted


@dataclass(frozen=True)
class Outcome:
    ok: bool
    brake_open: bool = False
    error: str | None = None
    remediation_held: str = ""
    held_key: str = ""


def test_failed_writes_back_off_1_2_4_up_to_30_s_and_a_success_resets_it() -> None:
    policy = WritePolicy(lambda: 30.0)
    waits = [policy.next_try(Outcome(ok=False, error="API error 503")) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert policy.next_try(Outcome(ok=True)) is None  # written: nothing to retry
    assert policy.next_try(Outcome(ok=False)) == 1.0  # the backoff starts over


def test_only_a_failed_write_holds_the_next_one_back_and_a_braked_one_does_not() -> None:
    """The loop writes nothing while `failing` and the stated wait is not over (a refusal, an
    unreachable API server); a brake or repair hold re-asks but never holds a changed verdict back."""
    policy = WritePolicy(lambda: 30.0)
    assert not policy.failing
    policy.next_try(Outcome(ok=False, error="API error 403"))
    assert policy.failing
    policy.next_try(Outcome(ok=True, brake_open=True))
    assert not policy.failing


def test_a_braked_write_is_asked_again_after_min_30_s_and_the_gpu_interval() -> None:
    cfg = parse_config({"intervals": {"gpu": 10}})
    assert WritePolicy(lambda: brake_reask_s(cfg)).next_try(Outcome(ok=True, brake_open=True)) == 10.0
    slow = parse_config({"intervals": {"gpu": 600}})
    assert WritePolicy(lambda: brake_reask_s(slow)).next_try(Outcome(ok=True, brake_open=True)) == 30.0


def test_a_held_remediation_mark_is_asked_again_like_a_braked_taint() -> None:
    cfg = parse_config({"intervals": {"gpu": 10}})
    policy = WritePolicy(lambda: brake_reask_s(cfg))
    assert policy.next_try(Outcome(ok=True, remediation_held="wave", held_key="xid/79")) == 10.0
    assert policy.next_try(Outcome(ok=True)) is None  # marked (or no wish): nothing to ask again


# ------------------------------------------------------------------------------ the write contract

DOC = {
    "version": 1,
    "status": "pass",
    "checkedAt": "2026-11-28T10:00:00Z",
    "checks": [{"name": "xid", "status": "pass", "message": "no Xid", "at": "2026-11-28T10:00:00Z"}],
    "latched": [],
    "trends": {"t": [1]},
}
BASE = Marks(Status.PASS, Severity.NONE, json.dumps(DOC), False, "pass: all checks passed")
AHR = "AcceleratedHardwareReady"
# A second value of every field of the Marks: a new field needs one here (the test below says so).
BASE_DEGRADED = Marks(
    status=Status.DEGRADED,
    severity=Severity.REBOOT,
    results_json="{}",
    taint=False,
    condition_message="degraded",
)
OTHER: dict[str, Any] = {
    "status": Status.FAIL,
    "severity": Severity.REBOOT,
    "results_json": json.dumps({**DOC, "checks": [{**DOC["checks"][0], "status": "fail"}]}),  # type: ignore[dict-item]
    "taint": True,
    "condition_message": "fail (reboot): xid: Xid 79",
    "taint_severity": Severity.ISOLATE,
    "taint_effect": "NoExecute",
    "unhealthy_label": True,
    "config_rejected": True,
    "trends_digest": "0123456789abcdef",
    "remediation": (RemediationMark(AHR, "False", True, "GPUHealthcheckFailed", "fail (reboot)"),),
    "validating": True,
    "scope": Scope(node_wide=False, gpus=("0000:97:00.0",)),
    "warn_scope": Scope(node_wide=False, gpus=("0000:a8:00.0",)),
    "testing": True,
    "risk": "high",
    "events": (NodeEvent("GPUHealthChanged", "pass → fail"),),
    "drop_annotations": ("gpu-healthcheck.io/clear-latched",),
    "worst_key": "xid/79/0000:97:00.0",
    "boot_id": "b2",
    "clear_kept": ("xid/79/0000:97:00.0",),
    "device_effect": "NoExecute",
    "in_service": "7-of-8",
    "degraded": BASE_DEGRADED,
    "gpu_notes": {"0000:97:00.0": "xid: Xid 79"},
    "isolated": ("0000:86:00.0",),
}


def assert_every_field_accounted(marks: type[Any]) -> None:
    """The contract: a field of the Marks is in the fingerprint, or exempt with its reason."""
    missing = unaccounted(marks)
    assert not missing, f"neither in the fingerprint nor exempt with a reason: {missing}"


def test_every_field_of_the_marks_is_in_the_fingerprint_or_exempt_with_its_reason() -> None:
    assert_every_field_accounted(Marks)
    assert {name for name, _ in TERMS} == {f.name for f in fields(NodeWrite)}  # the whole write
    for f in fields(WriteContext):  # the context never makes a write by itself, and says why
        assert f.metadata[EXEMPT].strip(), f.name


def test_a_field_neither_in_the_fingerprint_nor_exempt_fails_the_contract() -> None:
    """A Marks with one field more, as a feature might add it beside the write: the check names it."""

    @dataclass(frozen=True)
    class Wider(Marks):
        isolation_hint: str = ""

    @dataclass(frozen=True)
    class Explained(Marks):
        isolation_hint: str = field(default="", metadata={EXEMPT: "read by the device-taint writer only"})

    @dataclass(frozen=True)
    class Unexplained(Marks):
        isolation_hint: str = field(default="", metadata={EXEMPT: ""})

    assert unaccounted(Wider) == ["isolation_hint"]
    with pytest.raises(AssertionError, match="isolation_hint"):
        assert_every_field_accounted(Wider)
    assert_every_field_accounted(Explained)
    assert unaccounted(Unexplained) == ["isolation_hint"]  # a reason must say something


def test_the_fingerprint_is_derived_from_every_field_of_the_write() -> None:
    """Each field of the write, changed alone, changes the fingerprint; each exempt field does not."""
    assert set(OTHER) == {f.name for f in fields(Marks)}, "give a new field a second value in OTHER"
    exempt = {f.name for f in fields(Marks) if f.metadata.get(EXEMPT)}
    for name, value in OTHER.items():
        changed = fingerprint(replace(BASE, **{name: value})) != fingerprint(BASE)
        assert changed is (name not in exempt), name


def test_the_terms_leave_out_what_changes_without_a_write() -> None:
    """Timestamps, durations and the trend reads (they stand as trends_digest), a remediation mark's
    counting key and a scope's reason do not make a write."""
    doc = {**DOC, "checkedAt": "2026-11-28T10:05:00Z", "trends": {"t": [1, 2]}}
    doc["checks"] = [{**DOC["checks"][0], "at": "2026-11-28T10:05:00Z", "durationMs": 3.5}]  # type: ignore[dict-item]
    assert fingerprint(replace(BASE, results_json=json.dumps(doc))) == fingerprint(BASE)
    mark = OTHER["remediation"][0]
    counted = replace(BASE, remediation=(mark,))
    assert fingerprint(replace(counted, remediation=(replace(mark, key="xid/79"),))) == fingerprint(counted)
    scoped = replace(BASE, scope=Scope(node_wide=True, why="a"))
    assert fingerprint(replace(scoped, scope=Scope(node_wide=True, why="b"))) == fingerprint(scoped)
