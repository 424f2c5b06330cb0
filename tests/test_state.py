"""What the engine remembers from one cycle to the next (engine/state.py), on a snapshot: latches per
boot and their restore after a restart, the taint's hysteresis (recoverAfter passing cycles; an
unknown cycle freezes the count), the same hysteresis for each remediation condition, and an
operator's clear (who and why, and a clear that holds while no new evidence comes). The clear on the
real API server: tests/test_clear.py; the remediation conditions' writes: tests/test_remediation*.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.config import load_config_dir, parse_config
from agent.core.marks import Marks
from agent.core.node import NodeObject
from agent.core.node_keys import Keys, Reason
from agent.core.remediation_types import RemediationMark, RemediationReason
from agent.core.severity import Severity, Status
from agent.core.telemetry import NoTelemetry
from agent.engine.engine import Engine
from agent.engine.state import EngineState, Latch
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
K = Keys()
XID = "xid/79/0000:97:00.0"
XID_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)
AHR = "AcceleratedHardwareReady"
R = RemediationReason


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    return dest


def engine_for(snap: Path) -> Engine:
    """The engine with the shipped config."""
    return Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"))


def remediating_engine_for(snap: Path) -> Engine:
    """The engine with two remediation conditions: AHR from reset, GPUIsolate from isolate."""
    shipped = load_config_dir(ROOT / "config")
    doc = {
        "node": {"remediationConditions": [{"type": AHR}, {"type": "GPUIsolate", "minSeverity": "isolate"}]}
    }
    base = parse_config(doc)
    cfg = type(shipped)(raw=base.raw, profiles=shipped.profiles, xid_catalog=shipped.xid_catalog)
    return Engine(SnapshotSource(snap), cfg)


def run_all(engine: Engine) -> None:
    for tier in ("gpu", "xid", "efa", "topology"):
        engine.run_tier(tier)


def gpu_timeout(snap: Path) -> None:
    """A hung nvidia-smi: a GPU failure at reboot (not latched), once two gpu cycles confirm it."""
    (snap / "errors.json").write_text(
        json.dumps({"nvidia-smi-q.txt": {"kind": "timeout", "message": "no answer after 30 s; killed"}})
    )


def garble(snap: Path) -> None:
    """nvidia-smi answers, but nobody can read it: unknown."""
    (snap / "errors.json").unlink(missing_ok=True)
    (snap / "nvidia-smi-q.txt").write_bytes(b"\x00\x01 garbage, not nvidia-smi output")


def by_type(marks: Marks) -> dict[str, RemediationMark]:
    return {m.type: m for m in marks.remediation}


# ------------------------------------------------------------------------------------------ latches


def test_an_appended_xid_latches_until_reboot(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)
    eng.evaluate()
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    eng.run_tier("xid")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and verdict.severity is Severity.REBOOT and marks.taint
    assert [e.reason for e in marks.events] == [Reason.GPU_HEALTH_CHANGED, Reason.LATCHED_FINDING]
    assert marks.condition_status == "False" and "Xid 79" in marks.condition_message
    doc = json.loads(marks.results_json)
    assert [item["key"] for item in doc["latched"]] == ["xid/79/0000:97:00.0"]

    # The ring buffer rotates the line away: the latch keeps the node failing.
    shutil.copy(HEALTHY / "kmsg.log", snap / "kmsg.log")
    eng.run_tier("xid")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and "latched since" in marks.condition_message
    assert marks.events == ()  # nothing new to say

    # A reboot (new boot id) drops the latch; the taint stays until recoverAfter passing gpu cycles.
    (snap / "boot_id").write_text("another-boot\n")
    eng.run_tier("gpu")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS and eng.latches == {}
    assert marks.taint, "hysteresis: one passing cycle is not enough"
    for _ in range(2):
        eng.run_tier("gpu")
        _, marks = eng.evaluate()
    assert not marks.taint


def test_latches_are_restored_from_the_node_annotation_of_the_same_boot(snap: Path) -> None:
    eng = engine_for(snap)
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    run_all(eng)
    _, marks = eng.evaluate()
    saved = json.loads(marks.results_json)

    shutil.copy(HEALTHY / "kmsg.log", snap / "kmsg.log")  # the line is gone from the ring
    restarted = engine_for(snap)
    restarted.restore(saved)
    run_all(restarted)
    verdict, marks = restarted.evaluate()
    assert verdict.status is Status.FAIL and marks.taint
    assert "xid/79/0000:97:00.0" in restarted.latches

    other_boot = dict(saved, bootId="some-other-boot")
    fresh = engine_for(snap)
    fresh.restore(other_boot)
    assert fresh.latches == {}
    assert fresh.taint_wanted  # the Node was failing: untaint only after recoverAfter passes


# ------------------------------------------------------------------------------- taint hysteresis


def test_an_unknown_cycle_freezes_recovery_and_keeps_the_taint(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)
    eng.evaluate()
    gpu_timeout(snap)  # a hung nvidia-smi: a GPU failure (reboot), not latched
    eng.run_tier("gpu")
    eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and marks.taint and marks.taint_value == "reboot"

    # nvidia-smi answers again, but with output nobody can read: unknown, never a pass.
    (snap / "errors.json").unlink()
    (snap / "nvidia-smi-q.txt").write_bytes(b"\x00\x01 garbage, not nvidia-smi output")
    for _ in range(5):
        eng.run_tier("gpu")
        verdict, marks = eng.evaluate()
        assert verdict.status is Status.UNKNOWN
        assert marks.taint, "a missing signal never clears a taint"
        assert marks.taint_value == "reboot"  # the taint keeps its last failing severity
    assert "recovery paused at 0/3" in marks.condition_message
    doc = json.loads(marks.results_json)
    assert doc["taint"] == {"severity": "reboot", "passes": 0}

    # A restart while frozen keeps the taint and its value.
    restarted = engine_for(snap)
    restarted.restore(doc)
    run_all(restarted)
    _, again = restarted.evaluate()
    assert again.taint and again.taint_value == "reboot"

    # Readable and healthy again: recoverAfter (3) passing cycles, then the taint goes.
    shutil.copy(HEALTHY / "nvidia-smi-q.txt", snap / "nvidia-smi-q.txt")
    seen = []
    for _ in range(3):
        eng.run_tier("gpu")
        verdict, marks = eng.evaluate()
        seen.append(marks.taint)
    assert verdict.status is Status.PASS and seen == [True, True, False]
    assert "taint" not in json.loads(marks.results_json)


def test_an_unknown_cycle_between_passes_neither_counts_nor_resets(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)
    gpu_timeout(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    eng.evaluate()
    (snap / "errors.json").unlink()
    eng.run_tier("gpu")  # pass 1
    _, marks = eng.evaluate()
    assert "1/3" in marks.condition_message
    (snap / "nvidia-smi-q.txt").write_bytes(b"garbage")
    eng.run_tier("gpu")  # unknown: frozen at 1
    _, marks = eng.evaluate()
    assert marks.taint and "recovery paused at 1/3" in marks.condition_message
    shutil.copy(HEALTHY / "nvidia-smi-q.txt", snap / "nvidia-smi-q.txt")
    eng.run_tier("gpu")  # pass 2
    _, marks = eng.evaluate()
    assert marks.taint
    eng.run_tier("gpu")  # pass 3
    _, marks = eng.evaluate()
    assert not marks.taint


# -------------------------------------------------------------------- remediation conditions' hysteresis


def test_fail_sets_unknown_never_does_and_unknown_after_fail_keeps_it(snap: Path) -> None:
    garble(snap)
    eng = remediating_engine_for(snap)
    run_all(eng)
    verdict, marks = eng.evaluate()
    first = by_type(marks)[AHR]
    assert verdict.status is Status.UNKNOWN
    assert not first.unhealthy and first.reason == R.COULD_NOT_CHECK and first.healthy_status == "True"
    assert "never acts on a node we could not check" in first.message

    shutil.copy(HEALTHY / "nvidia-smi-q.txt", snap / "nvidia-smi-q.txt")
    gpu_timeout(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    verdict, marks = eng.evaluate()
    got = by_type(marks)
    assert verdict.status is Status.FAIL and verdict.severity is Severity.REBOOT
    assert got[AHR].unhealthy and got[AHR].reason == "GPUHealthcheckGPULostReboot"  # fault, action
    assert "gpu.responsive" in got[AHR].message and "→ reboot" in got[AHR].message  # finding + next step
    assert not got["GPUIsolate"].unhealthy and got["GPUIsolate"].reason == R.BELOW_MIN_SEVERITY

    garble(snap)
    for _ in range(4):
        eng.run_tier("gpu")
        verdict, marks = eng.evaluate()
        assert verdict.status is Status.UNKNOWN
        kept = by_type(marks)[AHR]
        assert kept.unhealthy and kept.reason == R.RECOVERING, "unknown never lifts it"
    assert "recovery paused at 0/3" in kept.message and "gpu.responsive" in kept.message
    doc = json.loads(marks.results_json)
    assert doc["remediation"][AHR]["severity"] == "reboot"

    # A restart while paused keeps it (the results annotation's `remediation` field).
    again = remediating_engine_for(snap)
    again.restore(doc)
    run_all(again)
    assert by_type(again.evaluate()[1])[AHR].unhealthy

    # recoverAfter (3) passing cycles, exactly as the taint.
    shutil.copy(HEALTHY / "nvidia-smi-q.txt", snap / "nvidia-smi-q.txt")
    seen = []
    for _ in range(3):
        eng.run_tier("gpu")
        _, marks = eng.evaluate()
        seen.append((marks.taint, by_type(marks)[AHR].unhealthy))
    assert seen == [(True, True), (True, True), (False, False)]
    assert by_type(marks)[AHR].reason == R.PASSED and "remediation" not in json.loads(marks.results_json)


# ------------------------------------------------------------------------------------------- clears


def test_an_operator_clear_lifts_it_at_once(snap: Path) -> None:
    eng = remediating_engine_for(snap)
    run_all(eng)
    gpu_timeout(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    eng.evaluate()
    (snap / "errors.json").unlink()
    eng.run_tier("gpu")
    eng.state.operator_cleared = True
    _, marks = eng.evaluate()
    assert not marks.taint and not by_type(marks)[AHR].unhealthy


def test_the_agent_names_who_and_why_and_keeps_the_request() -> None:
    state = EngineState("boot-1", NoTelemetry())
    state.latches[XID] = Latch("xid", XID, Severity.REBOOT, "2026-03-01T10:00:00Z", "Xid 79")
    request = '{"by":"alice@example.com","reason":"GPU 3 reseated","at":"2026-03-01T11:59:00Z"}'
    node = NodeObject(
        name="n1",
        labels={},
        allocatable_gpus=None,
        capacity_gpus=None,
        annotations={K.clear_latched: "all", K.clear_latched_by: request},
    )
    drop, event = state.take_clear_request(
        node, K.clear_latched, {}, K.clear_latched_by, "2026-03-01T12:00:00Z"
    )
    assert drop == (K.clear_latched, K.clear_latched_by) and event is not None
    assert event.reason == "LatchesCleared"
    assert (
        event.message == f"cleared 1 latched finding(s): {XID}; by alice@example.com (reason: GPU 3 reseated)"
    )
    assert state.last_clear == {
        "at": "2026-03-01T12:00:00Z",
        "by": "alice@example.com",
        "reason": "GPU 3 reseated",
        "latches": [XID],
        "requested": "all",
    }
    # Set by hand with kubectl annotate: cleared all the same, and said so.
    state.latches[XID] = Latch("xid", XID, Severity.REBOOT, "2026-03-01T10:00:00Z", "Xid 79")
    node = NodeObject(
        name="n1", labels={}, allocatable_gpus=None, capacity_gpus=None, annotations={K.clear_latched: XID}
    )
    drop, event = state.take_clear_request(node, K.clear_latched, {}, K.clear_latched_by, "t")
    assert drop == (K.clear_latched,) and event is not None and "by an unnamed requester" in event.message


def test_a_cleared_xid_stays_cleared_when_only_its_gpus_label_comes_back(tmp_path: Path) -> None:
    """An Xid seen while nvidia-smi did not answer names its GPU by PCI address; once nvidia-smi
    answers it says "GPU 4 (…)". That is no new evidence: a clear holds (it came straight back, with
    the taint, before Finding.evidence_key)."""
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    annotations: dict[str, str] = {}

    def node() -> NodeObject:
        return NodeObject("n1", {}, 8, 8, annotations=dict(annotations))

    eng = Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"), node_getter=node)
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    (snap / "errors.json").write_text(json.dumps({"nvidia-smi-q.txt": {"kind": "timeout", "message": "x"}}))
    eng.run_tier("gpu")
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    eng.run_tier("xid")
    (snap / "errors.json").unlink()
    eng.run_tier("gpu")
    verdict, _ = eng.evaluate()
    assert verdict.worst is not None and "on GPU 0000:97:00.0 ×1" in verdict.worst.message
    annotations[K.clear_latched] = "all"
    verdict, marks = eng.evaluate()
    assert verdict.status.value == "pass" and not marks.taint
    annotations.clear()
    eng.run_tier("xid")  # the same line, now labelled "GPU 4 (0000:97:00.0)"
    verdict, marks = eng.evaluate()
    assert verdict.status.value == "pass" and not marks.taint
    with (snap / "kmsg.log").open("a") as fh:  # a new Xid is new evidence
        fh.write(XID_LINE)
    eng.run_tier("xid")
    verdict, marks = eng.evaluate()
    assert verdict.status.value == "fail" and "GPU 4 (0000:97:00.0) ×2" in (
        verdict.worst.message if verdict.worst else ""
    )
