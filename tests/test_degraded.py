"""A node whose only failures are isolated GPUs is degraded, not failed (engine/degraded.py): the
engine writes both versions of a verdict and the device-taint writer shows the degraded one only
where the rules are in place (tests/test_device_taints_kube.py holds that on the real API server).
These run the real engine over the bundled p5.48xlarge snapshot (8 H100s) with Xid lines appended."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config_dir, parse_config
from agent.core.node_keys import CONDITIONS, ConditionReason, EventReason
from agent.core.severity import Severity, Status
from agent.engine.degraded import still_shown
from agent.engine.engine import Engine
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"


def xid(pci: str, number: int = 79) -> str:
    return (
        f"kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:{pci}): {number}, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n"
    )


GPU3, GPU4 = "0000:86:00", "0000:97:00"  # GPU 3 and GPU 4 of the bundled snapshot (Minor Number)


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    return dest


def engine(snap: Path, severities: dict[str, str] | None = None, **node: object) -> Engine:
    cfg = load_config_dir(ROOT / "config")
    doc: dict[str, object] = {"node": node, **({"severities": severities} if severities else {})}
    base = parse_config(doc) if node or severities else cfg
    cfg = type(cfg)(
        raw=base.raw,
        profiles=cfg.profiles,
        xid_catalog=cfg.xid_catalog,
        severity_overrides=cfg.severity_overrides,
    )
    return Engine(SnapshotSource(snap), cfg)


def verdict_after(
    snap: Path, lines: str, severities: dict[str, str] | None = None, **node: object
) -> tuple[Engine, Any]:
    eng = engine(snap, severities, **node)
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    eng.evaluate()  # the healthy verdict first: pass
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(lines)
    eng.run_tier("xid")
    return eng, eng.evaluate()[1]


def test_one_bad_gpu_under_isolation_writes_a_degraded_version(snap: Path) -> None:
    _, marks = verdict_after(snap, xid(GPU3), isolation="gpu")
    assert marks.status is Status.FAIL and marks.taint  # the verdict itself: the writer decides
    d = marks.degraded
    assert d is not None
    assert (d.status, d.severity, d.in_service) == (Status.DEGRADED, Severity.REBOOT, "7-of-8")
    assert CONDITIONS[d.status].status == "True" and d.condition_reason is ConditionReason.GPUS_ISOLATED
    assert d.condition_message.startswith(
        "degraded (7 of 8 GPUs in service; isolated: GPU 3 (0000:86:00.0)): "
    )
    assert "Xid 79" in d.condition_message and d.condition_message.endswith("when drained")
    (health,) = [e for e in d.events if e.reason is EventReason.GPU_HEALTH_CHANGED]
    assert health.message.startswith("pass → degraded: 7 of 8 GPUs in service; isolated: GPU 3"), health
    (base_health,) = [e for e in marks.events if e.reason is EventReason.GPU_HEALTH_CHANGED]
    assert base_health.message.startswith("pass → fail"), base_health
    assert '"status":"degraded"' in d.results_json and '"inService":{"gpus":8,"serving":7' in d.results_json
    assert '"isolate":"reboot:' in d.results_json and '"would":{"taint"' not in d.results_json
    assert marks.device_effect == "NoExecute"  # the shipped default for a GPU that needs a reboot
    assert marks.taint_effect == "NoSchedule"  # the node taint's stays as shipped
    assert "Xid 79" in marks.gpu_notes["00000000:86:00.0"]  # keyed as the slices' devices are


def test_without_isolation_there_is_no_degraded_version(snap: Path) -> None:
    _, marks = verdict_after(snap, xid(GPU3))  # node.isolation: node, as shipped
    assert marks.status is Status.FAIL and marks.degraded is None and marks.in_service == ""


def test_two_bad_gpus_at_once_are_a_node_fault_by_default_and_isolated_when_told(
    snap: Path, tmp_path: Path
) -> None:
    _, marks = verdict_after(snap, xid(GPU3) + xid(GPU4), isolation="gpu")
    assert marks.scope is not None and marks.scope.node_wide and "isolationNodeAtGpus: 2" in marks.scope.why
    assert marks.degraded is None  # the node taint and the remediation conditions, as today
    other = tmp_path / "other"
    shutil.copytree(HEALTHY, other, symlinks=True)
    _, marks = verdict_after(other, xid(GPU3) + xid(GPU4), isolation="gpu", isolationNodeAtGpus=0)
    assert marks.degraded is not None and marks.degraded.in_service == "6-of-8"


def test_a_fault_not_confined_to_one_gpu_beside_an_isolated_gpu_is_a_failed_node(snap: Path) -> None:
    """An Xid that names no GPU of the inventory (0000:ff:00) cannot be isolated: the node fails."""
    _, marks = verdict_after(snap, xid(GPU3) + xid("0000:ff:00"), isolation="gpu")
    assert marks.status is Status.FAIL and marks.degraded is None
    assert marks.scope is not None and marks.scope.node_wide


def test_a_degraded_node_stays_degraded_while_the_verdict_fails() -> None:
    assert still_shown(Status.DEGRADED, Status.FAIL) is Status.DEGRADED
    assert still_shown(Status.DEGRADED, Status.PASS) is Status.PASS
    assert still_shown(Status.FAIL, Status.FAIL) is Status.FAIL


def test_the_next_verdict_after_degraded_says_no_change_and_recovery_says_from_degraded(snap: Path) -> None:
    eng, _ = verdict_after(snap, xid(GPU3), isolation="gpu")
    eng.state.last_status = Status.DEGRADED  # what the writer reports having shown (ApplyResult.shown)
    eng.run_tier("xid")
    again = eng.evaluate()[1]
    assert not [e for e in again.events if e.reason is EventReason.GPU_HEALTH_CHANGED]
    assert again.degraded is not None
    assert not [e for e in again.degraded.events if e.reason is EventReason.GPU_HEALTH_CHANGED]
    assert eng.state.last_status is Status.DEGRADED  # a write skipped as unchanged keeps it


def test_the_isolated_event_note_names_the_pods_on_the_gpu() -> None:
    from agent.core.device_scope import Scope
    from agent.core.findings import CheckResult, Finding
    from agent.engine.degraded import gpu_notes

    finding = Finding(
        check="xid",
        rule="xid.79",
        severity=Severity.REBOOT,
        message="Xid 79 on GPU 3",
        key="xid/79/0000:86:00.0",
        entities=("0000:86:00.0",),
    )
    result = CheckResult(name="xid", findings=(finding,))
    gpus = [{"pci": "0000:86:00.0", "pods": ["team-a/holds-gpu-3/main"]}]
    notes = gpu_notes([result], Scope(False, ("00000000:86:00.0",)), gpus)
    assert notes == {"00000000:86:00.0": "xid: Xid 79 on GPU 3; pods on it: team-a/holds-gpu-3/main"}


def test_a_degraded_node_keeps_its_brake_slot_and_a_recovered_one_frees_it() -> None:
    """Its isolated GPUs' rules hold the node's brake share (DESIGN.md §6.1): the writer's gate frees
    the slot only once the node wants no taint and neither fails nor is degraded. Found by
    tests/test_upgrade_kube.py: a new agent freed the isolated node's slot and a third node took it."""
    from agent.core.marks import Marks
    from agent.reporters.taint_gate import TaintGate

    class Brake:
        def __init__(self) -> None:
            self.released: list[str] = []

        def release(self, node: str) -> None:
            self.released.append(node)

        def forget(self, node: str) -> None:
            pass

    brake = Brake()
    gate = TaintGate("n", brake, prefix="gpu-healthcheck")  # type: ignore[arg-type]
    for status, freed in ((Status.DEGRADED, []), (Status.FAIL, []), (Status.PASS, ["n"])):
        marks = Marks(
            status=status, severity=Severity.REBOOT, results_json="{}", taint=False, condition_message=""
        )
        gate.settle(gate.decide({}, marks), dry_run=False)
        assert brake.released == freed, status


