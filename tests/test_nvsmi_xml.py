"""nvidia-smi -q -x parser: real recordings (DTD v11, v12, v13), derived faults, tool failures, fuzz."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.gpu import (
    ClockEvents,
    EccErrors,
    Fabric,
    GpuClocks,
    GpuInventory,
    GpuThermal,
    RemapHistogram,
    RemappedRows,
    RetiredPages,
)
from agent.core.probed import ParseError
from agent.probes.nvsmi_errors import ToolReportedFailure
from agent.probes.nvsmi_xml import parse_nvsmi_xml

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-xml"

A100_MIG = "telegraf-a100-sxm4-80gb-mig-535.54.03.xml"
A10G = "telegraf-a10g-515.105.01.xml"
DUAL_A5000 = "telegraf-dual-rtx-a5000-590.44.01-v13.xml"
ADA_4000 = "telegraf-rtx-4000-sff-ada-595.84-v13.xml"
T4 = "telegraf-tesla-t4-515.105.01.xml"


def load(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def parse(name: str) -> GpuInventory:
    return read(load(name))


def read(text: str) -> GpuInventory:
    """The inventory, also of the A100 file whose contributor kept one <gpu> of <attached_gpus>4:
    that contradiction makes the capture unreadable, its one intact <gpu> stays as evidence."""
    try:
        return parse_nvsmi_xml(text)
    except ParseError as exc:
        assert "attached_gpus" in str(exc) and isinstance(exc.partial, GpuInventory), exc
        return exc.partial


def test_every_xml_fixture_parses_and_has_a_source_note() -> None:
    files = sorted(FIX.glob("*.xml"))
    assert len(files) >= 5
    for path in files:
        assert (FIX / (path.name + ".source.txt")).is_file(), path.name
        inv = read(path.read_text(encoding="utf-8"))
        assert inv.source == "nvidia-smi -q -x"
        assert inv.gpus, path.name
        assert [g.index for g in inv.gpus] == list(range(len(inv.gpus)))


def test_a100_mig_v12_trimmed_file() -> None:
    with pytest.raises(ParseError, match="attached_gpus> says 4 but the document describes 1 GPU"):
        parse_nvsmi_xml(load(A100_MIG))  # the contributor kept only the first <gpu>
    inv = parse(A100_MIG)
    assert inv.driver_version == "535.54.03"
    assert inv.cuda_version == "12.2"
    assert inv.attached_gpus == 4
    assert len(inv.gpus) == 1
    gpu = inv.gpus[0]
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.serial == "1650522003820"
    assert gpu.architecture == "Ampere"
    assert gpu.mig_mode is True
    assert gpu.persistence_mode is False
    assert gpu.remapped_rows is None  # <remapped_rows>N/A</remapped_rows> under MIG
    assert gpu.retired_pages is None  # every retired_pages field is N/A
    assert gpu.reset_required is False
    assert gpu.drain_and_reset_recommended is False
    assert gpu.recovery_action is None  # not in DTD v12
    assert gpu.fabric is None  # state and status N/A
    assert gpu.ecc == EccErrors(
        mode_enabled=True,
        volatile_dram_uncorrectable=0,
        volatile_sram_uncorrectable=0,
        aggregate_dram_uncorrectable=0,
        aggregate_sram_uncorrectable=0,
        volatile_dram_correctable=0,
        aggregate_dram_correctable=0,
        volatile_sram_correctable=0,
        aggregate_sram_correctable=0,
    )
    assert gpu.pcie.gen_current == 4 and gpu.pcie.gen_max == 4
    assert gpu.pcie.width_current == 16 and gpu.pcie.width_max == 16
    assert gpu.pcie.replay_counter == 0
    assert gpu.clock_events == ClockEvents(False, False, False, False, False, False, False, False, False)
    # MIG devices carry their own <ecc_error_count>; they must not leak into the GPU's ECC.
    assert gpu.label == "GPU 0 (0000:01:00.0)"


def test_a10g_v11_old_throttle_reason_names_and_x8_link() -> None:
    gpu = parse(A10G).gpus[0]
    assert gpu.name == "NVIDIA A10G"
    assert gpu.pci_bus_id == "00000000:00:1e.0"  # id="00000000:00:1E.0" normalised to lower case
    assert gpu.mig_mode is None  # current_mig N/A
    # clocks_throttle_reason_* (515): idle is the only active reason
    assert gpu.clock_events == ClockEvents(False, False, False, False, False, True, False, False, False)
    assert gpu.pcie.width_current == 8 and gpu.pcie.width_max == 16
    assert gpu.pcie.gen_current == 1 and gpu.pcie.gen_max == 4
    assert gpu.remapped_rows == RemappedRows(0, 0, False, False, RemapHistogram(192, 0, 0, 0, 0))
    assert gpu.retired_pages is None
    assert gpu.reset_required is None  # no gpu_reset_status in v11


def test_t4_v11_has_retired_pages_and_no_remapping() -> None:
    inv = parse(T4)
    gpu = inv.gpus[0]
    assert gpu.name == "Tesla T4"
    assert gpu.architecture == "Turing"
    assert gpu.retired_pages == RetiredPages(single_bit=0, double_bit=0, pending=False)
    assert gpu.remapped_rows is None
    assert gpu.ecc.mode_enabled is True
    assert gpu.ecc.volatile_dram_uncorrectable == 0


def test_v13_dual_a5000_tab_indented() -> None:
    inv = parse(DUAL_A5000)
    assert inv.attached_gpus == 2
    assert [g.pci_bus_id for g in inv.gpus] == ["00000000:81:00.0", "00000000:c1:00.0"]
    assert [g.index for g in inv.gpus] == [0, 1]
    for gpu in inv.gpus:
        assert gpu.name == "NVIDIA RTX A5000"
        assert gpu.persistence_mode is True
        assert gpu.recovery_action == "None"  # the string nvidia-smi prints, not Python None
        assert gpu.ecc.mode_enabled is False
        # parity/SEC-DED split, all N/A with ECC off → None, never 0
        assert gpu.ecc.volatile_sram_uncorrectable is None
        assert gpu.ecc.volatile_dram_uncorrectable is None
        assert gpu.ecc.sram_threshold_exceeded is None
        assert gpu.remapped_rows == RemappedRows(0, 0, False, False, RemapHistogram(192, 0, 0, 0, 0))
        assert gpu.fabric is None


def test_v13_ada_architecture_with_space() -> None:
    gpu = parse(ADA_4000).gpus[0]
    assert gpu.architecture == "Ada Lovelace"
    assert gpu.name == "NVIDIA RTX 4000 SFF Ada Generation"
    assert gpu.remapped_rows == RemappedRows(0, 0, False, False, RemapHistogram(96, 0, 0, 0, 0))


def test_derived_volatile_dram_uncorrectable() -> None:
    gpu = parse("telegraf-a10g-515.105.01-DERIVED-volatile-dram-uncorrectable.xml").gpus[0]
    assert gpu.ecc.volatile_dram_uncorrectable == 2
    assert gpu.ecc.aggregate_dram_uncorrectable == 3
    assert gpu.ecc.volatile_sram_uncorrectable == 0


def test_derived_fabric_in_progress() -> None:
    gpu = parse("telegraf-a100-sxm4-80gb-mig-535.54.03-DERIVED-fabric-in-progress.xml").gpus[0]
    assert gpu.fabric == Fabric(state="In Progress", status=None)


def test_derived_recovery_action_reset_on_second_gpu() -> None:
    inv = parse("telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-recovery-reset.xml")
    assert [g.recovery_action for g in inv.gpus] == ["None", "Reset"]
    assert inv.gpus[1].label == "GPU 1 (0000:c1:00.0)"


# ---------------------------------------------------------------- layouts not in the real files


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_sram_parity_and_secded_are_summed() -> None:
    text = load(DUAL_A5000)
    vol = (
        "\t\t\t<volatile>\n"
        "\t\t\t\t<sram_correctable>N/A</sram_correctable>\n"
        "\t\t\t\t<sram_uncorrectable_parity>N/A</sram_uncorrectable_parity>\n"
        "\t\t\t\t<sram_uncorrectable_secded>N/A</sram_uncorrectable_secded>"
    )
    first = text.index(vol)
    text = (
        text[:first]
        + vol.replace("parity>N/A<", "parity>2<").replace("secded>N/A<", "secded>5<")
        + text[first + len(vol) :]
    )
    inv = parse_nvsmi_xml(text)
    assert inv.gpus[0].ecc.volatile_sram_uncorrectable == 7
    assert inv.gpus[1].ecc.volatile_sram_uncorrectable is None


def test_old_pascal_volta_double_bit_layout() -> None:
    text = _replace_once(
        load(T4),
        "            <volatile>\n"
        "                <sram_correctable>0</sram_correctable>\n"
        "                <sram_uncorrectable>0</sram_uncorrectable>\n"
        "                <dram_correctable>0</dram_correctable>\n"
        "                <dram_uncorrectable>0</dram_uncorrectable>\n"
        "            </volatile>",
        "            <volatile>\n"
        "                <single_bit><device_memory>4</device_memory><total>4</total></single_bit>\n"
        "                <double_bit><device_memory>1</device_memory><total>1</total></double_bit>\n"
        "            </volatile>",
    )
    gpu = parse_nvsmi_xml(text).gpus[0]
    assert gpu.ecc.volatile_double_bit_total == 1
    assert gpu.ecc.volatile_dram_uncorrectable is None
    assert gpu.ecc.aggregate_dram_uncorrectable == 0


def test_retired_pages_pending_retirement_and_odd_whitespace() -> None:
    text = _replace_once(
        load(T4),
        "<pending_retirement>No</pending_retirement>",
        "<pending_retirement>\n  Yes \n</pending_retirement>",
    )
    single = text.index("<multiple_single_bit_retirement>")
    text = text[:single] + text[single:].replace(
        "<retired_count>0</retired_count>", "<retired_count> 3 </retired_count>", 1
    )
    gpu = parse_nvsmi_xml(text).gpus[0]
    assert gpu.retired_pages == RetiredPages(single_bit=3, double_bit=0, pending=True)


@pytest.mark.parametrize(
    "absent", ["N/A", "[N/A]", "[Not Supported]", "Requested functionality has been deprecated"]
)
def test_absent_markers_are_none(absent: str) -> None:
    text = _replace_once(
        load(A100_MIG), "<replay_counter>0</replay_counter>", f"<replay_counter>{absent}</replay_counter>"
    )
    assert read(text).gpus[0].pcie.replay_counter is None


def test_active_clock_events_both_namings() -> None:
    new = _replace_once(
        load(A100_MIG),
        "<clocks_event_reason_hw_slowdown>Not Active</clocks_event_reason_hw_slowdown>",
        "<clocks_event_reason_hw_slowdown>Active</clocks_event_reason_hw_slowdown>",
    )
    assert read(new).gpus[0].clock_events.hw_slowdown is True
    old = _replace_once(
        load(T4),
        "<clocks_throttle_reason_hw_thermal_slowdown>Not Active</clocks_throttle_reason_hw_thermal_slowdown>",
        "<clocks_throttle_reason_hw_thermal_slowdown>Active</clocks_throttle_reason_hw_thermal_slowdown>",
    )
    events = parse_nvsmi_xml(old).gpus[0].clock_events
    assert events.hw_thermal_slowdown is True and events.hw_slowdown is False


def test_pci_bus_id_from_pci_element_when_id_attribute_missing() -> None:
    text = _replace_once(load(A10G), '<gpu id="00000000:00:1E.0">', "<gpu>")
    assert parse_nvsmi_xml(text).gpus[0].pci_bus_id == "00000000:00:1e.0"


def test_gpu_without_any_pci_id_is_parse_error() -> None:
    text = _replace_once(load(A10G), '<gpu id="00000000:00:1E.0">', "<gpu>")
    text = _replace_once(text, "<pci_bus_id>00000000:00:1E.0</pci_bus_id>", "")
    with pytest.raises(ParseError, match="PCI bus id"):
        parse_nvsmi_xml(text)


# ---------------------------------------------------------------- failures and garbage


@pytest.mark.parametrize(
    "output",
    [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n\n",
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161\n",
    ],
)
def test_driver_failure_text_instead_of_xml(output: str) -> None:
    with pytest.raises(ToolReportedFailure) as caught:
        parse_nvsmi_xml(output)
    assert "NVIDIA driver" in caught.value.message or "version mismatch" in caught.value.message


def test_version_mismatch_message_keeps_both_lines() -> None:
    with pytest.raises(ToolReportedFailure) as caught:
        parse_nvsmi_xml(
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161\n"
        )
    assert caught.value.message == (
        "Failed to initialize NVML: Driver/library version mismatch; NVML library version: 535.161"
    )


def test_lost_gpu_line_before_the_xml() -> None:
    """Derived in code from the v13 dual-GPU file: its second GPU is replaced by nvidia-smi's lost line."""
    text = load(DUAL_A5000)
    second = text.index('\t<gpu id="00000000:C1:00.0">')
    end = text.index("\t</gpu>", second) + len("\t</gpu>\n")
    text = (
        "Unable to determine the device handle for GPU0000:C1:00.0: Unknown Error\n"
        + text[:second]
        + text[end:]
    )
    inv = parse_nvsmi_xml(text)
    assert [g.pci_bus_id for g in inv.gpus] == ["00000000:81:00.0"]
    assert len(inv.lost) == 1
    assert inv.lost[0].pci_bus_id == "00000000:c1:00.0"
    assert "Unknown Error" in inv.lost[0].message
    assert inv.attached_gpus == 2


