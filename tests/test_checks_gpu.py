"""GPU checks on real nvidia-smi recordings (healthy and faulty) and derived single-fault variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checks import gpu, gpu_allocatable, gpu_memory
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.gpu import ClockEvents, EccErrors, Fabric, GpuInventory
from agent.core.node import NodeObject
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.nvsmi_text import parse_nvsmi_text
from tests.conftest import cfg

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-q"
H100 = "gpud-h100x8-535.183.01.txt"
CFG = cfg()


def facts(name: str, itype: str | None = "p5.48xlarge", **kw: object) -> NodeFacts:
    inv = parse_nvsmi_text((FIX / name).read_text())
    return NodeFacts(instance_type=itype, profile=CFG.profiles.get(itype or ""), gpus=inv, **kw)  # type: ignore[arg-type]


def only_finding(result: CheckResult, rule: str, severity: Severity, entity: str = "") -> None:
    """The result holds exactly one finding: *rule* at *severity* (naming *entity* when given)."""
    rules = [f.rule for f in result.findings]
    assert rules == [rule], (result.status, result.message, rules)
    f = result.findings[0]
    assert f.severity == severity
    if entity:
        assert entity in f.message and any(entity in e for e in f.entities)


# --------------------------------------------------------------------------- gpu.count


def test_count_passes_on_a_real_8xh100_node() -> None:
    r = gpu.check_count(facts(H100), CFG)
    assert r.status is Status.PASS and "8 GPU(s)" in r.message


def test_count_fails_on_a_real_4_gpu_a100_node_typed_as_p4d() -> None:
    r = gpu.check_count(
        facts("thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending.txt", "p4d.24xlarge"), CFG
    )
    assert r.status is Status.FAIL and r.severity is Severity.ISOLATE
    assert "4 GPU(s) visible, p4d.24xlarge has 8" in r.message


def test_count_flags_the_wrong_gpu_model() -> None:
    r = gpu.check_count(facts("gpud-rtx4090x8-535.154.05.txt"), CFG)
    # one finding per GPU, each of them an RTX 4090
    assert [(f.rule, f.severity) for f in r.findings] == [("gpu.count.model", Severity.MONITOR)] * 8
    assert "expected H100" in r.message


def test_count_is_skipped_for_an_unknown_instance_type() -> None:
    r = gpu.check_count(facts(H100, "x9.unknown"), CFG)
    assert r.status is Status.SKIPPED and "no profile" in r.message


# --------------------------------------------------------------------------- gpu.responsive


def test_responsive_passes_on_a_real_node() -> None:
    assert gpu.check_responsive(facts(H100), CFG).status is Status.PASS


def test_responsive_fails_for_a_lost_gpu() -> None:
    demo = Path(__file__).parent.parent / "examples" / "snapshots" / "p5.48xlarge-xid79" / "nvidia-smi-q.txt"
    inv = parse_nvsmi_text(demo.read_text())
    r = gpu.check_responsive(NodeFacts(gpus=inv), CFG)
    only_finding(r, "gpu.responsive.lost", Severity.REBOOT, "0000:97:00.0")


@pytest.mark.parametrize(
    ("kind", "status", "rule"),
    [
        (ProbeErrorKind.TIMEOUT, Status.FAIL, "gpu.responsive.timeout"),
        (ProbeErrorKind.TOOL_FAILED, Status.FAIL, "gpu.responsive.driver"),
        (ProbeErrorKind.UNREADABLE, Status.UNKNOWN, None),
        (ProbeErrorKind.UNAVAILABLE, Status.UNKNOWN, None),
    ],
)
def test_responsive_tells_a_hung_tool_from_a_garbled_file(
    kind: ProbeErrorKind, status: Status, rule: str
) -> None:
    r = gpu.check_responsive(NodeFacts(gpus=ProbeError("nvidia-smi -q -x", kind, "boom")), CFG)
    assert r.status is status
    assert [f.rule for f in r.findings] == ([rule] if rule else [])


def test_every_gpu_check_is_skipped_when_nothing_was_captured() -> None:
    for fn in (
        gpu.check_count,
        gpu_memory.check_ecc,
        gpu_memory.check_row_remap,
        gpu.check_throttle,
        gpu_allocatable.check_allocatable,
    ):
        assert fn(NodeFacts(gpus=NotCaptured("nvidia-smi")), CFG).status is Status.SKIPPED


# --------------------------------------------------------------------------- memory


def test_ecc_passes_on_a_real_node() -> None:
    assert gpu_memory.check_ecc(facts(H100), CFG).status is Status.PASS


def test_ecc_volatile_dram_uncorrectable_needs_a_reset() -> None:
    r = gpu_memory.check_ecc(facts("DERIVED-h100x8-ecc-dram-uncorrectable.txt"), CFG)
    only_finding(r, "gpu.ecc.dram-uncorrectable", Severity.RESET, "0000:75:00.0")
    assert r.status is Status.FAIL and len(r.findings) == 1


def test_ecc_sram_uncorrectable_isolates() -> None:
    r = gpu_memory.check_ecc(facts("DERIVED-h100x8-ecc-sram-uncorrectable.txt"), CFG)
    only_finding(r, "gpu.ecc.sram-uncorrectable", Severity.ISOLATE, "0000:75:00.0")


def test_row_remap_passes_on_a_real_node() -> None:
    assert gpu_memory.check_row_remap(facts(H100), CFG).status is Status.PASS


def test_row_remap_pending_on_a_real_a100_needs_a_reset() -> None:
    r = gpu_memory.check_row_remap(
        facts("thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending.txt"), CFG
    )
    only_finding(r, "gpu.row-remap.pending", Severity.RESET)
    assert len(r.findings) == 1 and r.status is Status.FAIL


def test_row_remap_failure_isolates() -> None:
    r = gpu_memory.check_row_remap(facts("DERIVED-h100x8-row-remap-failure.txt"), CFG)
    only_finding(r, "gpu.row-remap.failure", Severity.ISOLATE, "0000:75:00.0")


def test_retired_pages_clean_on_a_real_azure_node() -> None:
    r = gpu_memory.check_retired_pages(
        facts("aznhc-azure-8gpu-535.86.10-page-retirement-clean.txt", None), CFG
    )
    assert r.status is Status.PASS


def test_retired_pages_real_bad_recording() -> None:
    r = gpu_memory.check_retired_pages(
        facts("aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt", None), CFG
    )
    assert r.status is Status.FAIL and r.severity is Severity.ISOLATE
    rules = {f.rule for f in r.findings}
    assert {"gpu.retired-pages.double-bit", "gpu.retired-pages.pending"} <= rules
    # 60 single-bit pages is at, not above, the threshold of 60.
    assert not any(f.rule == "gpu.retired-pages.single-bit" and "60 single" in f.message for f in r.findings)


def test_retired_pages_single_bit_threshold_is_configurable() -> None:
    low = cfg({"thresholds": {"retiredPagesSingleBitMax": 10}})
    r = gpu_memory.check_retired_pages(
        facts("aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt", None), low
    )
    assert any(f.rule == "gpu.retired-pages.single-bit" and "60 single-bit" in f.message for f in r.findings)


def test_retired_pages_do_not_apply_to_ampere_and_later() -> None:
    assert gpu_memory.check_retired_pages(facts(H100), CFG).status is Status.SKIPPED


# --------------------------------------------------------------------------- recovery, clocks, link


def test_recovery_action_none_passes_on_a_real_590_driver() -> None:
    r = gpu.check_recovery_action(facts("nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt", None), CFG)
    assert r.status is Status.PASS


def test_recovery_action_reset() -> None:
    r = gpu.check_recovery_action(facts("DERIVED-h100-590-recovery-action-reset.txt", None), CFG)
    only_finding(r, "gpu.recovery-action.reset", Severity.RESET)


def test_throttle_real_hw_power_brake_is_monitor_and_sw_power_cap_is_not_a_finding() -> None:
    # GPU 2 of the real recording: SW power cap, SW thermal slowdown and HW power brake active.
    r = gpu.check_throttle(facts(H100), CFG)
    assert r.status is Status.WARN
    assert [f.rule for f in r.findings] == ["gpu.throttle.hw-power-brake"]
    assert "0000:75:00.0" in r.findings[0].message


def test_throttle_passes_on_a_real_idle_node() -> None:
    assert (
        gpu.check_throttle(facts("nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt", None), CFG).status
        is Status.PASS
    )


def test_throttle_hw_thermal() -> None:
    r = gpu.check_throttle(facts("DERIVED-h100x8-hw-slowdown.txt"), CFG)
    # GPU 2 of the real recording already shows HW Power Brake Slowdown Active under a Not Active HW
    # Slowdown (ignored there); the derived change sets HW Slowdown and HW Thermal Slowdown, so both
    # sub-reasons count, and the umbrella bit is not doubled.
    assert sorted(f.rule for f in r.findings) == ["gpu.throttle.hw-power-brake", "gpu.throttle.hw-thermal"]
    thermal = next(f for f in r.findings if f.rule == "gpu.throttle.hw-thermal")
    assert thermal.severity == Severity.MONITOR and any("0000:75:00.0" in e for e in thermal.entities)


def test_pcie_passes_at_full_width_and_flags_a_narrow_link() -> None:
    assert gpu.check_pcie(facts(H100), CFG).status is Status.PASS
    r = gpu.check_pcie(facts("DERIVED-h100x8-pcie-width-x8.txt"), CFG)
    only_finding(r, "gpu.pcie.width", Severity.MONITOR, "0000:75:00.0")
    assert "x8 of x16" in r.message


def test_persistence_real_disabled_and_enabled() -> None:
    assert gpu.check_persistence(facts(H100), CFG).status is Status.PASS
    r = gpu.check_persistence(facts("nvgpuexp-l40s-595.80-q-idle.txt", None), CFG)
    only_finding(r, "gpu.persistence.disabled", Severity.MONITOR)


def test_fabric_completed_passes_and_in_progress_needs_a_reset() -> None:
    assert gpu.check_fabric(facts(H100), CFG).status is Status.PASS
    r = gpu.check_fabric(facts("DERIVED-h100x8-fabric-in-progress.txt"), CFG)
    only_finding(r, "gpu.fabric.incomplete", Severity.RESET, "0000:75:00.0")


# --------------------------------------------------------------------------- allocatable


def node(alloc: int | None) -> NodeObject:
    return NodeObject(name="n", labels={}, allocatable_gpus=alloc, capacity_gpus=8)


def test_allocatable_equal_passes_and_below_warns() -> None:
    assert gpu_allocatable.check_allocatable(facts(H100, node=node(8)), CFG).status is Status.PASS
    r = gpu_allocatable.check_allocatable(facts(H100, node=node(7)), CFG)
    only_finding(r, "gpu.allocatable.below-visible", Severity.MONITOR)
    assert "7 of 8" in r.message and "unhealthy" in r.message


def test_allocatable_without_a_device_plugin_nor_slices_is_skipped_and_says_both() -> None:
    """Not for want of nvidia.com/gpu alone: the DRA driver's slices were not read either (the DRA
    comparison: tests/test_checks_dra.py)."""
    bare = NodeObject(name="n", labels={}, allocatable_gpus=None, capacity_gpus=None)
    r = gpu_allocatable.check_allocatable(facts(H100, node=bare), CFG)
    assert r.status is Status.SKIPPED
    assert "no nvidia.com/gpu" in r.message and "resourceslices.json not captured" in r.message


# --------------------------------------------------------------------------- config


def test_a_rule_severity_can_be_overridden_and_silenced() -> None:
    raised = cfg({"severities": {"gpu.throttle.hw-power-brake": "reset"}})
    assert gpu.check_throttle(facts(H100), raised).status is Status.FAIL
    silenced = cfg({"severities": {"gpu.throttle.hw-power-brake": "none"}})
    assert gpu.check_throttle(facts(H100), silenced).status is Status.PASS


def test_an_empty_inventory_is_skipped_not_passed() -> None:
    r = gpu_memory.check_ecc(NodeFacts(gpus=GpuInventory(source="nvml")), CFG)
    assert r.status is Status.SKIPPED


def test_pcie_x8_is_healthy_where_the_platform_wires_x8() -> None:
    """Real A10G recording (AWS g5 class) at x8 of x16: a warning on a g5 would be a false alarm."""
    from agent.probes.nvsmi_xml import parse_nvsmi_xml

    xml = (FIX.parent / "nvidia-smi-xml" / "telegraf-a10g-515.105.01.xml").read_text()
    inv = parse_nvsmi_xml(xml)
    g5 = NodeFacts(instance_type="g5.xlarge", profile=CFG.profiles["g5.xlarge"], gpus=inv)
    assert gpu.check_pcie(g5, CFG).status is Status.PASS
    unknown_type = NodeFacts(gpus=inv)
    assert gpu.check_pcie(unknown_type, CFG).status is Status.WARN


def test_responsive_attached_gpus_not_described_are_unknown_unless_nvidia_smi_says_lost() -> None:
    """<attached_gpus>2 and one <gpu>: an excerpt or a lost GPU whose error went to stderr. Only
    nvidia-smi's own "GPU is lost" line makes it a fault (the live probe and the snapshot keep it)."""
    from agent.probes.nvsmi_errors import with_lost_lines
    from agent.probes.nvsmi_xml import parse_nvsmi_xml
    from agent.probes.reading import parse_with

    xml_dir = FIX.parent / "nvidia-smi-xml"
    healthy = parse_nvsmi_xml((xml_dir / "telegraf-dual-rtx-a5000-590.44.01-v13.xml").read_text())
    assert gpu.check_responsive(NodeFacts(gpus=healthy), CFG).status is Status.PASS
    text = (xml_dir / "telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-missing.xml").read_text()
    missing = parse_with("nvidia-smi -q -x", text, parse_nvsmi_xml)
    r = gpu.check_responsive(NodeFacts(gpus=missing), CFG)
    assert r.status is Status.UNKNOWN and not r.findings
    assert "<attached_gpus> says 2 but the document describes 1 GPU(s)" in r.message
    stderr = "Unable to determine the device handle for GPU0000:C1:00.0: GPU is lost.  Reboot the system\n"
    lost = parse_with("nvidia-smi -q -x", with_lost_lines(text, stderr), parse_nvsmi_xml)
    r = gpu.check_responsive(NodeFacts(gpus=lost), CFG)
    only_finding(r, "gpu.responsive.lost", Severity.REBOOT)
    assert "0000:c1:00.0 does not answer" in r.message


