"""check_topology on real topo -m captures and on faults derived from the real 8x H100 file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checks.topology import check_topology
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.profile import InstanceProfile
from agent.core.severity import Severity, Status
from agent.probes.topo import parse_topo
from tests.conftest import cfg

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-topo"
FULL = "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full.txt"


CFG = cfg()


def run(name: str, itype: str | None, cfg: Config = CFG) -> CheckResult:
    topo = parse_topo((FIX / name).read_text(encoding="utf-8"))
    profile = cfg.profiles[itype] if itype else None
    return check_topology(NodeFacts(instance_type=itype, profile=profile, topo=topo), cfg)


def rules(result: CheckResult) -> list[str]:
    return [f.rule for f in result.findings]


@pytest.mark.parametrize("itype", ["p5.48xlarge", "dgx-h100", "dgx-h200", "a3-highgpu-8g"])
def test_healthy_8xh100_passes(itype: str) -> None:
    result = run(FULL, itype)
    assert result.status == Status.PASS, result.message
    assert result.findings == ()
    assert "8 GPU(s), 8 NIC(s)" in result.note


def test_partial_tabs_file_is_unknown_and_its_rows_are_judged() -> None:
    """The poster left out the NIC6-8 rows: unknown, while the rows shown are judged (no fault)."""
    from agent.probes.reading import parse_with

    text = (FIX / "issue-nccl-1453-h100x8-9nic-topo-m-tabs-PARTIAL.txt").read_text(encoding="utf-8")
    topo = parse_with("nvidia-smi topo -m", text, parse_topo)
    facts = NodeFacts(instance_type="p5.48xlarge", profile=CFG.profiles["p5.48xlarge"], topo=topo)
    result = check_topology(facts, CFG)
    assert result.status == Status.UNKNOWN and not result.findings
    assert "NIC6, NIC7, NIC8" in result.message


def test_damaged_matrix_still_reports_an_x_off_diagonal_in_an_intact_row() -> None:
    from agent.probes.reading import parse_with

    text = (FIX / "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full-DERIVED-x-off-diagonal.txt").read_text()
    cut = "".join(text.splitlines(keepends=True)[:6])  # header and rows GPU0-GPU4
    topo = parse_with("nvidia-smi topo -m", cut, parse_topo)
    facts = NodeFacts(instance_type="p5.48xlarge", profile=CFG.profiles["p5.48xlarge"], topo=topo)
    result = check_topology(facts, CFG)
    assert result.status == Status.FAIL and result.unknown is not None
    assert rules(result) == ["topology.x-off-diagonal"]


@pytest.mark.parametrize(
    ("name", "itype"),
    [
        ("nvgpuexp-h100-80gb-hbm3-590.48.01-topo-m.txt", "one-gpu-test"),
        ("nvgpuexp-h200-590.48.01-topo-m.txt", "one-gpu-test"),
        ("nvgpuexp-l40s-595.80-topo-m.txt", "g6e.xlarge"),
        ("nvidia-smi-topo-m_h100-1gpu_driver590.txt", "one-gpu-test"),
    ],
)
def test_single_gpu_passes_with_one_gpu_profile(name: str, itype: str) -> None:
    cfg = CFG
    if itype not in cfg.profiles:
        cfg = Config(
            raw=CFG.raw, profiles={**CFG.profiles, itype: InstanceProfile(instance_type=itype, gpu_count=1)}
        )
    result = run(name, itype, cfg)
    assert result.status == Status.PASS, result.message


def test_no_profile_only_x_rule_and_says_so() -> None:
    result = run(FULL.replace(".txt", "-DERIVED-gpu3-gpu6-phb.txt"), None)
    assert result.status == Status.PASS  # PHB pair not judged without a profile
    assert "instance type unknown: count and NVLink rules skipped" in result.note


def test_no_profile_still_catches_x_off_diagonal() -> None:
    result = run(FULL.replace(".txt", "-DERIVED-x-off-diagonal.txt"), None)
    assert rules(result) == ["topology.x-off-diagonal"]


def test_x_off_diagonal_fails() -> None:
    result = run(FULL.replace(".txt", "-DERIVED-x-off-diagonal.txt"), "p5.48xlarge")
    assert result.status == Status.FAIL
    assert rules(result) == ["topology.x-off-diagonal"]  # GPU5→GPU2 still NV18: no not-NV finding
    (f,) = result.findings
    assert f.severity == Severity.ISOLATE
    assert "GPU2" in f.message and "GPU5" in f.message
    assert f.entities == ("GPU2", "GPU5")


def test_phb_pair_not_nv_connected() -> None:
    result = run(FULL.replace(".txt", "-DERIVED-gpu3-gpu6-phb.txt"), "p5.48xlarge")
    assert result.status == Status.FAIL
    (f,) = result.findings  # the pair is reported once
    assert f.rule == "topology.not-nv-connected" and f.severity == Severity.ISOLATE
    assert "GPU3" in f.message and "GPU6" in f.message and "PHB" in f.message


def test_gpu_count_mismatch() -> None:
    result = run(FULL, "p4d.24xlarge")
    assert result.status == Status.PASS  # 8 GPUs, NV-connected, no affinity expected for p4d
    result = run("nvgpuexp-h100-80gb-hbm3-590.48.01-topo-m.txt", "p5.48xlarge")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "topology.gpu-count" and f.severity == Severity.ISOLATE
    assert "1 GPU(s)" in f.message and "p5.48xlarge has 8" in f.message


def test_nic_affinity_worse_than_profile() -> None:
    result = run(FULL.replace(".txt", "-DERIVED-gpu0-nic0-sys.txt"), "dgx-h100")
    assert result.status == Status.WARN
    (f,) = result.findings
    assert f.rule == "topology.nic-affinity" and f.severity == Severity.MONITOR
    assert f.message.startswith("GPU0:") and "NODE" in f.message and "PXB" in f.message


def test_nic_affinity_skipped_without_nic_columns() -> None:
    cfg = Config(
        raw=CFG.raw,
        profiles={"x": InstanceProfile(instance_type="x", gpu_count=1, nic_affinity="PIX")},
    )
    result = run("nvgpuexp-h200-590.48.01-topo-m.txt", "x", cfg)
    assert result.status == Status.PASS and "NIC affinity not judged" in result.note


def test_severity_comes_from_config() -> None:
    resetting = cfg({"severities": {"topology.not-nv-connected": "reset"}})
    result = run(FULL.replace(".txt", "-DERIVED-gpu3-gpu6-phb.txt"), "p5.48xlarge", resetting)
    assert [f.severity for f in result.findings] == [Severity.RESET]


def test_input_gaps() -> None:
    prof = CFG.profiles["p5.48xlarge"]
    skipped = check_topology(NodeFacts(profile=prof), CFG)
    assert skipped.status == Status.SKIPPED
    err = ProbeError("nvidia-smi topo -m", ProbeErrorKind.UNREADABLE, "garbage")
    unknown = check_topology(NodeFacts(profile=prof, topo=err), CFG)
    assert unknown.status == Status.UNKNOWN and "garbage" in unknown.message
    assert isinstance(NodeFacts().topo, NotCaptured)


def test_a_pair_keeps_its_key_whichever_row_was_read() -> None:
    """GPU3's row garbled: the GPU3-GPU6 pair is read from GPU6's row and keeps its key."""
    from agent.probes.reading import parse_with

    text = (FIX / "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full-DERIVED-gpu3-gpu6-phb.txt").read_text()
    whole = run("issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full-DERIVED-gpu3-gpu6-phb.txt", "p5.48xlarge")
    damaged = text.replace("\nGPU3", "\nGPU\x003", 1)
    facts = NodeFacts(
        instance_type="p5.48xlarge",
        profile=CFG.profiles["p5.48xlarge"],
        topo=parse_with("nvidia-smi topo -m", damaged, parse_topo),
    )
    part = check_topology(facts, CFG)
    assert (
        [f.key for f in part.findings]
        == [f.key for f in whole.findings]
        == ["topology.not-nv-connected/GPU3-GPU6"]
    )
    assert part.unknown is not None