def test_no_devices_found_is_an_empty_inventory() -> None:
    inv = parse_nvsmi_xml("No devices were found\n")
    assert inv.gpus == () and inv.attached_gpus == 0


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9, 0.999])
def test_truncated_xml_is_parse_error(cut: float) -> None:
    text = load(DUAL_A5000)
    with pytest.raises(ParseError):
        parse_nvsmi_xml(text[: int(len(text) * cut)])


@pytest.mark.parametrize(
    "text", ["", "garbage", "<html><body/></html>", "<?xml version='1.0'?><nvidia_smi_log>"]
)
def test_garbage_is_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_nvsmi_xml(text)


def test_entity_declarations_are_refused() -> None:
    bomb = (
        '<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]><nvidia_smi_log><driver_version>&b;</driver_version>'
        "</nvidia_smi_log>"
    )
    with pytest.raises(ParseError, match="entities"):
        parse_nvsmi_xml(bomb)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_fuzz_random_text(text: str) -> None:
    try:
        inv = parse_nvsmi_xml(text)
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary())
def test_fuzz_random_bytes(data: bytes) -> None:
    try:
        inv = parse_nvsmi_xml(data.decode("utf-8", errors="replace"))
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)


_REAL = load(DUAL_A5000)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(_REAL)), st.text(max_size=20))
def test_fuzz_truncated_and_spliced_real_file(cut: int, junk: str) -> None:
    try:
        inv = parse_nvsmi_xml(_REAL[:cut] + junk)
    except (ParseError, ToolReportedFailure):
        return
    assert isinstance(inv, GpuInventory)
    assert len(inv.gpus) <= 2


