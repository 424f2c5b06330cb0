"""dcgm-health.suspect: while the DCGM engine does not answer, the GPU whose reads outside DCGM (NVML,
nvidia-smi) show a correctable-ECC storm or a pending recovery action is named in a warning stating
both facts; never a mark, never a finding on the wedge alone, never one while the engine answers.

On the real 8x H100 recording (gpud-h100x8-535.183.01: no ECC error, no recovery action), and
through the agent's engine on the fake libnvidia-ml (that recording) and the fake libdcgm with its
health check blocked."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checks.dcgm_suspect import NAME, check_suspect
from agent.config.schema import ConfigError
from agent.core.dcgm_report import HealthReport
from agent.core.facts import NodeFacts
from agent.core.gpu import Gpu, GpuInventory
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.nvsmi_text import parse_nvsmi_text
from tests.conftest import cfg, live_cfg
from tests.fakes.nvml.fake_nvml import from_recordings

FIX = Path(__file__).parent / "fixtures"
H100X8 = FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"
CFG = cfg()
WEDGED = ProbeError("dcgm health", ProbeErrorKind.TIMEOUT, "engine not answering: dcgmHealthCheck past 10 s")
ANSWERS = HealthReport(overall=0, incidents=())


def healthy(at: float) -> GpuInventory:
    return replace(parse_nvsmi_text(H100X8.read_text(encoding="utf-8")), taken_at=at)


def with_gpu(inv: GpuInventory, index: int, **changes: Any) -> GpuInventory:
    def changed(g: Gpu) -> Gpu:
        if g.index != index:
            return g
        ecc = changes.pop("ecc", None)
        g = replace(g, **changes)
        return replace(g, ecc=replace(g.ecc, **ecc)) if ecc else g

    return replace(inv, gpus=tuple(changed(g) for g in inv.gpus))


def storm(before: GpuInventory, after: GpuInventory, per_s: float, index: int = 3) -> GpuInventory:
    """GPU `index`'s volatile DRAM correctable count grown by per_s a second between the reads."""
    assert before.taken_at is not None and after.taken_at is not None
    grown = int(per_s * (after.taken_at - before.taken_at))
    return with_gpu(after, index, ecc={"volatile_dram_correctable": grown})


def test_the_healthy_recording_with_the_engine_answering_passes() -> None:
    res = check_suspect(NodeFacts(dcgm_health=ANSWERS, gpus=healthy(100.0), gpus_previous=healthy(40.0)), CFG)
    assert res.status is Status.PASS and res.message == "the DCGM engine answers"


def test_a_wedge_alone_names_no_gpu() -> None:
    res = check_suspect(NodeFacts(dcgm_health=WEDGED, gpus=healthy(100.0), gpus_previous=healthy(40.0)), CFG)
    assert res.status is Status.PASS and not res.findings
    assert "no GPU points at a cause" in res.message and "at most 10/s" in res.message


def test_a_wedge_with_one_gpu_in_an_ecc_storm_warns_on_that_gpu_with_both_facts() -> None:
    before, now = healthy(40.0), healthy(100.0)
    res = check_suspect(
        NodeFacts(dcgm_health=WEDGED, gpus=storm(before, now, 17_700), gpus_previous=before), CFG
    )
    assert res.status is Status.WARN and len(res.findings) == 1
    f = res.findings[0]
    assert f.rule == "dcgm-health.suspect.gpu" and f.severity is Severity.MONITOR
    assert f.entities == (now.gpus[3].label,)
    assert f.key == f"dcgm-health.suspect.gpu/{now.gpus[3].pci_bus_id}"
    assert "engine not answering: dcgmHealthCheck past 10 s" in f.message  # the wedge
    assert (
        "its correctable ECC errors grow about 20,000 a second (over thresholds.dcgmWedgeEccPerSec, 10)"
        in f.message
    )
    assert f.rate == "17,700/s"  # the exact figure, and the counts, are evidence (not in the words)
    assert f.evidence[-1].text == "volatile correctable ECC errors 0 → 1,062,000 in 60.0 s: 17,700/s"


def test_the_words_stay_the_same_while_a_storm_goes_on_at_about_the_same_pace() -> None:
    """A new message is a Node write: one a cycle during a storm would be noise."""
    messages = set()
    for per_s in (17_000, 17_700, 18_900, 21_000):
        before, now = healthy(40.0), healthy(100.0)
        facts = NodeFacts(dcgm_health=WEDGED, gpus=storm(before, now, per_s), gpus_previous=before)
        messages.add(check_suspect(facts, CFG).findings[0].message)
    assert len(messages) == 1


def test_a_rate_at_or_below_the_threshold_or_a_live_change_of_it() -> None:
    before, now = healthy(40.0), healthy(100.0)
    facts = NodeFacts(dcgm_health=WEDGED, gpus=storm(before, now, 10), gpus_previous=before)
    assert not check_suspect(facts, CFG).findings  # 10/s is not over 10/s
    lower = cfg({"thresholds": {"dcgmWedgeEccPerSec": 5}})
    assert [f.entities for f in check_suspect(facts, lower).findings] == [(now.gpus[3].label,)]


