"""dcgm-diag.peers: a GPU whose DCGM diag figures fall below its siblings' median by more than
peers.diagMarginPercent is a warning on it naming the figure, the value, the median and the margin.

On real `dcgmi diag -j` documents: the single-T4 run (too few GPUs: skipped), NVIDIA's own 4-GPU
per-GPU JSON (PCIe bandwidths within 0.1 %: no warning), the real DCGM 4.x fragment (GFLOPS on two
GPUs only: skipped), and on the T4 run widened to eight GPUs (make_peer_variants.py): healthy, and
with GPU 5's GFLOPS and stress level 22 % below."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.checks.dcgm_peers import BELOW, NAME, check_diag_peers, figures
from agent.config.schema import ConfigError
from agent.core.dcgm_report import DiagReport, DiagResult, DiagStatus
from agent.core.facts import NodeFacts
from agent.core.gpu import GpuInventory
from agent.core.severity import Severity, Status
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.probes.nvsmi_text import parse_nvsmi_text
from tests.conftest import cfg

FIX = Path(__file__).parent / "fixtures"
DCGM = FIX / "dcgm"
T4 = DCGM / "dcgmi_diag_v3_r3_pass_T4.json"
HEALTHY8 = DCGM / "dcgmi_diag_v3_r3_pass_T4-DERIVED-8gpu-healthy.json"
SLOW8 = DCGM / "dcgmi_diag_v3_r3_pass_T4-DERIVED-8gpu-gpu5-slow.json"
NVIDIA4 = DCGM / "dcgm-repo-testing-per-gpu-json-4gpu.json"
V4 = DCGM / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"
H100X8 = FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"
CFG = cfg()


def report(path: Path) -> DiagReport:
    return parse_dcgm_diag_json(path.read_text(encoding="utf-8"))


def facts(path: Path, gpus: GpuInventory | None = None) -> NodeFacts:
    return NodeFacts(dcgm_diag=report(path), **({"gpus": gpus} if gpus is not None else {}))


def h100x8() -> GpuInventory:
    return parse_nvsmi_text(H100X8.read_text(encoding="utf-8"))


def test_a_single_gpu_run_is_skipped_never_judged() -> None:
    r = check_diag_peers(facts(T4), CFG)
    assert r.status is Status.SKIPPED and not r.findings
    assert "3 or more GPUs" in (r.skipped or "")


def test_the_real_4x_fragment_with_two_gpus_giving_gflops_is_skipped() -> None:
    assert figures(report(V4)) == {("diagnostic", "GFLOPS", "GFLOPS"): {"0": 859.08, "1": 859.08}}
    assert check_diag_peers(facts(V4), CFG).status is Status.SKIPPED


def test_nvidias_own_4gpu_document_compares_pcie_and_warns_of_nothing() -> None:
    r = check_diag_peers(facts(NVIDIA4), CFG)
    assert r.status is Status.PASS and not r.findings
    assert r.note.startswith(
        "3 DCGM diag figure(s) compared"
    )  # the three PCIe bandwidths; sm_stress: one GPU


def test_a_healthy_8gpu_spread_gives_no_warning() -> None:
    r = check_diag_peers(facts(HEALTHY8, h100x8()), CFG)
    assert r.status is Status.PASS and not r.findings
    assert "6 DCGM diag figure(s)" in r.note


def test_the_slow_gpu_warns_naming_figure_value_median_and_margin() -> None:
    r = check_diag_peers(facts(SLOW8, h100x8()), CFG)
    assert r.status is Status.WARN
    (f,) = r.findings
    assert f.rule == BELOW.name and f.severity is Severity.MONITOR
    gpu5 = h100x8().gpus[5]
    assert f.entities == (gpu5.label,) and f.key == f"{BELOW.name}/{gpu5.pci_bus_id}"
    assert "Diagnostic GFLOPS 8790.26 GFLOPS, 20 % below the median of the 8 GPUs" in f.message
    assert "Targeted Stress relative stress level 2521, 20 % below" in f.message
    assert "margin peers.diagMarginPercent 10 %" in f.message
    assert "power" not in f.message and "bandwidth" not in f.message  # those are as its siblings'
    assert any("GPU 5 8790.26" in e.text for e in f.evidence)
    # the same report judged again: the same words (no write while the report stands)
    assert check_diag_peers(facts(SLOW8, h100x8()), CFG).findings[0].message == f.message


def test_a_wider_margin_lets_it_pass_and_never_more_than_a_warning() -> None:
    wide = cfg({"peers": {"diagMarginPercent": 25}})
    assert not check_diag_peers(facts(SLOW8, h100x8()), wide).findings
    with pytest.raises(ConfigError, match="above what this rule may be"):
        cfg({"severities": {BELOW.name: "isolate"}})


def test_without_the_inventory_the_dcgm_id_names_the_gpu() -> None:
    (f,) = check_diag_peers(facts(SLOW8), CFG).findings
    assert f.message.startswith("DCGM GPU 5: ") and f.key == f"{BELOW.name}/dcgm-gpu-5"


def test_a_run_on_a_subset_names_no_nvml_gpu_by_its_dcgm_id() -> None:
    """An engine that sees four of eight GPUs numbers them 0-3: id 2 need not be NVML's GPU 2."""
    rep = report(SLOW8)
    four = replace(rep, results=tuple(r for r in rep.results if r.gpu in ("2", "3", "4", "5")))
    (f,) = check_diag_peers(NodeFacts(dcgm_diag=four, gpus=h100x8()), CFG).findings
    assert f.message.startswith("DCGM GPU 5: ")


