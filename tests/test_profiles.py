"""The shipped config/instance-profiles.yaml parses and holds the instance types we promise."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import parse_config, yaml_safe
from agent.config.profiles import parse_profiles
from agent.core.profile import InstanceProfile

ROOT = Path(__file__).parent.parent
PROFILES = parse_profiles(
    yaml_safe.load((ROOT / "config" / "instance-profiles.yaml").read_text(encoding="utf-8"))
)

# type: (gpus, model, efa, nvlink, links per GPU)
EXPECTED: dict[str, tuple[int, str, int, bool, int | None]] = {
    "p4d.24xlarge": (8, "A100", 4, True, 12),
    "p4de.24xlarge": (8, "A100", 4, True, 12),
    "p5.48xlarge": (8, "H100", 32, True, 18),
    "p5e.48xlarge": (8, "H200", 32, True, 18),
    "p5en.48xlarge": (8, "H200", 16, True, 18),
    "p6-b200.48xlarge": (8, "B200", 8, True, 18),
    "g5.xlarge": (1, "A10G", 0, False, None),
    "g5.12xlarge": (4, "A10G", 0, False, None),
    "g5.24xlarge": (4, "A10G", 0, False, None),
    "g5.48xlarge": (8, "A10G", 1, False, None),
    "g6.xlarge": (1, "L4", 0, False, None),
    "g6.16xlarge": (1, "L4", 0, False, None),
    "g6.12xlarge": (4, "L4", 0, False, None),
    "g6.48xlarge": (8, "L4", 1, False, None),
    "g6e.xlarge": (1, "L40S", 0, False, None),
    "g6e.12xlarge": (4, "L40S", 0, False, None),
    "g6e.48xlarge": (8, "L40S", 0, False, None),
    "dgx-h100": (8, "H100", 0, True, 18),
    "dgx-h200": (8, "H200", 0, True, 18),
    "a3-highgpu-8g": (8, "H100", 0, True, 18),
    "a3-megagpu-8g": (8, "H100", 0, True, 18),
    "Standard_ND96isr_H100_v5": (8, "H100", 0, True, 18),
    "Standard_ND96asr_v4": (8, "A100", 0, True, 12),
}


@pytest.mark.parametrize("itype", sorted(EXPECTED))
def test_required_profile(itype: str) -> None:
    gpus, model, efa, nvlink, links = EXPECTED[itype]
    prof = PROFILES[itype]
    assert (prof.gpu_count, prof.gpu_model, prof.efa_count, prof.nvlink) == (gpus, model, efa, nvlink)
    assert prof.nvlink_links_per_gpu == links
    assert prof.nvswitch == nvlink  # every NVLink profile here is an NVSwitch board


def test_anchor_table_agrees() -> None:
    """anchors.md §9.1 (aws-samples instance-profiles.conf): GPU and EFA counts."""
    for itype, gpus, efa in [
        ("p4d.24xlarge", 8, 4),
        ("p4de.24xlarge", 8, 4),
        ("p5.48xlarge", 8, 32),
        ("p5e.48xlarge", 8, 32),
        ("p5en.48xlarge", 8, 16),
        ("p6-b200.48xlarge", 8, 8),
        ("g6.48xlarge", 8, 1),
        ("g6.xlarge", 1, 0),
    ]:
        assert (PROFILES[itype].gpu_count, PROFILES[itype].efa_count) == (gpus, efa), itype


def test_every_g_family_size_is_present() -> None:
    sizes = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")
    for family in ("g5", "g6", "g6e"):
        for size in sizes:
            prof = PROFILES[f"{family}.{size}"]
            assert not prof.nvlink and prof.nic_affinity is None


def test_nic_affinity_only_where_set_deliberately() -> None:
    with_affinity = {k for k, p in PROFILES.items() if p.nic_affinity is not None}
    assert with_affinity == {"p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "dgx-h100", "dgx-h200"}
    assert all(PROFILES[k].nic_affinity == "PXB" for k in with_affinity)


def test_unsure_type_left_out() -> None:
    assert "p5.4xlarge" not in PROFILES


def test_loads_through_parse_config() -> None:
    doc = yaml_safe.load((ROOT / "config" / "instance-profiles.yaml").read_text(encoding="utf-8"))
    cfg = parse_config({}, doc, None)
    assert cfg.profiles == PROFILES
    assert all(isinstance(p, InstanceProfile) and p.instance_type == k for k, p in cfg.profiles.items())
