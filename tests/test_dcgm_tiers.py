"""The agent's DCGM tiers through the engine, on our DCGM binding mirror over the fake libdcgm.so.4: a diag
runs in the background (the loop never waits for it), its result latches, and a GPU pod on the node
postpones it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes.dcgm.idle import IdleGate
from agent.probes.dcgm.tiers import DcgmTiers
from agent.probes.live import LiveSource
from agent.probes.pod_resources import gpu_pods
from agent.probes.snapshot import SnapshotSource
from tests.conftest import cfg, live_cfg

ROOT = Path(__file__).parent.parent
FAKE = Path(__file__).parent / "fakes" / "dcgm"
FAIL_DOC = (
    Path(__file__).parent / "fixtures" / "dcgm" / "dcgmi_diag_r4_json_v4-DERIVED-gpu3-fail-isolate.json"
)
CFG = cfg()


def tiers_with(pods: Any) -> DcgmTiers:
    tiers = DcgmTiers(CFG, pods)
    tiers.runner.idle = IdleGate(compute_processes=lambda: {}, pods_requesting_gpus=pods)
    return tiers


def engine_for(tiers: DcgmTiers, tmp_path: Path, engine: Any) -> Engine:
    """The agent's engine on the healthy p5 snapshot (8 GPUs), the fake DCGM engine watching all 8."""
    engine.set_gpus(list(range(8)))
    snap = tmp_path / "snap"
    shutil.copytree(ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy", snap, symlinks=True)
    return Engine(SnapshotSource(snap), CFG, extra_inputs=tiers.inputs(), progress=tiers.progress)


def test_a_failing_diag_runs_in_the_background_and_latches(fake_dcgm: Any, tmp_path: Path) -> None:
    fake_dcgm.load_diag(str(FAIL_DOC))
    fake_dcgm.hold_diag(True)
    tiers = tiers_with(lambda: [])
    eng = engine_for(tiers, tmp_path, fake_dcgm)
    eng.run_tier("dcgm-diag")  # starts the diag, does not wait for it
    assert eng.results["dcgm-diag"].status is Status.SKIPPED
    assert tiers._thread is not None and tiers._thread.is_alive()
    eng.run_tier("xid")  # the loop goes on while the diag runs
    _, marks = eng.evaluate()
    assert "DCGM diag level 2 running since" in marks.condition_message

    fake_dcgm.hold_diag(False)
    tiers._thread.join(30)
    eng.run_tier("dcgm-diag")
    verdict, marks = eng.evaluate()
    assert eng.results["dcgm-diag"].status is Status.FAIL
    assert verdict.severity is Severity.ISOLATE and marks.taint
    assert any(k.startswith("dcgm-diag/") for k in eng.latches)
    assert fake_dcgm.stat("diag_calls") >= 1 and fake_dcgm.stat("diag_flags") == 0x21  # heartbeat flag
    tiers._thread.join(30)  # the second tier run started the next diag: let it end inside this test


def test_a_gpu_pod_postpones_the_diag(fake_dcgm: Any, tmp_path: Path) -> None:
    tiers = tiers_with(lambda: ["team-a/train-0"])
    eng = engine_for(tiers, tmp_path, fake_dcgm)
    eng.run_tier("dcgm-diag")
    assert tiers._thread is not None
    tiers._thread.join(30)
    assert fake_dcgm.stat("diag_calls") == 0
    assert "team-a/train-0" in tiers.progress()


def test_without_the_kubelet_the_gpus_are_never_called_idle(tmp_path: Path) -> None:
    unknown = gpu_pods(str(tmp_path / "no-kubelet.sock"))
    with pytest.raises(RuntimeError):
        unknown()
    assert IdleGate(compute_processes=lambda: {}, pods_requesting_gpus=unknown).check().idle is False


def test_health_tier_reports_engine_incidents(fake_dcgm: Any, tmp_path: Path) -> None:
    tiers = tiers_with(lambda: [])
    eng = engine_for(tiers, tmp_path, fake_dcgm)
    eng.run_tier("dcgm-health")
    assert eng.results["dcgm-health"].status is Status.PASS


def test_an_injected_fault_reaches_the_verdict_through_the_tiers(fake_dcgm: Any, tmp_path: Path) -> None:
    """hostengine.inject main() → the engine's health watch → the agent's dcgm-health tier → verdict."""
    from hostengine import inject

    tiers = tiers_with(lambda: [])
    eng = engine_for(tiers, tmp_path, fake_dcgm)
    eng.run_tier("dcgm-health")
    assert eng.results["dcgm-health"].status is Status.PASS
    assert inject.main(["row-remap-failure", "--gpu", "1", "--yes", "--address", CFG.dcgm.address]) == 0
    eng.run_tier("dcgm-health")
    verdict, marks = eng.evaluate()
    assert eng.results["dcgm-health"].status is Status.FAIL
    assert verdict.severity is Severity.ISOLATE and marks.taint
    assert "row remap failure" in eng.results["dcgm-health"].message


def test_live_source_dcgm_diag_is_not_captured() -> None:
    assert LiveSource(live_cfg()).dcgm_diag().__class__.__name__ == "NotCaptured"