def test_what_the_loop_adds_reaches_the_degraded_version_too(snap: Path) -> None:
    """A ConfigReloaded Event or a rejected config's note, added by the loop after the engine built
    the Marks, is in whichever version the writer shows (found by tests/test_upgrade_kube.py: a
    degraded node's reload Event was lost)."""
    from dataclasses import replace

    from agent.core.marks import NodeEvent
    from agent.engine.degraded import amended

    _, marks = verdict_after(snap, xid(GPU3), isolation="gpu")
    reloaded = NodeEvent(EventReason.CONFIG_RELOADED, "config reloaded")
    out = amended(marks, lambda m: replace(m, events=(reloaded, *m.events), config_rejected=True))
    assert out.degraded is not None and out.degraded.status is Status.DEGRADED
    for version in (out, out.degraded):
        assert version.events[0] == reloaded and version.config_rejected


def test_the_node_status_metric_says_degraded_only_while_the_node_reads_so() -> None:
    """A recovering node keeps its rules (recoverAfter) while it reads pass: the metric of isolated
    GPUs counts them, the node's status metric stays what the engine recorded."""
    from agent.reporters.metrics import Metrics

    def status_series(m: Metrics) -> dict[str, float]:
        got = {}
        for family in m.registry.collect():
            if family.name == "gpu_healthcheck_node_status":
                got = {s.labels["status"]: s.value for s in family.samples}
        return got

    m = Metrics()
    m.record_verdict(Status.PASS, [])
    m.record_isolated_gpus(1, Status.PASS)  # recovering: the rule still stands
    assert status_series(m) == {"pass": 1.0}
    m.record_isolated_gpus(1, Status.DEGRADED)
    assert status_series(m) == {"degraded": 1.0}