def test_another_view_with_a_lost_gpu_line_is_unreadable_and_keeps_the_statement() -> None:
    """The text view fed to the XML parser: not its output, but nvidia-smi's 'GPU is lost' stays."""
    text = (FIX.parent / "nvidia-smi-q" / "gpud-h100x8-535.183.01-DERIVED-gpu3-lost.txt").read_text()
    with pytest.raises(ParseError, match="not nvidia-smi -q -x output") as caught:
        parse_nvsmi_xml(text)
    assert isinstance(caught.value.partial, GpuInventory)
    assert [lg.pci_bus_id for lg in caught.value.partial.lost] == ["00000000:86:00.0"]


def test_what_the_trend_warnings_read_from_xml() -> None:
    """Histogram, temperatures (absolute on the A100, relative to T.Limit on the H100), clocks."""
    h100 = parse("h100-capture-580.159.04-qx.xml").gpus[0]
    assert h100.remapped_rows is not None and h100.remapped_rows.histogram == RemapHistogram(2560, 0, 0, 0, 0)
    assert h100.thermal == GpuThermal(gpu_c=33, gpu_tlimit_margin_c=54, gpu_slowdown_tlimit_c=-2, memory_c=34)
    assert h100.thermal.gpu_margin_c == 56
    assert h100.clocks == GpuClocks(sm_mhz=345, applications_mhz=1980, max_sm_mhz=1980, utilization_percent=0)
    assert h100.clock_events.active() == ("idle",)
    a100 = parse(A100_MIG).gpus[0]
    assert (a100.thermal.gpu_margin_c, a100.thermal.memory_margin_c) == (62, 51)
    assert a100.clocks.utilization_percent is None  # N/A under MIG: never 0