def test_a_snapshot_merges_lost_gpus_from_the_text_view_into_the_xml_view(tmp_path: Path) -> None:
    from agent.probes.snapshot import SnapshotSource

    xml_dir = FIX.parent / "nvidia-smi-xml"
    (tmp_path / "nvidia-smi-q.xml").write_text(
        (xml_dir / "telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-missing.xml").read_text()
    )
    (tmp_path / "nvidia-smi-q.txt").write_text(
        "Unable to determine the device handle for GPU0000:C1:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU\n"
    )
    inv = SnapshotSource(tmp_path).gpus()
    assert isinstance(inv, GpuInventory) and len(inv.gpus) == 1
    assert [lost.pci_bus_id for lost in inv.lost] == ["00000000:c1:00.0"]


@pytest.mark.parametrize(
    ("gpu_fields", "check", "rule", "severity"),
    [
        (
            {"recovery_action": "Node Reboot Required"},
            gpu.check_recovery_action,
            "gpu.recovery-action.reboot",
            Severity.REBOOT,
        ),
        (
            {"recovery_action": "Drain and Reset"},
            gpu.check_recovery_action,
            "gpu.recovery-action.drain",
            Severity.RESET,
        ),
        (
            {"recovery_action": "None", "reset_required": True},
            gpu.check_recovery_action,
            "gpu.recovery-action.reset",
            Severity.RESET,
        ),
        (
            {"ecc": EccErrors(sram_threshold_exceeded=True)},
            gpu_memory.check_ecc,
            "gpu.ecc.sram-threshold",
            Severity.ISOLATE,
        ),
        (
            {"ecc": EccErrors(volatile_double_bit_total=1)},
            gpu_memory.check_ecc,
            "gpu.ecc.dram-uncorrectable",
            Severity.RESET,
        ),
        (
            {"clock_events": ClockEvents(hw_slowdown=True)},
            gpu.check_throttle,
            "gpu.throttle.hw-slowdown",
            Severity.MONITOR,
        ),
        (
            {"fabric": Fabric(state="Completed", status="Failure")},
            gpu.check_fabric,
            "gpu.fabric.incomplete",
            Severity.RESET,
        ),
    ],
)
def test_each_remaining_rule_fires_for_its_cause(
    gpu_fields: dict[str, object], check: object, rule: str, severity: Severity
) -> None:
    """Rules no real recording shows: one GPU with just that fault (checks are pure functions)."""
    from agent.core.gpu import Gpu

    inv = GpuInventory(
        source="nvml", attached_gpus=1, gpus=(Gpu(index=0, pci_bus_id="00000000:53:00.0", **gpu_fields),)
    )  # type: ignore[arg-type]
    result = check(NodeFacts(gpus=inv), CFG)  # type: ignore[operator]
    only_finding(result, rule, severity, "0000:53:00.0")
