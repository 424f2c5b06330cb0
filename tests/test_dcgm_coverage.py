"""The DCGM engine's coverage against the GPUs NVML sees (checks/dcgm_coverage.py): an engine that
watches fewer GPUs than the node has (0 of 8 when its container has no GPUs, EKS node monitoring
agent #241) makes dcgm-health `unknown` with the count, never `pass`; an incident it reports on a GPU
it watches is still reported; a diag that tested fewer GPUs is no pass of the others.

Through the agent's engine: the gpu tier on the fake libnvidia-ml playing the real 8x H100 recording
(gpud-h100x8-535.183.01, healthy), the dcgm-health tier on the fake libdcgm (C ABI) whose engine
has 0, 7 or 8 of those GPUs, naming each one's PCI address (dcgmGetDeviceAttributes) or not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.checks.dcgm import check_dcgm_diag, check_dcgm_health
from agent.core.dcgm_report import HealthReport, WatchedGpu
from agent.core.facts import NodeFacts
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.probes.dcgm.health import HealthPoller
from agent.probes.dcgm.tiers import DcgmTiers
from agent.probes.live import LiveSource
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.reporters.metrics import Metrics
from tests.conftest import cfg, live_cfg
from tests.fakes.nvml.fake_nvml import from_recordings

FIX = Path(__file__).parent / "fixtures"
H100X8 = FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"
PASS_DOC = FIX / "dcgm" / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"
INV = parse_nvsmi_text(H100X8.read_text(encoding="utf-8"))
PCI = {g.index: g.pci_bus_id for g in INV.gpus}
CFG = cfg({"checks": {"dcgm-diag": False}})
MEM, PCIE, FAIL, WARN = 0x10, 0x1, 20, 10


def engine_on(fake_nvml: Any, tmp_path: Path, metrics: Metrics | None = None) -> Engine:
    fake_nvml.write(from_recordings(H100X8))
    tiers = DcgmTiers(CFG, lambda: [])
    engine = Engine(
        LiveSource(live_cfg(timeout_s=5), sys_root=tmp_path),
        CFG,
        metrics=metrics,
        extra_inputs=tiers.inputs(),
    )
    engine.run_tier("gpu")
    return engine


def health(engine: Engine) -> Any:
    engine.run_tier("dcgm-health")
    return engine.results["dcgm-health"]


def test_all_eight_gpus_watched_passes(fake_dcgm: Any, fake_nvml: Any, tmp_path: Path) -> None:
    fake_dcgm.set_gpus(list(range(8)))
    fake_dcgm.set_gpu_pci(PCI)
    res = health(engine_on(fake_nvml, tmp_path))
    assert res.status is Status.PASS, res.message
    assert res.message == "DCGM health watches on 8 GPU(s) report no incident"


def test_an_engine_that_sees_no_gpu_is_unknown_never_pass(
    fake_dcgm: Any, fake_nvml: Any, tmp_path: Path
) -> None:
    """The engine's container has no GPU: DCGM reports no incident on no GPU. Not a pass, no mark."""
    fake_dcgm.set_gpus([])
    engine = engine_on(fake_nvml, tmp_path)
    res = health(engine)
    assert res.status is Status.UNKNOWN
    assert res.message == (
        "the DCGM engine watches 0 of the 8 GPUs NVML sees: its health checks say nothing of them"
    )
    verdict, marks = engine.evaluate()
    assert verdict.status is Status.UNKNOWN and not marks.taint


def test_seven_of_eight_named_by_pci_names_the_missing_gpu(
    fake_dcgm: Any, fake_nvml: Any, tmp_path: Path
) -> None:
    """An engine that sees a subset numbers it from 0: its GPU id 6 is NVML's GPU 7 here. The PCI
    addresses it gives say which GPU it misses (NVML's GPU 3), not its ids."""
    fake_dcgm.set_gpus(list(range(7)))
    fake_dcgm.set_gpu_pci({i: PCI[n] for i, n in enumerate([0, 1, 2, 4, 5, 6, 7])})
    res = health(engine_on(fake_nvml, tmp_path))
    assert res.status is Status.UNKNOWN
    gpu3 = next(g for g in INV.gpus if g.index == 3)
    assert res.message.startswith(
        f"the DCGM engine watches 7 of the 8 GPUs NVML sees (not watched: {gpu3.label})"
    )


def test_seven_of_eight_unnamed_says_the_count_and_that_which_is_unknown(
    fake_dcgm: Any, fake_nvml: Any, tmp_path: Path
) -> None:
    fake_dcgm.set_gpus(list(range(7)))  # no PCI address set: the engine names none
    res = health(engine_on(fake_nvml, tmp_path))
    assert res.status is Status.UNKNOWN
    assert res.message.startswith("the DCGM engine watches 7 of the 8 GPUs NVML sees (which are missing")
    assert "DCGM GPU ids 0, 1, 2, 3, 4, 5, 6" in res.message


