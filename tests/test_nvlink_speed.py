"""nvlink-speed on real `nvidia-smi nvlink -s` recordings (H100, A100, A10) and speed faults derived
from them (named in each test)."""

from __future__ import annotations

from pathlib import Path

from agent.checks.nvlink_speed import check_nvlink_speed
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.severity import Severity, Status
from agent.probes.nvlink import parse_nvlink
from tests.conftest import cfg

ROOT = Path(__file__).parent.parent
NVL = Path(__file__).parent / "fixtures" / "nvlink"
H100 = (NVL / "nvidia-smi-nvlink-s_h100_driver590.txt").read_text(encoding="utf-8")
A100 = (NVL / "awsome-p4de-a100-gpu0-nvlink-s.txt").read_text(encoding="utf-8")


CFG = cfg()


def run(text: str, itype: str | None) -> CheckResult:
    profile = CFG.profiles[itype] if itype else None
    return check_nvlink_speed(NodeFacts(instance_type=itype, profile=profile, nvlink=parse_nvlink(text)), CFG)


def test_real_h100_and_a100_links_run_at_their_generation_speed() -> None:
    h100 = run(H100, "p5.48xlarge")
    assert h100.status == Status.PASS, h100.message
    assert h100.note == "18 active link(s) at 26.562 GB/s (p5.48xlarge's speed)"
    assert run(A100, "p4de.24xlarge").status == Status.PASS
    assert run(H100, None).note == "18 active link(s) at 26.562 GB/s (the fastest link's speed)"


def test_an_h100_link_at_half_speed_is_reported_with_and_without_a_profile() -> None:
    # DERIVED: links 3 and 7 of the real H100 output trained at half speed.
    text = H100.replace("Link 3: 26.562 GB/s", "Link 3: 13.281 GB/s").replace(
        "Link 7: 26.562 GB/s", "Link 7: 13.281 GB/s"
    )
    assert text != H100
    for itype, source in (("p5.48xlarge", "p5.48xlarge's"), (None, "the fastest link's")):
        (f,) = run(text, itype).findings
        assert f.rule == "nvlink-speed.slow" and f.severity == Severity.RESET
        assert f.message == f"GPU 0: NVLink(s) 3, 7 at 13.281 GB/s or less, {source} speed is 26.562 GB/s"


def test_a100_links_on_an_h100_profile_are_slow() -> None:
    # The real A100 output judged against an H100 profile: every link is below 26.562 GB/s.
    (f,) = run(A100, "p5.48xlarge").findings
    assert f.message.startswith("GPU 0: NVLink(s) 0, 1, 2") and "at 25 GB/s or less" in f.message


def test_inactive_links_and_no_nvlink_are_not_this_checks() -> None:
    inactive = (NVL / "nvidia-smi-nvlink-s_h100_driver590-DERIVED-link5-inactive.txt").read_text(
        encoding="utf-8"
    )
    assert run(inactive, "p5.48xlarge").status == Status.PASS
    empty = (NVL / "gpud-a10-nvlink-status-empty.txt").read_text(encoding="utf-8")
    assert run(empty, "g5.xlarge").status == Status.SKIPPED


def test_profile_speed_must_be_a_positive_number() -> None:
    import pytest

    from agent.config.profiles import parse_profiles

    for bad in (True, 0, -1, "fast"):
        with pytest.raises(ValueError, match="nvlinkLinkGBps"):
            parse_profiles({"profiles": {"x": {"gpuCount": 1, "nvlinkLinkGBps": bad}}})
    assert (
        parse_profiles({"profiles": {"x": {"gpuCount": 1, "nvlinkLinkGBps": 25}}})["x"].nvlink_link_gbps == 25
    )
