"""Validate before service (issue 31 item 3), without an API server: the engine's judgement of a
complete pass (engine/validation.py), the taint list the writer sends (reporters/validating_taint.py),
and the DCGM diag that a pending validation asks for and reads at once (probes/dcgm/tiers.py).
The real API server and Karpenter's controller: tests/test_validate_kube.py."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.cli.agent_parts import validation_diag_level
from agent.config import load_config_dir
from agent.core.dcgm_report import DiagReport, DiagResult, DiagStatus
from agent.core.facts import Input
from agent.core.findings import CheckResult, Finding
from agent.core.node_keys import EventReason, Keys
from agent.core.results_doc import VALIDATED_FIELD
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.scheduler import TIER_INPUTS
from agent.engine.validation import Validation, diag_passed, tier_passed
from agent.engine.write_policy import fingerprint
from agent.probes.dcgm.idle import IdleVerdict
from agent.probes.dcgm.tiers import DcgmTiers
from agent.reporters.validating_taint import with_validating
from tests.test_engine import engine_for

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
KEY = Keys().validating
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
XID_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)


def snapshot(tmp_path: Path, *, tainted: bool = True, readable: bool = True) -> Path:
    """The healthy p5.48xlarge snapshot, its Node carrying the validating taint (and NVIDIA's)."""
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    node = json.loads((dest / "node.json").read_text())
    node["spec"] = {"taints": [OTHER, *([{"key": KEY, "effect": "NoSchedule"}] if tainted else [])]}
    (dest / "node.json").write_text(json.dumps(node))
    if not readable:
        (dest / "nvidia-smi-q.txt").write_bytes(b"\x00\x01 not nvidia-smi output")
    return dest


def engine(snap: Path, extra_inputs: dict[Input, Any] | None = None, **doc: Any) -> Engine:
    """The engine on *snap* with *doc* over the shipped config, as tests/test_engine.py builds it."""
    return engine_for(snap, extra_inputs, **doc)


def run_every_tier(eng: Engine, skip: tuple[str, ...] = ()) -> None:
    for tier in TIER_INPUTS:
        if tier not in skip:
            eng.run_tier(tier)


# -- the judgement -----------------------------------------------------------------------------------


def test_a_tier_passes_on_pass_warn_or_skipped_and_never_on_unknown_or_fail() -> None:
    warn = Finding("c", "c.r", Severity.MONITOR, "m")
    fail = Finding("c", "c.r", Severity.REBOOT, "m")
    assert tier_passed([CheckResult("a"), CheckResult("b", findings=(warn,)), CheckResult("s", skipped="x")])
    assert not tier_passed([CheckResult("a"), CheckResult("u", unknown="could not read")])
    assert not tier_passed([CheckResult("a"), CheckResult("f", findings=(fail,))])


def test_a_healthy_node_lifts_the_taint_once_every_tier_has_passed_and_not_before(tmp_path: Path) -> None:
    eng = engine(snapshot(tmp_path))
    run_every_tier(eng, skip=("topology",))
    _, marks = eng.evaluate()
    assert marks.validating is None  # the topology tier has not run yet: the taint stays
    assert "validating: waiting for topology" in marks.condition_message
    eng.run_tier("topology")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS and marks.validating is False
    assert [e.reason for e in marks.events if e.reason == EventReason.VALIDATION_PASSED] == [
        EventReason.VALIDATION_PASSED
    ]
    assert json.loads(marks.results_json)[VALIDATED_FIELD]["bootId"] == eng.boot_id
    # Steady state: the same Marks again, nothing to write (the writer finds no taint to lift).
    eng.run_tier("gpu")
    _, again = eng.evaluate()
    assert again.validating is False and not [e for e in again.events if e.reason.startswith("Validation")]
    assert json.loads(again.results_json)[VALIDATED_FIELD] == json.loads(marks.results_json)[VALIDATED_FIELD]
    eng.run_tier("gpu")
    assert fingerprint(eng.evaluate()[1]) == fingerprint(eng.evaluate()[1])


def test_an_unknown_check_keeps_the_taint(tmp_path: Path) -> None:
    eng = engine(snapshot(tmp_path, readable=False))
    run_every_tier(eng)
    for _ in range(3):
        eng.run_tier("gpu")
        verdict, marks = eng.evaluate()
        assert verdict.status is Status.UNKNOWN and marks.validating is None
    assert "validating: waiting for gpu" in marks.condition_message


def test_a_failing_node_keeps_the_taint_and_gets_the_failure_marks(tmp_path: Path) -> None:
    snap = snapshot(tmp_path)
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    eng = engine(snap)
    run_every_tier(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and marks.taint and marks.validating is None
    assert VALIDATED_FIELD not in json.loads(marks.results_json)


def test_a_failure_then_a_pass_waits_for_the_failure_taint_to_recover(tmp_path: Path) -> None:
    """The tiers have all passed once, but the node failed since: the pass counts only once our
    failure taint's hysteresis (recoverAfter) lets it go."""
    eng = engine(snapshot(tmp_path), node={"recoverAfter": 2})
    run_every_tier(eng)
    eng.validation.complete = False  # as if the gpu tier had failed at first
    eng.state.taint_wanted = True
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.validating is None
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.validating is False and not marks.taint


def test_the_agent_adds_the_taint_where_configured_until_it_has_landed(tmp_path: Path) -> None:
    eng = engine(snapshot(tmp_path, tainted=False, readable=False), node={"validate": {"addTaint": True}})
    run_every_tier(eng)
    _, marks = eng.evaluate()
    assert marks.validating is True
    assert [e.reason for e in marks.events if e.reason.startswith("Validation")] == [
        EventReason.VALIDATION_STARTED
    ]
    # mode observe never taints, this one neither
    observe = engine(
        snapshot(tmp_path / "o", tainted=False, readable=False),
        node={"mode": "observe", "validate": {"addTaint": True}},
    )
    run_every_tier(observe)
    assert observe.evaluate()[1].validating is None


def test_an_agent_restart_in_a_validated_boot_adds_no_taint(tmp_path: Path) -> None:
    first = engine(snapshot(tmp_path, tainted=False))
    run_every_tier(first)
    doc = json.loads(first.evaluate()[1].results_json)
    again = engine(
        snapshot(tmp_path / "again", tainted=False, readable=False), node={"validate": {"addTaint": True}}
    )
    again.restore(doc)
    run_every_tier(again)
    _, marks = again.evaluate()
    assert marks.validating is None  # validated in this boot: nothing to add
    assert json.loads(marks.results_json)[VALIDATED_FIELD] == doc[VALIDATED_FIELD]  # kept, not rewritten
    other_boot = engine(
        snapshot(tmp_path / "boot", tainted=False, readable=False), node={"validate": {"addTaint": True}}
    )
    other_boot.restore({**doc, VALIDATED_FIELD: {"bootId": "another boot", "at": "x"}})
    run_every_tier(other_boot)
    assert other_boot.evaluate()[1].validating is True  # a reboot (or a new node): validated again


def test_a_clear_starts_validation_over_and_runs_every_tier_at_once(tmp_path: Path) -> None:
    snap = snapshot(tmp_path)
    eng = engine(snap)
    run_every_tier(eng)
    assert eng.evaluate()[1].validating is False
    node = json.loads((snap / "node.json").read_text())
    node["metadata"]["annotations"] = {Keys().clear_latched: "all"}
    (snap / "node.json").write_text(json.dumps(node))
    _, marks = eng.evaluate()
    assert marks.validating is None and not eng.validation.complete
    assert sorted(eng.schedule.due_tiers(time.monotonic())) == sorted(TIER_INPUTS)


# -- the DCGM diag -----------------------------------------------------------------------------------


def report(level: int | None, finished_at: float | None, status: DiagStatus = DiagStatus.PASS) -> DiagReport:
    """A run on the snapshot's 8 GPUs (one that tested fewer is no pass of the others); GPU 0's status."""
    results = tuple(
        DiagResult("memory", str(i), status if i == 0 else DiagStatus.PASS, "hardware") for i in range(8)
    )
    return DiagReport(results, "DCGM API", "4.4.2", level, None, finished_at)


def test_the_diag_counts_at_the_level_asked_or_deeper_and_only_since_the_reset() -> None:
    ok = [CheckResult("dcgm-diag")]
    assert diag_passed(report(2, 100.0), ok, 2, 50.0)
    assert diag_passed(report(3, 100.0), ok, 2, 50.0)
    assert not diag_passed(report(1, 100.0), ok, 2, 50.0)  # too shallow
    assert not diag_passed(report(None, 100.0), ok, 2, 50.0)  # depth unknown
    assert not diag_passed(report(2, 10.0), ok, 2, 50.0)  # older than the reset
    assert not diag_passed(report(2, 100.0), [CheckResult("dcgm-diag", unknown="x")], 2, 50.0)


def test_where_the_agent_runs_diags_the_pass_waits_for_one(tmp_path: Path) -> None:
    box: dict[str, Any] = {"diag": report(None, None)}
    inputs = {Input.DCGM_DIAG: lambda: box["diag"]}
    eng = engine(snapshot(tmp_path), inputs, node={"validate": {"diagLevel": 3}})
    run_every_tier(eng)
    _, marks = eng.evaluate()
    assert marks.validating is None and "waiting for dcgm-diag" in marks.condition_message
    box["diag"] = report(2, time.time())  # a routine level-2 diag is not enough
    eng.run_tier("dcgm-diag")
    assert eng.evaluate()[1].validating is None
    box["diag"] = report(3, time.time())
    eng.run_tier("dcgm-diag")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS and marks.validating is False
    passed = [e for e in marks.events if e.reason == EventReason.VALIDATION_PASSED]
    assert passed and "DCGM diag at level 3" in passed[0].message
    # A diag that fails: the node fails (the finding latches) and keeps the taint, a later pass too.
    box["diag"] = report(3, time.time(), DiagStatus.FAIL)
    failing = engine(snapshot(tmp_path / "f"), inputs, node={"validate": {"diagLevel": 3}})
    run_every_tier(failing)
    verdict, marks = failing.evaluate()
    assert verdict.status is Status.FAIL and marks.taint and marks.validating is None
    box["diag"] = report(3, time.time())
    failing.run_tier("dcgm-diag")
    verdict, marks = failing.evaluate()
    assert verdict.status is Status.FAIL and marks.validating is None


class Runner:
    """DiagRunner's surface, as DcgmTiers drives it (no host engine here)."""

    def __init__(self) -> None:
        self.level, self.levels, self.in_progress = 2, [], False
        self.latest: Any = report(None, None)
        self.last_skip = ""
        self.go = threading.Event()

    def run_if_idle(self) -> IdleVerdict:
        self.go.wait(5)
        self.levels.append(self.level)
        self.latest = report(self.level, time.time())
        return IdleVerdict(True, "")


def test_a_pending_validation_gets_its_diag_level_and_the_result_is_read_at_once() -> None:
    cfg = load_config_dir(ROOT / "config")
    done: list[bool] = []
    wanted: list[int | None] = [4]
    tiers = DcgmTiers(cfg, lambda: [], wanted_level=lambda: wanted[0], on_done=lambda: done.append(True))
    runner = tiers.runner = Runner()  # type: ignore[assignment]
    first = tiers.diag()  # starts one at level 4 (validation), returns the last (none yet)
    assert tiers._thread is not None and not done
    runner.go.set()
    tiers._thread.join(5)
    assert done == [True] and tiers.runner.levels == [4]
    read = tiers.diag()  # the finished one, read without starting another
    assert read is not first and isinstance(read, DiagReport) and read.level == 4
    assert tiers.runner.levels == [4]
    wanted[0] = None  # validated: routine diags at dcgm.diagLevel again
    tiers.diag()
    tiers._thread.join(5)
    assert tiers.runner.levels == [4, cfg.dcgm.diag_level]


# -- the taint list ----------------------------------------------------------------------------------


def test_only_the_validating_taint_is_added_or_removed_the_others_stay_in_place() -> None:
    ours = {"key": KEY, "effect": "NoSchedule"}
    unhealthy = {"key": Keys().taint, "value": "reboot", "effect": "NoSchedule"}
    taints = [OTHER, ours, unhealthy]
    assert with_validating(taints, False, "gpu-healthcheck") == [OTHER, unhealthy]
    assert with_validating([OTHER], True, "gpu-healthcheck") == [OTHER, ours]
    assert with_validating(taints, True, "gpu-healthcheck") is None  # on already
    assert with_validating([OTHER], False, "gpu-healthcheck") is None  # gone already: nothing to write
    assert with_validating(taints, None, "gpu-healthcheck") is None
    assert with_validating([{"key": "x/validating"}], False, "x") == []  # under the configured prefix


@pytest.mark.parametrize("field", [None, {}, {"bootId": "b"}])
def test_restore_reads_the_record_of_the_last_pass(field: Any) -> None:
    v = Validation()
    v.restore({VALIDATED_FIELD: field} if field is not None else None, "b", VALIDATED_FIELD)
    assert v.needed is (field != {"bootId": "b"})


def test_the_taint_back_on_the_node_after_the_lift_starts_over(tmp_path: Path) -> None:
    """Karpenter's registration (or an operator) puts it back once it was gone: validated again,
    every tier at once, then lifted again; a lift that has not landed yet is no return."""
    snap = snapshot(tmp_path)
    eng = engine(snap)
    run_every_tier(eng)
    assert eng.evaluate()[1].validating is False
    assert eng.evaluate()[1].validating is False  # the Node still shows it: the lift did not land yet
    assert eng.validation.complete
    node = json.loads((snap / "node.json").read_text())
    with_taint = json.dumps(node)
    node["spec"]["taints"] = [OTHER]
    (snap / "node.json").write_text(json.dumps(node))
    assert eng.evaluate()[1].validating is False  # lifted
    (snap / "node.json").write_text(with_taint)  # back
    _, marks = eng.evaluate()
    assert marks.validating is None and not eng.validation.complete
    assert sorted(eng.schedule.due_tiers(time.monotonic())) == sorted(TIER_INPUTS)
    run_every_tier(eng)
    _, marks = eng.evaluate()
    passed = [e.message for e in marks.events if e.reason == EventReason.VALIDATION_PASSED]
    assert marks.validating is False and passed and "since the taint's return" in passed[0]


def test_node_validate_is_live_on_reload(tmp_path: Path) -> None:
    eng = engine(snapshot(tmp_path, tainted=False, readable=False))
    run_every_tier(eng)
    assert eng.evaluate()[1].validating is None  # addTaint off: nothing to add
    eng.cfg = engine(snapshot(tmp_path / "r"), node={"validate": {"addTaint": True, "diagLevel": 4}}).cfg
    assert eng.evaluate()[1].validating is True  # the reloaded config, at the next verdict
    assert validation_diag_level(eng) == 4  # the next diag's level too


# -- how long, and what for (no silent startup taint) ------------------------------------------------


def test_a_node_never_validated_says_it_waits_since_its_creation_and_for_what(tmp_path: Path) -> None:
    """The results annotation's `validating` and the metrics: since the Node's creation (its
    registration put the taint on), the tiers it still waits for; gone once it passed."""
    from agent.core.results_doc import VALIDATING_FIELD
    from agent.reporters.metrics import Metrics

    snap = snapshot(tmp_path)
    node = json.loads((snap / "node.json").read_text())
    node["metadata"]["creationTimestamp"] = "2026-01-01T10:00:00Z"
    (snap / "node.json").write_text(json.dumps(node))
    metrics = Metrics()
    eng = engine(snap)
    eng.metrics = metrics
    run_every_tier(eng, skip=("topology", "efa"))
    _, marks = eng.evaluate()
    doc = json.loads(marks.results_json)[VALIDATING_FIELD]
    assert doc == {"since": "2026-01-01T10:00:00Z", "bootId": eng.boot_id, "waitingFor": ["efa", "topology"]}
    text = metrics_text(metrics)
    age = time.time() - eng.validation.since  # type: ignore[operator]
    assert age > 3600  # created long ago: the alert's 30 minutes are long past
    (line,) = [x for x in text.splitlines() if x.startswith("gpu_healthcheck_validating_seconds ")]
    assert abs(float(line.split()[1]) - age) < 5  # computed at the scrape: it grows between checks
    assert 'gpu_healthcheck_validating_waiting_for{what="efa"} 1.0' in text
    assert 'gpu_healthcheck_validating_waiting_for{what="topology"} 1.0' in text
    # Steady while it waits: the annotation does not change from one cycle to the next.
    eng.run_tier("gpu")
    assert json.loads(eng.evaluate()[1].results_json)[VALIDATING_FIELD] == doc
    eng.run_tier("topology")
    eng.run_tier("efa")
    _, marks = eng.evaluate()
    assert marks.validating is False and VALIDATING_FIELD not in json.loads(marks.results_json)
    text = metrics_text(metrics)
    assert "gpu_healthcheck_validating_seconds 0.0" in text and "validating_waiting_for{" not in text


def test_a_validated_node_that_gets_the_taint_back_counts_from_when_it_was_seen(tmp_path: Path) -> None:
    """A node validated before (a reboot, a clear, Karpenter re-registering): since the agent first
    saw the taint, not the Node's creation; an agent restart in the same boot takes it back."""
    from agent.core.results_doc import VALIDATING_FIELD

    snap = snapshot(tmp_path, readable=False)  # unknown: it keeps waiting for the gpu tier
    node = json.loads((snap / "node.json").read_text())
    node["metadata"]["creationTimestamp"] = "2025-06-01T00:00:00Z"
    (snap / "node.json").write_text(json.dumps(node))
    eng = engine(snap)
    eng.restore({VALIDATED_FIELD: {"bootId": "an earlier boot", "at": "2025-06-01T00:05:00Z"}})
    before = time.time()
    run_every_tier(eng)
    _, marks = eng.evaluate()
    doc = json.loads(marks.results_json)
    assert doc[VALIDATING_FIELD]["waitingFor"] == ["gpu"]
    assert before - 1 <= eng.validation.since <= time.time()  # type: ignore[operator]
    again = engine(snap)  # the agent restarted: same boot, the annotation as written
    again.restore(doc)
    assert again.validation.since == int(eng.validation.since)  # type: ignore[arg-type]
    other = engine(snap)  # a new boot: the old `validating` is not this one's
    other.restore({**doc, VALIDATING_FIELD: {**doc[VALIDATING_FIELD], "bootId": "another"}})
    assert other.validation.since is None


def metrics_text(metrics: Any) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()
