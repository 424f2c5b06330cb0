"""nvidia-smi -q text parser: real recordings, partial -d views, truncation, lost GPUs, tool failures."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.gpu import (
    ClockEvents,
    Fabric,
    GpuClocks,
    GpuInventory,
    GpuThermal,
    RemapHistogram,
    RemappedRows,
    RetiredPages,
)
from agent.core.probed import ParseError
from agent.probes.nvsmi_errors import ToolReportedFailure, detect_lost_gpus, detect_tool_failure
from agent.probes.nvsmi_text import parse_nvsmi_text

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-q"

H100X8 = "gpud-h100x8-535.183.01.txt"
H100X8_TRUNCATED = "gpud-h100x8-535.183.01-truncated.txt"
H100X8_LOST = "gpud-h100x8-535.183.01-DERIVED-gpu3-lost.txt"
A100_REMAP = "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending.txt"
AZ_BAD = "aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt"
AZ_CLEAN = "aznhc-azure-8gpu-535.86.10-page-retirement-clean.txt"

# Real files other than the truncated one, with the GPU count each must give.
EXPECTED_COUNTS = {
    "aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt": 8,
    "aznhc-azure-8gpu-535.86.10-page-retirement-clean.txt": 8,
    "gpud-a10x1-535.129.03.txt": 1,
    "gpud-h100x8-535.183.01.txt": 8,
    "gpud-rtx4090x8-535.154.05.txt": 8,
    "gpud-titanv-560.35.03.txt": 1,
    "nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt": 1,
    "nvgpuexp-h100-80gb-hbm3-590.48.01-q-load.txt": 1,
    "nvgpuexp-h200-590.48.01-q-idle.txt": 1,
    "nvgpuexp-h200-590.48.01-q-load.txt": 1,
    "nvgpuexp-l40s-595.80-q-idle.txt": 1,
    "nvgpuexp-l40s-595.80-q-load.txt": 1,
    "nvidia-smi-q_h100_idle_driver590.txt": 1,
    "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending.txt": 4,
    "thamada-h100-nvl-x2-550.54.14.txt": 2,
    "thamada-h200-550.90.12.txt": 1,
    "thamada-l4-550.90.07.txt": 1,
    "h100-capture-580.159.04-q.txt": 1,
    "h100-capture-580.159.04-q-load.txt": 1,
    "h100-capture-580.159.04-q-d-ecc.txt": 1,
    "h100-capture-580.159.04-q-d-ecc-row-remapper.txt": 1,
    "h100-capture-580.159.04-q-d-page-retirement.txt": 1,
}


def load(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def parse(name: str) -> GpuInventory:
    return parse_nvsmi_text(load(name))


@pytest.mark.parametrize(("name", "count"), sorted(EXPECTED_COUNTS.items()))
def test_real_fixture_gpu_count(name: str, count: int) -> None:
    assert (FIX / (name + ".source.txt")).is_file()
    inv = parse(name)
    assert inv.source == "nvidia-smi -q"
    assert len(inv.gpus) == count
    assert inv.attached_gpus == count
    assert [g.index for g in inv.gpus] == list(range(count))
    assert inv.lost == ()


def test_h100x8_healthy_values() -> None:
    inv = parse(H100X8)
    assert inv.driver_version == "535.183.01"
    assert inv.cuda_version == "12.2"
    assert {g.name for g in inv.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.architecture for g in inv.gpus} == {"Hopper"}
    assert [g.pci_bus_id for g in inv.gpus] == [
        "00000000:53:00.0",
        "00000000:64:00.0",
        "00000000:75:00.0",
        "00000000:86:00.0",
        "00000000:97:00.0",
        "00000000:a8:00.0",
        "00000000:b9:00.0",
        "00000000:ca:00.0",
    ]
    for gpu in inv.gpus:
        assert gpu.persistence_mode is True
        assert gpu.mig_mode is False  # "MIG Mode / Current: Disabled"; its "Pending" is not a fault
        assert gpu.ecc.mode_enabled is True
        assert gpu.ecc.volatile_dram_uncorrectable == 0
        assert gpu.ecc.aggregate_dram_uncorrectable == 0
        assert gpu.ecc.volatile_sram_uncorrectable == 0  # parity 0 + SEC-DED 0
        assert gpu.ecc.aggregate_sram_uncorrectable == 0
        assert gpu.ecc.sram_threshold_exceeded is False
        assert gpu.retired_pages is None  # all N/A on Hopper
        assert gpu.remapped_rows == RemappedRows(0, 0, False, False, RemapHistogram(2560, 0, 0, 0, 0))
        assert gpu.fabric == Fabric(state="Completed", status="Success")
        assert gpu.reset_required is False
        assert gpu.drain_and_reset_recommended is False
        assert gpu.pcie.gen_current == 5 and gpu.pcie.gen_max == 5
        assert gpu.pcie.width_current == 16 and gpu.pcie.width_max == 16
    assert inv.gpus[0].pcie.replay_counter == 120
    assert inv.gpus[0].serial == "1655022005478"
    assert inv.gpus[0].uuid == "GPU-566e6f65-c38e-b12f-4824-6944218668b9"


def test_h100x8_one_gpu_with_power_cap_and_thermal_events() -> None:
    inv = parse(H100X8)
    quiet = ClockEvents(False, False, False, False, False, True, False, False, False)  # idle only
    throttled = [g for g in inv.gpus if g.clock_events != quiet]
    assert [g.index for g in throttled] == [2]
    gpu = throttled[0]
    assert gpu.pci_bus_id == "00000000:75:00.0"
    # "HW Power Brake Slowdown : Active" is nested under "HW Slowdown : Not Active" in the text.
    assert gpu.clock_events == ClockEvents(
        hw_slowdown=False,
        hw_thermal_slowdown=False,
        hw_power_brake=True,
        sw_power_cap=True,
        sw_thermal_slowdown=True,
        idle=False,
        applications_clocks_setting=False,
        sync_boost=False,
        display_clock_setting=False,
    )


def test_a100_remap_pending_on_the_right_gpu() -> None:
    inv = parse(A100_REMAP)
    rows = [g.remapped_rows for g in inv.gpus]
    full, one_used = RemapHistogram(640, 0, 0, 0, 0), RemapHistogram(639, 1, 0, 0, 0)
    assert rows == [
        RemappedRows(0, 0, False, False, full),
        RemappedRows(correctable=1, uncorrectable=0, pending=True, failure=False, histogram=one_used),
        RemappedRows(correctable=1, uncorrectable=0, pending=False, failure=False, histogram=one_used),
        RemappedRows(0, 0, False, False, full),
    ]
    bad = inv.gpus[1]
    assert bad.pci_bus_id == "00000000:9e:00.0"
    assert bad.ecc.volatile_dram_correctable == 353
    assert bad.ecc.aggregate_dram_correctable == 353
    assert bad.ecc.volatile_dram_uncorrectable == 0
    # ECC Mode "Pending: Enabled" and MIG Mode "Pending: Disabled" must not be read as faults.
    assert bad.ecc.mode_enabled is True and bad.mig_mode is False


def test_a10_fixture_shows_a_real_row_remap_fault() -> None:
    """Listed as valid by its source, but it prints Uncorrectable 4 / Pending Yes."""
    gpu = parse("gpud-a10x1-535.129.03.txt").gpus[0]
    assert gpu.remapped_rows == RemappedRows(
        correctable=0, uncorrectable=4, pending=True, failure=False, histogram=RemapHistogram(192, 0, 0, 0, 0)
    )


def test_page_retirement_partial_view_bad() -> None:
    inv = parse(AZ_BAD)
    assert inv.attached_gpus == 8
    pages = [g.retired_pages for g in inv.gpus]
    assert pages[0] == RetiredPages(single_bit=60, double_bit=5, pending=False)
    assert pages[1] == RetiredPages(single_bit=2, double_bit=61, pending=True)
    assert pages[7] == RetiredPages(single_bit=8, double_bit=56, pending=True)
    assert inv.gpus[0].pci_bus_id == "00000001:00:00.0"
    # The sections this view leaves out give None / default fields, never zero.
    gpu = inv.gpus[0]
    assert gpu.name is None and gpu.remapped_rows is None and gpu.fabric is None
    assert gpu.ecc.volatile_dram_uncorrectable is None
    assert gpu.clock_events == ClockEvents()


def test_page_retirement_partial_view_clean() -> None:
    inv = parse(AZ_CLEAN)
    assert {g.retired_pages for g in inv.gpus} == {RetiredPages(0, 0, False)}


def test_titan_v_old_ecc_layout_all_na() -> None:
    gpu = parse("gpud-titanv-560.35.03.txt").gpus[0]
    assert gpu.architecture == "Volta"
    assert gpu.ecc.mode_enabled is None
    assert gpu.ecc.volatile_double_bit_total is None  # "Double Bit / Total : N/A"
    assert gpu.remapped_rows is None  # "Remapped Rows : N/A"
    assert gpu.retired_pages is None
    assert gpu.fabric is None


def test_driver_590_recovery_action_and_fabric() -> None:
    gpu = parse("nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt").gpus[0]
    assert gpu.recovery_action == "None"
    assert gpu.reset_required is None  # R590 no longer prints "GPU Reset Status"
    assert gpu.fabric == Fabric(state="Completed", status="Success")
    assert gpu.pcie.replay_counter == 9


def test_l4_and_l40s() -> None:
    l4 = parse("thamada-l4-550.90.07.txt").gpus[0]
    assert l4.architecture == "Ada Lovelace"
    assert (l4.pcie.width_current, l4.pcie.width_max) == (8, 16)
    l40s = parse("nvgpuexp-l40s-595.80-q-load.txt").gpus[0]
    assert l40s.name == "NVIDIA L40S"
    assert l40s.persistence_mode is False
    assert l40s.remapped_rows == RemappedRows(0, 0, False, False, RemapHistogram(192, 0, 0, 0, 0))


def test_truncated_h100x8_is_parse_error() -> None:
    with pytest.raises(ParseError, match=r"Attached GPUs : 8.*1 GPU block"):
        parse(H100X8_TRUNCATED)


def test_single_gpu_block_cut_before_processes_is_parse_error() -> None:
    text = load("thamada-h200-550.90.12.txt")
    cut = text.index("    Temperature")
    with pytest.raises(ParseError, match="Processes"):
        parse_nvsmi_text(text[:cut])


def test_derived_lost_gpu_among_eight() -> None:
    inv = parse(H100X8_LOST)
    assert inv.attached_gpus == 8
    assert len(inv.gpus) == 7
    assert len(inv.lost) == 1
    lost = inv.lost[0]
    assert lost.pci_bus_id == "00000000:86:00.0"
    assert "GPU is lost" in lost.message
    # The lost GPU keeps its slot: the GPUs after it keep nvidia-smi's index.
    assert [(g.index, g.pci_bus_id) for g in inv.gpus] == [
        (0, "00000000:53:00.0"),
        (1, "00000000:64:00.0"),
        (2, "00000000:75:00.0"),
        (4, "00000000:97:00.0"),
        (5, "00000000:a8:00.0"),
        (6, "00000000:b9:00.0"),
        (7, "00000000:ca:00.0"),
    ]


def test_lost_gpu_wording_variants() -> None:
    text = (
        "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error\n"
        "Unable to determine the device handle for gpu 0000:5a:00.0: GPU requires reset\n"
        "Unable to determine the device handle for GPU0000:E1:00.0: Unable to communicate with GPU because "
        "it is insufficiently powered.\n"
    )
    lost = detect_lost_gpus(text)
    assert [lg.pci_bus_id for lg in lost] == ["00000000:3b:00.0", "00000000:5a:00.0", "00000000:e1:00.0"]
    inv = parse_nvsmi_text(text)  # every GPU lost: no data blocks at all
    assert inv.gpus == () and len(inv.lost) == 3


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
        ),
        (
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90\n",
            "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 550.90",
        ),
        ("Failed to initialize NVML: Unknown Error\n", "Failed to initialize NVML: Unknown Error"),
    ],
)
def test_whole_output_driver_failure(output: str, expected: str) -> None:
    assert detect_tool_failure(output) == expected
    with pytest.raises(ToolReportedFailure) as caught:
        parse_nvsmi_text(output)
    assert caught.value.message == expected


def test_healthy_output_is_not_a_tool_failure() -> None:
    assert detect_tool_failure(load(H100X8)) is None
    assert detect_lost_gpus(load(H100X8)) == []


def test_no_devices_found() -> None:
    inv = parse_nvsmi_text("No devices were found\n")
    assert inv.gpus == () and inv.attached_gpus == 0


def test_pending_is_read_by_section_path() -> None:
    """A remap-pending "Pending: Yes" must stay in Remapped Rows; MIG/ECC "Pending" are modes."""
    text = load("thamada-h200-550.90.12.txt")
    pad = " " * 27
    mig = f"    MIG Mode\n        Current{pad}: Disabled\n        Pending{pad}: Disabled"
    assert mig in text
    text = text.replace(
        mig,
        mig.replace(
            "Pending                           : Disabled", "Pending                           : Enabled"
        ),
    )
    gpu = parse_nvsmi_text(text).gpus[0]
    assert gpu.mig_mode is False
    assert gpu.remapped_rows is not None and gpu.remapped_rows.pending is False
    assert gpu.retired_pages is None


def test_old_throttle_reasons_section_name() -> None:
    text = load("thamada-l4-550.90.07.txt").replace("Clocks Event Reasons\n", "Clocks Throttle Reasons\n")
    text = text.replace(
        "        HW Slowdown                       : Not Active",
        "        HW Slowdown                       : Active",
    )
    events = parse_nvsmi_text(text).gpus[0].clock_events
    assert events.hw_slowdown is True and events.hw_thermal_slowdown is False


@pytest.mark.parametrize("text", ["", "\n\n", "hello world", "Timestamp : now\n", "<?xml version='1.0'?>"])
def test_garbage_is_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_nvsmi_text(text)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_fuzz_random_text(text: str) -> None:
    try:
        inv = parse_nvsmi_text(text)
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary())
def test_fuzz_random_bytes(data: bytes) -> None:
    try:
        inv = parse_nvsmi_text(data.decode("utf-8", errors="replace"))
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)


_REAL = load(A100_REMAP)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(_REAL)))
def test_fuzz_truncated_real_file(cut: int) -> None:
    """Any prefix of a 4-GPU output is either refused or (only when complete) the full inventory."""
    try:
        inv = parse_nvsmi_text(_REAL[:cut])
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)
    assert len(inv.gpus) == 4


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(_REAL)), st.text(max_size=40))
def test_fuzz_spliced_real_file(cut: int, junk: str) -> None:
    try:
        inv = parse_nvsmi_text(_REAL[:cut] + junk + _REAL[cut:])
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)


# ---------------------------------------------------------------- damaged captures keep their intact blocks

REMAP_VIEW = "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending-DERIVED-d-ecc-row-remapper.txt"


def test_a_d_view_is_read_whole() -> None:
    inv = parse(REMAP_VIEW)
    assert [g.remapped_rows.pending if g.remapped_rows else None for g in inv.gpus] == [
        False,
        True,
        False,
        False,
    ]


def test_an_excerpt_of_one_gpu_is_unreadable_and_keeps_that_gpu() -> None:
    name = (
        "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending-"
        "DERIVED-d-ecc-row-remapper-gpu1-only-ecc-unknown-error.txt"
    )
    with pytest.raises(ParseError, match=r"'Attached GPUs : 4' but only 1 GPU block") as caught:
        parse(name)
    partial = caught.value.partial
    assert isinstance(partial, GpuInventory)
    (gpu,) = partial.gpus
    assert gpu.pci_bus_id == "00000000:9e:00.0" and gpu.ecc.mode_enabled is None
    assert gpu.remapped_rows == RemappedRows(1, 0, True, False, RemapHistogram(639, 1, 0, 0, 0))


def test_a_capture_cut_in_a_block_keeps_the_blocks_before_and_the_cut_block_lines() -> None:
    with pytest.raises(ParseError, match="cut short inside line") as caught:
        parse("DERIVED-h100x8-row-remap-failure-cut-in-gpu3.txt")
    partial = caught.value.partial
    assert isinstance(partial, GpuInventory)
    assert [g.index for g in partial.gpus] == [0, 1, 2, 3]
    assert partial.gpus[2].remapped_rows is not None and partial.gpus[2].remapped_rows.failure is True


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        # a line repeated inside a section
        (
            lambda t: _replace(
                t,
                "        Pending                           : Yes\n",
                "        Pending                           : Yes\n" * 2,
            ),
            "'pending' appears twice under 'remapped rows'",
        ),
        # the 'Remapped Rows' header lost: its lines land under Retired Pages
        (
            lambda t: t.replace("    Remapped Rows\n", ""),
            r"'correctable error' \(of 'remapped rows'\) found under 'retired pages'",
        ),
        # ECC Mode's "Pending : Enabled" moved under Remapped Rows
        (
            lambda t: _replace(
                t,
                "        Pending                           : Yes\n",
                "        Pending                           : Enabled\n",
            ),
            "'pending' reads 'Enabled', not Yes/No",
        ),
    ],
)
def test_a_damaged_block_is_not_evidence(edit: object, why: str) -> None:
    text = edit(load(A100_REMAP))  # type: ignore[operator]
    with pytest.raises(ParseError, match=why) as caught:
        parse_nvsmi_text(text)
    partial = caught.value.partial
    assert isinstance(partial, GpuInventory)
    assert "00000000:9e:00.0" not in [g.pci_bus_id for g in partial.gpus]


def test_a_d_view_block_missing_a_section_is_unreadable() -> None:
    text = load(REMAP_VIEW)
    last = text.rindex("    Remapped Rows")
    with pytest.raises(ParseError, match="lacks sections other GPUs show"):
        parse_nvsmi_text(text[:last])


def test_a_gpu_block_twice_is_unreadable() -> None:
    text = load(REMAP_VIEW)
    with pytest.raises(ParseError, match=r"has two blocks|but 5 GPU block"):
        parse_nvsmi_text(text + text[text.index("GPU 00000000:68:00.0") :])


def test_a_nul_byte_in_a_block_makes_it_no_evidence() -> None:
    """'Comp\\x00leted' must not read as a fabric state other than Completed."""
    text = load(A100_REMAP).replace("Pending                           : Yes", "Pend\x00ing  : Yes", 1)
    with pytest.raises(ParseError, match="holds bytes nvidia-smi never prints") as caught:
        parse_nvsmi_text(text)
    assert isinstance(caught.value.partial, GpuInventory)
    assert "00000000:9e:00.0" not in [g.pci_bus_id for g in caught.value.partial.gpus]


def test_a_blank_line_inside_a_block_means_lines_were_lost() -> None:
    """GPU 0's lines and GPU 1's header lost: GPU 1's lines would read as GPU 0's."""
    text = load("aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt")
    first = text.index("GPU 00000001:00:00.0\n") + len("GPU 00000001:00:00.0\n")
    second = text.index("GPU 00000002:00:00.0\n") + len("GPU 00000002:00:00.0\n")
    merged = text[:first] + "\n" + text[second:]
    with pytest.raises(ParseError, match="follows a blank line inside the block") as caught:
        parse_nvsmi_text(merged)
    assert isinstance(caught.value.partial, GpuInventory)
    assert "00000001:00:00.0" not in [g.pci_bus_id for g in caught.value.partial.gpus]


def test_no_attached_gpus_line_is_unreadable_with_its_blocks_kept() -> None:
    text = load(A100_REMAP).replace("Attached GPUs                             : 4\n", "")
    with pytest.raises(ParseError, match="no 'Attached GPUs' line") as caught:
        parse_nvsmi_text(text)
    assert isinstance(caught.value.partial, GpuInventory) and len(caught.value.partial.gpus) == 4


def test_mig_devices_repeat_their_section_and_the_block_is_read_whole() -> None:
    """Real 590 MIG capture: one 'MIG Device' section per instance is no damage."""
    text = (FIX.parent / "multi-command-captures" / "nvgpuexp-h100-mig-590.48.01-capture.txt").read_text()
    section = text.split("# $ nvidia-smi -q\n", 1)[1].split("#" * 80 + "\n", 2)[1]
    assert section.count("    MIG Device\n") > 1
    (gpu,) = parse_nvsmi_text(section).gpus
    assert gpu.mig_mode is True


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        # GPU 1's header lost: its lines land under a line that is not a GPU header... here "Attached
        # GPUs", once the earlier blocks and the blank line are gone too
        (
            lambda t: t[: t.index("GPU 00000000:68:00.0")] + t[t.index("GPU 00000000:9E:00.0") + 21 :],
            "indented lines outside any GPU block",
        ),
        (
            lambda t: t.replace("Attached GPUs", "# a note\nAttached GPUs", 1),
            "'# a note' is not a line of nvidia-smi -q",
        ),
    ],
)
def test_lines_outside_the_gpu_blocks_that_nvidia_smi_does_not_print_are_unreadable(
    edit: object, why: str
) -> None:
    with pytest.raises(ParseError, match=why):
        parse_nvsmi_text(edit(load(REMAP_VIEW)))  # type: ignore[operator]


# --------------------------------------------------------------------------- what the trend warnings read


def test_temperatures_absolute_and_relative_to_tlimit() -> None:
    """Before Hopper the limits are absolute ("GPU Slowdown Temp : 89 C"); Hopper and later print
    them relative to T.Limit ("GPU T.Limit Temp : 50 C" left, slowdown at -2 C): both give the
    degrees left before slowdown."""
    a100 = parse(A100_REMAP).gpus[0]
    assert a100.thermal == GpuThermal(gpu_c=25, gpu_slowdown_c=89, memory_c=43, memory_max_c=95)
    assert (a100.thermal.gpu_margin_c, a100.thermal.memory_margin_c) == (64, 52)
    h100 = parse(H100X8).gpus[0]
    assert h100.thermal == GpuThermal(gpu_c=36, gpu_tlimit_margin_c=50, gpu_slowdown_tlimit_c=-2, memory_c=44)
    assert (h100.thermal.gpu_margin_c, h100.thermal.memory_margin_c) == (52, None)  # no HBM limit printed


def test_clocks_utilization_and_every_clock_event_reason() -> None:
    """The H100 under load: P0, 100 % busy, SM 1380 of 1980 MHz, explained by SW Power Cap."""
    gpu = parse("h100-capture-580.159.04-q-load.txt").gpus[0]
    assert gpu.clocks == GpuClocks(
        sm_mhz=1380, applications_mhz=1980, max_sm_mhz=1980, utilization_percent=100
    )
    assert gpu.power.performance_state == "P0"
    assert gpu.clock_events.active() == ("SW power cap",)
    # Drivers >= 590 deprecated the application clocks: not read as a number.
    assert parse("nvgpuexp-h100-80gb-hbm3-590.48.01-q-load.txt").gpus[0].clocks.applications_mhz is None


def test_correctable_errors_sram_and_dram() -> None:
    bad = parse(A100_REMAP).gpus[1]
    assert (bad.ecc.volatile_sram_correctable, bad.ecc.volatile_dram_correctable) == (0, 353)
    assert bad.ecc.volatile_correctable == 353