def test_a_failed_test_is_dcgm_diags_not_compared() -> None:
    rep = report(SLOW8)
    failed = replace(
        rep,
        results=tuple(
            replace(r, status=DiagStatus.FAIL) if r.gpu == "5" and r.test != "PCIe" else r
            for r in rep.results
        ),
    )
    assert not check_diag_peers(NodeFacts(dcgm_diag=failed), CFG).findings


def test_dcgm_4_6_power_wording_and_api_info_without_a_gpu_prefix() -> None:
    """DCGM 4.6 targeted_power says "GPU <n> max power: ... average power usage: ... W"; the API's
    per-entity info may carry no "GPU <n>" prefix (the result's entity names it)."""
    watts = {"0": 690.0, "1": 688.0, "2": 540.0, "3": 691.0}
    results = tuple(
        DiagResult(
            "targeted_power",
            gpu,
            DiagStatus.PASS,
            info=(f"GPU {gpu} max power: 700.0 W average power usage: {w:.1f} W",),
        )
        for gpu, w in watts.items()
    ) + tuple(
        DiagResult("pcie", gpu, DiagStatus.PASS, info=(f"GPU to Host bandwidth:\t\t{bw:.2f} GB/s",))
        for gpu, bw in {"0": 55.1, "1": 55.0, "2": 55.2, "3": 41.0}.items()
    )
    rep = DiagReport(results, source="DCGM API")
    found = {f.entities: f.message for f in check_diag_peers(NodeFacts(dcgm_diag=rep), CFG).findings}
    assert set(found) == {("GPU 2",), ("GPU 3",)}
    assert "targeted_power average power 540 W" in found[("GPU 2",)]
    assert "pcie GPU to Host bandwidth 41 GB/s" in found[("GPU 3",)]


def test_gpus_of_two_models_have_no_siblings() -> None:
    inv = h100x8()
    mixed = replace(inv, gpus=(replace(inv.gpus[0], name="NVIDIA H200"), *inv.gpus[1:]))
    assert check_diag_peers(facts(SLOW8, mixed), CFG).status is Status.SKIPPED


def test_behind_reads_over_the_window_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"peers\.behindReads"):
        cfg({"peers": {"behindReads": 6, "windowReads": 5}})


def test_not_captured_is_skipped() -> None:
    assert check_diag_peers(NodeFacts(), CFG).status is Status.SKIPPED
    assert NAME == "dcgm-diag.peers"