def test_a_wedge_with_a_pending_recovery_action_names_that_gpu() -> None:
    now = with_gpu(healthy(100.0), 5, recovery_action="Reset")
    res = check_suspect(NodeFacts(dcgm_health=WEDGED, gpus=now), CFG)
    assert [f.entities for f in res.findings] == [(now.gpus[5].label,)]
    assert "the driver asks for a recovery action: Reset" in res.findings[0].message
    assert "engine not answering" in res.findings[0].message


def test_without_a_wedge_a_storm_names_nothing() -> None:
    before, now = healthy(40.0), healthy(100.0)
    for health in (
        ANSWERS,
        ProbeError("dcgm health", ProbeErrorKind.UNAVAILABLE, "refused"),
        NotCaptured("x"),
    ):
        res = check_suspect(
            NodeFacts(dcgm_health=health, gpus=storm(before, now, 17_700), gpus_previous=before), CFG
        )
        assert not res.findings and res.status in (Status.PASS, Status.SKIPPED)


def test_counters_that_went_down_or_a_replaced_board_are_no_rate() -> None:
    before = storm(healthy(0.0), healthy(40.0), 1000)
    now = healthy(100.0)  # back to 0: the driver reloaded
    assert not check_suspect(NodeFacts(dcgm_health=WEDGED, gpus=now, gpus_previous=before), CFG).findings
    other = with_gpu(storm(healthy(40.0), healthy(100.0), 17_700), 3, uuid="GPU-another-board")
    assert not check_suspect(
        NodeFacts(dcgm_health=WEDGED, gpus=other, gpus_previous=healthy(40.0)), CFG
    ).findings


def test_gpus_that_cannot_be_read_during_a_wedge_are_unknown() -> None:
    gpus = ProbeError("nvml", ProbeErrorKind.TIMEOUT, "NVML did not answer within 30 s")
    res = check_suspect(NodeFacts(dcgm_health=WEDGED, gpus=gpus), CFG)
    assert res.status is Status.UNKNOWN and "could not read nvml" in res.message


def test_it_can_never_be_made_to_mark() -> None:
    with pytest.raises(ConfigError, match="above what this rule may be"):
        cfg({"severities": {"dcgm-health.suspect.gpu": "reset"}})
    assert NAME == "dcgm-health.suspect"


def test_through_the_engine_nvml_storm_and_a_blocked_health_check(
    fake_dcgm: Any, fake_nvml: Any, tmp_path: Path
) -> None:
    """The gpu tier reads NVML twice (GPU 3's correctable count storming between), the engine's
    health check blocks: dcgm-health unknown, dcgm-health.suspect a warning on GPU 3, no taint."""
    from agent.engine.engine import Engine
    from agent.probes.dcgm.tiers import DcgmTiers
    from agent.probes.live import LiveSource

    machine = from_recordings(H100X8)
    fake_nvml.write(machine)
    fake_dcgm.set_gpus(list(range(8)))  # the engine watches the 8 GPUs NVML sees
    config = cfg({"dcgm": {"callTimeout": 0.3}, "checks": {"dcgm-diag": False}})
    tiers = DcgmTiers(config, lambda: [])
    engine = Engine(LiveSource(live_cfg(timeout_s=5), sys_root=tmp_path), config, extra_inputs=tiers.inputs())
    engine.run_tier("gpu")
    engine.run_tier("dcgm-health")
    assert engine.results["dcgm-health"].status is Status.PASS
    assert engine.results[NAME].message == "the DCGM engine answers"
    time.sleep(0.5)
    machine.gpus[3]["memerr.0.0.2"] = "50000"  # volatile DRAM correctable: 50,000 in ~0.5 s
    fake_nvml.write(machine, now=True)
    engine.run_tier("gpu")
    fake_dcgm.block("dcgmHealthCheck")
    engine.run_tier("dcgm-health")
    assert engine.results["dcgm-health"].status is Status.UNKNOWN
    suspect = engine.results[NAME]
    assert suspect.status is Status.WARN and len(suspect.findings) == 1
    assert suspect.findings[0].entities[0].startswith("GPU 3 ")
    assert "engine not answering: dcgmHealthCheck past 0.3 s" in suspect.message
    assert "correctable ECC errors grow" in suspect.message
    verdict, marks = engine.evaluate()
    assert not marks.taint and verdict.severity is Severity.MONITOR
    gpu3 = next(g for g in marks_gpus(marks) if g["index"] == 3)
    assert gpu3["findings"] == [suspect.findings[0].key]
    fake_dcgm.block("dcgmHealthCheck", False)


def marks_gpus(marks: Any) -> list[dict[str, Any]]:
    import json

    return list(json.loads(marks.results_json)["gpus"])