def test_an_incident_on_a_watched_gpu_is_still_reported(
    fake_dcgm: Any, fake_nvml: Any, tmp_path: Path
) -> None:
    """A plain fault is evidence even when the engine misses another GPU: fail (and a mark) beats unknown."""
    fake_dcgm.set_gpus(list(range(7)))
    fake_dcgm.set_gpu_pci({i: PCI[i] for i in range(7)})
    fake_dcgm.add_incident(MEM, FAIL, 4, "Detected 2 volatile DBEs in GPU 2.", id=2)
    engine = engine_on(fake_nvml, tmp_path)
    res = health(engine)
    assert res.status is Status.FAIL and res.severity is Severity.RESET
    assert [f.entities for f in res.findings] == [("GPU 2",)]
    assert "GPU 7" in (res.unknown or "")  # the gap is still said
    verdict, marks = engine.evaluate()
    assert verdict.status is Status.FAIL and marks.taint


def test_a_warning_on_a_watched_gpu_is_shown_beside_the_unknown(
    fake_dcgm: Any, fake_nvml: Any, tmp_path: Path
) -> None:
    fake_dcgm.set_gpus(list(range(7)))
    fake_dcgm.add_incident(PCIE, WARN, 3, "Detected more than 8 PCIe replays per minute", id=1)
    res = health(engine_on(fake_nvml, tmp_path))
    assert res.status is Status.UNKNOWN and res.severity is Severity.MONITOR
    assert res.message.startswith("the DCGM engine watches 7 of the 8") and "PCIe replays" in res.message


def test_the_poller_records_what_it_watches_and_counts_when_the_engine_names_none(fake_dcgm: Any) -> None:
    from agent.probes.dcgm.client import DcgmClient

    fake_dcgm.set_gpus([0, 1])
    fake_dcgm.set_gpu_pci({0: PCI[0], 1: PCI[1]})
    report = HealthPoller(DcgmClient(CFG.dcgm.address, 2.0)).poll()
    assert isinstance(report, HealthReport)
    assert report.gpus_watched == (WatchedGpu(0, PCI[0]), WatchedGpu(1, PCI[1]))

    fake_dcgm.reset()
    fake_dcgm.set_gpus([0, 1])
    fake_dcgm.fail("dcgmGetDeviceAttributes", -3)  # an engine that cannot say: counted, not named
    report = HealthPoller(DcgmClient(CFG.dcgm.address, 2.0)).poll()
    assert isinstance(report, HealthReport) and report.gpus_watched == (WatchedGpu(0), WatchedGpu(1))


def test_without_an_inventory_the_profile_counts_and_an_old_report_is_not_judged() -> None:
    p5 = CFG.profiles["p5.48xlarge"]
    unread = ProbeError("nvml", ProbeErrorKind.TIMEOUT, "no answer")
    seven = HealthReport(gpus_watched=tuple(WatchedGpu(i) for i in range(7)))
    res = check_dcgm_health(NodeFacts(gpus=unread, profile=p5, dcgm_health=seven), CFG)
    assert res.status is Status.UNKNOWN and "watches 7 of the 8 GPUs a p5.48xlarge has" in res.message
    res = check_dcgm_health(NodeFacts(gpus=unread, dcgm_health=HealthReport(gpus_watched=())), CFG)
    assert res.status is Status.UNKNOWN and res.message == "the DCGM engine watches no GPU"
    res = check_dcgm_health(NodeFacts(gpus=INV, dcgm_health=HealthReport()), CFG)  # gpus_watched: None
    assert res.status is Status.PASS


def test_a_diag_that_tested_fewer_gpus_is_no_pass_of_the_others() -> None:
    """The recorded passing 4.x diag covers GPUs 0-7: a pass against the 8 GPUs seen. The same run
    without GPU 7's results: unknown, with the count (DCGM ids, which need not be NVML's indices)."""
    report = parse_dcgm_diag_json(PASS_DOC.read_text(encoding="utf-8"))
    assert report.gpus() == tuple(str(i) for i in range(8))
    assert check_dcgm_diag(NodeFacts(gpus=INV, dcgm_diag=report), CFG).status is Status.PASS
    seven = replace(report, results=tuple(r for r in report.results if r.gpu != "7"))
    res = check_dcgm_diag(NodeFacts(gpus=INV, dcgm_diag=seven), CFG)
    assert res.status is Status.UNKNOWN
    assert res.message.startswith("the DCGM diag tested 7 of the 8 GPUs nvidia-smi sees (DCGM GPU ids 0, 1")
    assert check_dcgm_diag(NodeFacts(dcgm_diag=seven), CFG).status is Status.PASS  # nothing to compare


def test_the_gpus_each_source_sees_are_metrics(fake_dcgm: Any, fake_nvml: Any, tmp_path: Path) -> None:
    fake_dcgm.set_gpus([])
    metrics = Metrics()
    engine = engine_on(fake_nvml, tmp_path, metrics)
    health(engine)

    def seen(source: str) -> float | None:
        return metrics.registry.get_sample_value("gpu_healthcheck_gpus_seen", {"source": source})

    assert (seen("nvml"), seen("dcgm"), seen("nvidia-smi")) == (8.0, 0.0, None)
