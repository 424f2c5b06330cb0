"""check_nvlink on real `nvidia-smi nvlink -s` outputs and one derived inactive-link variant."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checks.nvlink import check_nvlink
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.nvlink import NvlinkReport
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.nvlink import parse_nvlink
from tests.conftest import cfg

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures"
NVL = FIX / "nvlink"
MIG_CAPTURE = FIX / "multi-command-captures" / "nvgpuexp-h100-mig-590.48.01-capture.txt"


CFG = cfg()


def report(name: str) -> NvlinkReport:
    return parse_nvlink((NVL / name).read_text(encoding="utf-8"))


def run(rep: NvlinkReport | ProbeError, itype: str | None, cfg: Config = CFG) -> CheckResult:
    profile = cfg.profiles[itype] if itype else None
    return check_nvlink(NodeFacts(instance_type=itype, profile=profile, nvlink=rep), cfg)


@pytest.mark.parametrize(
    ("name", "itype"),
    [
        ("awsome-p4de-a100-gpu0-nvlink-s.txt", "p4de.24xlarge"),
        ("aznhc-azure-a100-gpu7-nvlink-status-good.txt", "Standard_ND96asr_v4"),
        ("nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt", "p5.48xlarge"),
        ("nvgpuexp-h200-590.48.01-nvlink-s.txt", "p5e.48xlarge"),
        ("nvidia-smi-nvlink-s_h100_driver590.txt", "dgx-h100"),
    ],
)
def test_healthy_passes(name: str, itype: str) -> None:
    result = run(report(name), itype)
    assert result.status == Status.PASS, result.message
    assert "all NVLinks active" in result.note


def test_azure_gpu6_all_inactive_is_no_active() -> None:
    result = run(report("aznhc-azure-a100-gpu6-nvlink-all-inactive.txt"), "Standard_ND96asr_v4")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "nvlink.no-active" and f.severity == Severity.ISOLATE
    assert "GPU 6" in f.message and "all links inactive" in f.message
    assert "GPU-9667d95e-6d22-0c22-1f57-c481f13e7c44" in f.entities


def test_one_inactive_link_is_some_inactive() -> None:
    result = run(report("nvidia-smi-nvlink-s_h100_driver590-DERIVED-link5-inactive.txt"), "p5.48xlarge")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "nvlink.some-inactive" and f.severity == Severity.RESET
    assert f.message.startswith("GPU 0:") and "17 NVLink(s) active, 18 expected" in f.message
    assert "inactive: 5" in f.message


def test_fewer_links_than_profile_is_unknown_not_a_fault() -> None:
    """An A100 (12 links) judged against an H100 profile (18): nvidia-smi lists every link of a GPU,
    inactive ones as <inactive>, so a GPU listing fewer links than the profile was cut short (or is
    another GPU, which gpu.count reports); no link is shown inactive."""
    result = run(report("awsome-p4de-a100-gpu0-nvlink-s.txt"), "p5.48xlarge")
    assert result.status == Status.UNKNOWN and not result.findings
    assert "GPU 0 lists 12 of its 18 links" in result.message


def test_l40s_not_supported_while_expected() -> None:
    result = run(report("nvgpuexp-l40s-595.80-nvlink-s.txt"), "p5.48xlarge")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "nvlink.no-active" and f.severity == Severity.ISOLATE
    assert f.message == "NVLink expected by profile but nvidia-smi reports no NVLink support"


@pytest.mark.parametrize(
    ("name", "itype"),
    [("nvgpuexp-l40s-595.80-nvlink-s.txt", "g6e.xlarge"), ("gpud-a10-nvlink-status-empty.txt", "g5.xlarge")],
)
def test_not_expected_is_skipped(name: str, itype: str) -> None:
    result = run(report(name), itype)
    assert result.status == Status.SKIPPED
    assert result.message == f"no NVLink expected for {itype}"


def test_no_profile_judges_what_the_listing_states() -> None:
    result = run(report("nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt"), None)
    assert result.status == Status.PASS
    inactive = run(report("nvidia-smi-nvlink-s_h100_driver590-DERIVED-link5-inactive.txt"), None)
    assert [f.rule for f in inactive.findings] == ["nvlink.some-inactive"]
    # One GPU with all links inactive and nothing else: without a profile, no sign the node has NVLink.
    alone = run(report("aznhc-azure-a100-gpu6-nvlink-all-inactive.txt"), None)
    assert alone.status == Status.PASS
    empty = run(report("gpud-a10-nvlink-status-empty.txt"), None)
    assert empty.status == Status.SKIPPED and "instance type unknown" in empty.message


def test_no_profile_a_gpu_without_active_links_beside_gpus_with_them_fails() -> None:
    good = (NVL / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt").read_text(encoding="utf-8")
    text = (
        good
        + "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
        + "NVML: Unable to retrieve NVLink information as all links are inactive\n"
    )
    result = run(parse_nvlink(text), None)
    assert [f.rule for f in result.findings] == ["nvlink.no-active"]


def test_mig_mode_is_skipped_not_failed() -> None:
    """Real MIG capture: NVLink cannot be queried in MIG mode; that is no link fault."""
    text = MIG_CAPTURE.read_text(encoding="utf-8")
    section = text.split("# $ nvidia-smi nvlink -s\n", 1)[1].split("#" * 80 + "\n", 2)[1]
    assert "not supported for Devices in MIG mode" in section
    result = run(parse_nvlink(section), "p5.48xlarge")
    assert result.status == Status.SKIPPED and "MIG" in result.message


def test_severity_comes_from_config() -> None:
    rebooting = cfg({"severities": {"nvlink.no-active": "reboot"}})
    result = run(report("aznhc-azure-a100-gpu6-nvlink-all-inactive.txt"), "Standard_ND96asr_v4", rebooting)
    assert [f.severity for f in result.findings] == [Severity.REBOOT]


def test_unreadable_is_unknown() -> None:
    err = ProbeError("nvidia-smi nvlink -s", ProbeErrorKind.TIMEOUT, "killed after 30 s")
    result = run(err, "p5.48xlarge")
    assert result.status == Status.UNKNOWN and "killed after 30 s" in result.message
    assert check_nvlink(NodeFacts(profile=CFG.profiles["p5.48xlarge"]), CFG).status == Status.SKIPPED
