"""What a reboot did not fix (engine/reboot_escalation.py), on a snapshot: a failing finding that comes
back on the same GPU (by serial) after node.escalateAfterReboots reboots becomes `isolate`; its
history survives an agent restart, stays bounded, goes with a cleared latch, and can be turned off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agent.config import load_config_dir
from agent.core.actions import Action
from agent.core.findings import CheckResult, Finding
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes.snapshot import SnapshotSource
from tests.test_gpu_verdicts import HEALTHY, ROOT, XID48_GPU2


def _engine(snap: Path, **node: object) -> Engine:
    cfg = load_config_dir(ROOT / "config")
    if node:
        import dataclasses

        raw = json.loads(json.dumps(cfg.raw))
        raw["node"].update(node)
        cfg = dataclasses.replace(cfg, raw=raw)
        cfg.__dict__.pop("node", None)  # the typed section is cached per Config
    return Engine(SnapshotSource(snap), cfg)


def _boot(snap: Path, boot: str, xid: bool) -> None:
    (snap / "boot_id").write_text(boot + "\n")
    shutil.copy(HEALTHY / "kmsg.log", snap / "kmsg.log")
    if xid:
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID48_GPU2)


def _cycle(eng: Engine) -> tuple[Any, Any]:
    for tier in ("gpu", "xid"):
        eng.run_tier(tier)
    return eng.evaluate()


def test_a_fault_back_after_two_reboots_isolates_and_the_history_survives_a_restart(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    _boot(snap, "boot-a", xid=True)
    eng = _engine(snap)
    verdict, marks = _cycle(eng)
    assert verdict.severity is Severity.RESET  # first time: NVIDIA's reset
    _boot(snap, "boot-b", xid=False)
    assert _cycle(eng)[0].status is Status.PASS  # the reboot fixed it ...
    _boot(snap, "boot-b", xid=True)
    verdict, marks = _cycle(eng)
    assert verdict.severity is Severity.RESET  # ... until it came back: once is not yet a pattern
    doc = json.loads(marks.results_json)

    # the agent restarts: the history comes back from the Node, across boots
    _boot(snap, "boot-c", xid=True)
    eng = _engine(snap)
    eng.restore(doc)
    verdict, marks = _cycle(eng)
    assert verdict.severity is Severity.ISOLATE
    worst = verdict.worst
    assert worst is not None and worst.message.endswith("(came back after 2 reboots)")
    assert worst.recommendation.action is Action.SERVICE
    doc = json.loads(marks.results_json)
    (seen,) = doc["history"]
    assert seen["gpu"] == "1654922018857"  # GPU 2's serial: the board, not the slot
    assert seen["boots"] == ["boot-a", "boot-b", "boot-c"] and seen["key"] == "xid/48/0000:75:00.0"
    assert doc["gpus"][2]["severity"] == "isolate"


def test_history_is_bounded_cleared_with_its_latch_and_can_be_switched_off(tmp_path: Path) -> None:
    from agent.core.node import NodeObject
    from agent.engine import reboot_escalation

    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    eng = _engine(snap)
    for i in range(5):
        _boot(snap, f"boot-{i}", xid=True)
        verdict, _ = _cycle(eng)
    (seen,) = eng.state.history.values()
    assert len(seen.boots) == 3  # escalateAfterReboots + 1, the newest
    assert verdict.severity is Severity.ISOLATE

    node = NodeObject("n", {}, 8, 8, annotations={"gpu-healthcheck/clear-latched": "all"})
    eng.node_getter = lambda: node
    verdict, _ = eng.evaluate()
    assert eng.state.history == {} and verdict.status is Status.PASS

    off = _engine(snap, escalateAfterReboots=0)
    for i in range(4):
        _boot(snap, f"again-{i}", xid=True)
        verdict, _ = _cycle(off)
    assert verdict.severity is Severity.RESET  # off: never escalates (the history is still kept)

    many = {}
    finding = Finding("x", "x.r", Severity.RESET, "m", key="k")
    for i in range(reboot_escalation.MAX_ENTRIES + 10):
        res = [CheckResult("x", (Finding("x", f"x.r{i}", Severity.RESET, "m", key=f"k{i}"),))]
        many = reboot_escalation.record(many, res, f"b{i}", None, 3)
    assert len(many) == reboot_escalation.MAX_ENTRIES and ("x.r0", "k0") not in many
    no_boot = reboot_escalation.record({}, [CheckResult("x", (finding,))], None, None, 3)
    assert no_boot == {}  # no boot id: nothing
