"""The GPU field table: one row per field of the GPU model (core/gpu.py: Gpu and its parts) saying
where `nvidia-smi -q` prints it, where `-q -x` prints it and how NVML reads it. The three readers
(nvsmi_text, nvsmi_xml, nvml) fill the model from these rows and nothing else, and the evidence
lines (Gpu.where) come from them too: a new field is one row here and one field in the model.

Paths: `-q` section paths joined by " / " ("**": at any depth below), `-q -x` element paths.
Several paths are tried in order (renamed keys across drivers) and joined by `join`; `fallback`
paths are read when those say nothing and are never evidence. tests/test_gpu_readers_parity.py
holds the three readers to the same model on every recording that has both views.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from agent.core.gpu import Gpu
from agent.probes import gpu_fields_nvml as nv
from agent.probes.gpu_fields_nvml import AGGREGATE, CORRECTED, DRAM, UNCORRECTED, VOLATILE
from agent.probes.nvml_session import text as nvml_text
from agent.probes.nvsmi_values import add_optional, any_true, as_bool, as_int, clean, pstate, watts

Path = tuple[str, ...]


def first(values: list[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def single_else_sum(values: list[Any]) -> Any:
    """R550+ split one SRAM count into parity + SEC-DED: the one count, else the parts' sum."""
    return values[0] if values and values[0] is not None else add_optional(*values[1:])


def any_of(values: list[Any]) -> Any:
    return any_true(*values)


@dataclass(frozen=True)
class Field:
    name: str  # the model field's path: "pcie.width_current"
    text: tuple[Path, ...]  # -q section paths, in the order tried
    xml: tuple[str, ...]  # -q -x element paths, in the order tried
    cell: Callable[[str | None], Any]  # a printed cell → the model's value (both views)
    nvml: nv.Read | None  # how NVML reads it; None: not asked (why: `note`)
    join: Callable[[list[Any]], Any] = first  # the paths' values → one
    evidence: str | None = None  # the Gpu.where key its lines are evidence for
    fallback_text: tuple[Path, ...] = ()
    fallback_xml: tuple[str, ...] = ()
    note: str = ""


def _paths(spec: str | tuple[str, ...]) -> tuple[Path, ...]:
    return tuple(tuple(p.split(" / ")) for p in ((spec,) if isinstance(spec, str) else spec))


def row(
    name: str,
    text: str | tuple[str, ...],
    xml: str | tuple[str, ...],
    cell: Callable[[str | None], Any],
    nvml: nv.Read | None,
    *,
    fallback: tuple[str, str] | None = None,
    **kw: Any,
) -> Field:
    if fallback is not None:
        kw |= {"fallback_text": _paths(fallback[0]), "fallback_xml": (fallback[1],)}
    return Field(name, _paths(text), (xml,) if isinstance(xml, str) else xml, cell, nvml, **kw)


def _sram(scope: str) -> tuple[str, ...]:
    keys = ("SRAM Uncorrectable", "SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED")
    return tuple(f"ECC Errors / {scope} / {k}" for k in keys)


def _sram_xml(scope: str) -> tuple[str, ...]:
    keys = ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")
    return tuple(f"ecc_errors/{scope}/{k}" for k in keys)


def _reason(name: str, text: str, xml: str, bit: int, evidence: str | None = None) -> Field:
    return row(
        f"clock_events.{name}",
        tuple(f"{section} / ** / {text}" for section in ("Clocks Event Reasons", "Clocks Throttle Reasons")),
        tuple(f"clocks_{kind}_reasons/clocks_{kind}_reason_{xml}" for kind in ("event", "throttle")),
        as_bool,
        nv.clock_reason(bit),
        evidence=evidence,
    )


def _bucket(name: str) -> Field:
    return row(
        f"remapped_rows.histogram.{name.lower()}",
        f"Remapped Rows / Bank Remap Availability Histogram / {name}",
        f"remapped_rows/row_remapper_histogram/row_remapper_histogram_{name.lower()}",
        as_int,
        nv.histogram(name.lower()),
        evidence="remapped_rows.histogram",
    )


_POWER = ("GPU Power Readings", "Power Readings")  # the section's name from R530 on, and before
_POWER_XML = ("gpu_power_readings", "power_readings")
_LIMITS = ("Current", "Enforced")
_DRAWS = ("Average Power Draw", "Power Draw", "Instantaneous Power Draw")
_DRAWS_XML = ("average_power_draw", "power_draw", "instant_power_draw")
_NO_TLIMIT = "NVML is not asked for T.Limit temperatures (the reader never was)"

# Rows are in model order within a part, except where a Gpu.where key lists its lines in this order.
FIELDS: tuple[Field, ...] = (
    row("name", "Product Name", "product_name", clean,
        nv.get("nvmlDeviceGetName", then=nvml_text, basic=True), evidence="name"),
    row("uuid", "GPU UUID", "uuid", clean, nv.get("nvmlDeviceGetUUID", then=nvml_text, basic=True)),
    row("serial", "Serial Number", "serial", clean, nv.get("nvmlDeviceGetSerial", then=nvml_text)),
    row("architecture", "Product Architecture", "product_architecture", clean,
        nv.get("nvmlDeviceGetArchitecture", then=nv.architecture), note="-q -x prints it from DTD v12"),
    row("persistence_mode", "Persistence Mode", "persistence_mode", as_bool,
        nv.get("nvmlDeviceGetPersistenceMode", then=nv.is_one), evidence="persistence_mode"),
    row("mig_mode", "MIG Mode / Current", "mig_mode/current_mig", as_bool,
        nv.get("nvmlDeviceGetMigMode", then=nv.current_is_one)),
    # ECC: DRAM and SRAM counters from Ampere on, double/single-bit totals before.
    row("ecc.mode_enabled", "ECC Mode / Current", "ecc_mode/current_ecc", as_bool,
        nv.get("nvmlDeviceGetEccMode", then=nv.current_is_one)),
    row("ecc.volatile_dram_uncorrectable", "ECC Errors / Volatile / DRAM Uncorrectable",
        "ecc_errors/volatile/dram_uncorrectable", as_int, nv.ecc_location(UNCORRECTED, VOLATILE, DRAM),
        evidence="ecc.volatile_dram_uncorrectable"),
    row("ecc.volatile_sram_uncorrectable", _sram("Volatile"), _sram_xml("volatile"), as_int,
        nv.ecc_sram(UNCORRECTED, VOLATILE), join=single_else_sum, evidence="ecc.sram_uncorrectable"),
    row("ecc.aggregate_dram_uncorrectable", "ECC Errors / Aggregate / DRAM Uncorrectable",
        "ecc_errors/aggregate/dram_uncorrectable", as_int, nv.ecc_location(UNCORRECTED, AGGREGATE, DRAM)),
    row("ecc.aggregate_sram_uncorrectable", _sram("Aggregate"), _sram_xml("aggregate"), as_int,
        nv.ecc_sram(UNCORRECTED, AGGREGATE), join=single_else_sum, evidence="ecc.sram_uncorrectable"),
    row("ecc.volatile_sram_correctable", "ECC Errors / Volatile / SRAM Correctable",
        "ecc_errors/volatile/sram_correctable", as_int, nv.ecc_sram(CORRECTED, VOLATILE),
        evidence="ecc.volatile_correctable"),
    row("ecc.volatile_dram_correctable", "ECC Errors / Volatile / DRAM Correctable",
        "ecc_errors/volatile/dram_correctable", as_int, nv.ecc_location(CORRECTED, VOLATILE, DRAM),
        evidence="ecc.volatile_correctable"),
    row("ecc.aggregate_dram_correctable", "ECC Errors / Aggregate / DRAM Correctable",
        "ecc_errors/aggregate/dram_correctable", as_int, nv.ecc_location(CORRECTED, AGGREGATE, DRAM)),
    row("ecc.aggregate_sram_correctable", "ECC Errors / Aggregate / SRAM Correctable",
        "ecc_errors/aggregate/sram_correctable", as_int, nv.ecc_sram(CORRECTED, AGGREGATE)),
    row("ecc.sram_threshold_exceeded", "ECC Errors / Aggregate / SRAM Threshold Exceeded",
        "ecc_errors/aggregate/sram_threshold_exceeded", as_bool, None,
        evidence="ecc.sram_threshold_exceeded", note="NVML is not asked (the reader never was)"),
    row("ecc.volatile_double_bit_total", "ECC Errors / Volatile / Double Bit / Total",
        "ecc_errors/volatile/double_bit/total", as_int, nv.ecc_total(UNCORRECTED, VOLATILE),
        evidence="ecc.volatile_dram_uncorrectable"),
    row("ecc.aggregate_double_bit_total", "ECC Errors / Aggregate / Double Bit / Total",
        "ecc_errors/aggregate/double_bit/total", as_int, nv.ecc_total(UNCORRECTED, AGGREGATE)),
    row("ecc.volatile_single_bit_total", "ECC Errors / Volatile / Single Bit / Total",
        "ecc_errors/volatile/single_bit/total", as_int, nv.ecc_total(CORRECTED, VOLATILE),
        evidence="ecc.volatile_correctable"),
    # Page retirement (before Ampere); "Pending" is the pre-R4xx -q wording.
    row("retired_pages.single_bit", "Retired Pages / Single Bit ECC",
        "retired_pages/multiple_single_bit_retirement/retired_count", as_int,
        nv.get("nvmlDeviceGetRetiredPages", 0, then=nv.count_of), evidence="retired_pages.single_bit"),
    row("retired_pages.double_bit", "Retired Pages / Double Bit ECC",
        "retired_pages/double_bit_retirement/retired_count", as_int,
        nv.get("nvmlDeviceGetRetiredPages", 1, then=nv.count_of), evidence="retired_pages.double_bit"),
    row("retired_pages.pending", ("Retired Pages / Pending Page Blacklist",
        "Retired Pages / Pending Page Retirement", "Retired Pages / Pending"),
        ("retired_pages/pending_blacklist", "retired_pages/pending_retirement"), as_bool,
        nv.get("nvmlDeviceGetRetiredPagesPendingStatus", then=nv.is_one), join=any_of,
        evidence="retired_pages.pending"),
    # Row remapping (Ampere and later; N/A before, and with MIG).
    row("remapped_rows.correctable", "Remapped Rows / Correctable Error", "remapped_rows/remapped_row_corr",
        as_int, nv.remapped(0, int), evidence="remapped_rows.correctable"),
    row("remapped_rows.uncorrectable", "Remapped Rows / Uncorrectable Error",
        "remapped_rows/remapped_row_unc", as_int, nv.remapped(1, int)),
    row("remapped_rows.pending", "Remapped Rows / Pending", "remapped_rows/remapped_row_pending", as_bool,
        nv.remapped(2, bool), evidence="remapped_rows.pending"),
    row("remapped_rows.failure", "Remapped Rows / Remapping Failure Occurred",
        "remapped_rows/remapped_row_failure", as_bool, nv.remapped(3, bool),
        evidence="remapped_rows.failure"),
    *(_bucket(name) for name in ("Max", "High", "Partial", "Low", "None")),
    # Clock event reasons ("Clocks Throttle Reasons" before R535): -q text, -q -x, NVML mask bit.
    _reason("hw_slowdown", "HW Slowdown", "hw_slowdown", 0x8, "clock_events"),
    _reason("hw_thermal_slowdown", "HW Thermal Slowdown", "hw_thermal_slowdown", 0x40, "clock_events"),
    _reason("hw_power_brake", "HW Power Brake Slowdown", "hw_power_brake_slowdown", 0x80, "clock_events"),
    _reason("sw_power_cap", "SW Power Cap", "sw_power_cap", 0x4),
    _reason("sw_thermal_slowdown", "SW Thermal Slowdown", "sw_thermal_slowdown", 0x20),
    _reason("idle", "Idle", "gpu_idle", 0x1),
    _reason("applications_clocks_setting", "Applications Clocks Setting", "applications_clocks_setting", 0x2),
    _reason("sync_boost", "Sync Boost", "sync_boost", 0x10),
    _reason("display_clock_setting", "Display Clock Setting", "display_clocks_setting", 0x100),
    row("pcie.gen_current", "PCI / GPU Link Info / PCIe Generation / Current",
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen", as_int,
        nv.get("nvmlDeviceGetCurrPcieLinkGeneration")),
    row("pcie.gen_max", "PCI / GPU Link Info / PCIe Generation / Max",
        "pci/pci_gpu_link_info/pcie_gen/max_link_gen", as_int, nv.get("nvmlDeviceGetMaxPcieLinkGeneration")),
    row("pcie.width_current", "PCI / GPU Link Info / Link Width / Current",
        "pci/pci_gpu_link_info/link_widths/current_link_width", as_int,
        nv.get("nvmlDeviceGetCurrPcieLinkWidth"), evidence="pcie.width"),
    row("pcie.width_max", "PCI / GPU Link Info / Link Width / Max",
        "pci/pci_gpu_link_info/link_widths/max_link_width", as_int,
        nv.get("nvmlDeviceGetMaxPcieLinkWidth"), evidence="pcie.width"),
    row("pcie.replay_counter", "PCI / Replays Since Reset", "pci/replay_counter", as_int,
        nv.get("nvmlDeviceGetPcieReplayCounter")),
    # What the driver asks for (recovery action from R570; the reset status fields before).
    row("recovery_action", "GPU Recovery Action", "gpu_recovery_action", clean,
        nv.field("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", nv.recovery_action), evidence="recovery_action"),
    row("reset_required", "GPU Reset Status / Reset Required", "gpu_reset_status/reset_required", as_bool,
        nv.field("NVML_FI_DEV_RESET_STATUS", bool), evidence="recovery_action"),
    row("drain_and_reset_recommended", "GPU Reset Status / Drain and Reset Recommended",
        "gpu_reset_status/drain_and_reset_recommended", as_bool,
        nv.field("NVML_FI_DEV_DRAIN_AND_RESET_STATUS", bool), evidence="recovery_action"),
    row("fabric.state", "Fabric / State", "fabric/state", clean, nv.fabric(0), evidence="fabric"),
    row("fabric.status", "Fabric / Status", "fabric/status", clean, nv.fabric(1), evidence="fabric"),
    # Power: "Current Power Limit" from R530, "Enforced Power Limit" before.
    row("power.performance_state", "Performance State", "performance_state", pstate,
        nv.get("nvmlDeviceGetPerformanceState", then=nv.pstate), evidence="clocks"),
    row("power.enforced_limit_w", tuple(f"{s} / {k} Power Limit" for s in _POWER for k in _LIMITS),
        tuple(f"{s}/{k.lower()}_power_limit" for s in _POWER_XML for k in _LIMITS), watts,
        nv.get("nvmlDeviceGetEnforcedPowerLimit", then=nv.milliwatts)),
    row("power.default_limit_w", tuple(f"{s} / Default Power Limit" for s in _POWER),
        tuple(f"{s}/default_power_limit" for s in _POWER_XML), watts,
        nv.get("nvmlDeviceGetPowerManagementDefaultLimit", then=nv.milliwatts)),
    # The draw: "Average Power Draw" (1 s, R535+; what NVML's PowerUsage returns from Ampere on),
    # "Power Draw" before, the instantaneous one last. Never the memory's or the module's readings.
    row("power.draw_w", tuple(f"{s} / {k}" for s in _POWER for k in _DRAWS),
        tuple(f"{s}/{k}" for s in _POWER_XML for k in _DRAWS_XML), watts,
        nv.get("nvmlDeviceGetPowerUsage", then=nv.milliwatts), evidence="power.draw"),
    # Temperatures: Hopper and later print limits relative to T.Limit, older GPUs absolute ones.
    row("thermal.gpu_c", "Temperature / GPU Current Temp", "temperature/gpu_temp", as_int,
        nv.get("nvmlDeviceGetTemperature", 0, then=nv.positive), evidence="thermal"),
    row("thermal.gpu_tlimit_margin_c", "Temperature / GPU T.Limit Temp", "temperature/gpu_temp_tlimit",
        as_int, None, evidence="thermal", note=_NO_TLIMIT),
    row("thermal.gpu_slowdown_c", "Temperature / GPU Slowdown Temp", "temperature/gpu_temp_slow_threshold",
        as_int, nv.get("nvmlDeviceGetTemperatureThreshold", 1, then=nv.positive), evidence="thermal"),
    row("thermal.gpu_slowdown_tlimit_c", "Temperature / GPU Slowdown T.Limit Temp",
        "temperature/gpu_temp_slow_tlimit_threshold", as_int, None, evidence="thermal", note=_NO_TLIMIT),
    row("thermal.memory_c", "Temperature / Memory Current Temp", "temperature/memory_temp", as_int,
        nv.field("NVML_FI_DEV_MEMORY_TEMP", nv.positive), evidence="thermal"),
    row("thermal.memory_max_c", "Temperature / Memory Max Operating Temp",
        "temperature/gpu_temp_max_mem_threshold", as_int,
        nv.get("nvmlDeviceGetTemperatureThreshold", 2, then=nv.positive), evidence="thermal"),
    row("clocks.utilization_percent", "Utilization / Gpu", "utilization/gpu_util", as_int,
        nv.get("nvmlDeviceGetUtilizationRates", then=nv.percent), evidence="clocks"),
    row("clocks.sm_mhz", "Clocks / SM", "clocks/sm_clock", as_int,
        nv.get("nvmlDeviceGetClockInfo", 1, then=nv.positive), evidence="clocks"),
    row("clocks.applications_mhz", "Applications Clocks / Graphics", "applications_clocks/graphics_clock",
        as_int, nv.applications_clock, evidence="clocks",
        fallback=("Default Applications Clocks / Graphics", "default_applications_clocks/graphics_clock")),
    row("clocks.max_sm_mhz", "Max Clocks / SM", "max_clocks/sm_clock", as_int,
        nv.get("nvmlDeviceGetMaxClockInfo", 1, then=nv.positive)),
)  # fmt: skip
BY_NAME = {f.name: f for f in FIELDS}
# NVML's identity queries (with the PCI info): asked first; UNKNOWN on them means the GPU is lost.
_ASKED_FIRST = ("name", "uuid")

# The fields no row reads by value, and where each reader finds them.
IDENTITY = {
    "index": "nvidia-smi's enumeration order, lost GPUs keeping their slot (assign_indices); NVML's index",
    "pci_bus_id": "-q: the block's header 'GPU 00000000:53:00.0'; -q -x: <gpu id=...>, else "
    "pci/pci_bus_id; NVML: nvmlDeviceGetPciInfo().busId",
    "where": "the evidence lines: the text and XML readers collect them by the rows' `evidence` keys",
}


def where_paths(view: str) -> dict[str, tuple[Any, ...]]:
    """The paths of each Gpu.where key's lines, in row order, for view "text" or "xml"."""
    out: dict[str, tuple[Any, ...]] = {}
    for f in FIELDS:
        if f.evidence is not None:
            out[f.evidence] = out.get(f.evidence, ()) + (f.text if view == "text" else f.xml)
    return out


def read_view(lookup: Callable[[Any], str | None], view: str) -> dict[str, Any]:
    """Every row's value in one view: `lookup(path)` is the cell at a path (None: not printed)."""
    values: dict[str, Any] = {}
    for f in FIELDS:
        paths = f.text + f.fallback_text if view == "text" else f.xml + f.fallback_xml
        values[f.name] = f.join([f.cell(lookup(p)) for p in paths])
    return values


def read_nvml(device: nv.Device, after_identity: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Every row's value through NVML (a row NVML is not asked for stays out: the model's default).
    The identity queries come first, then `after_identity()` (the reader's say on going on)."""
    values = {f.name: f.nvml(device) for f in FIELDS if f.name in _ASKED_FIRST and f.nvml is not None}
    after_identity()
    for f in FIELDS:
        if f.nvml is not None and f.name not in _ASKED_FIRST:
            values[f.name] = f.nvml(device)
    return values


def model_parts(values: Mapping[str, Any], cls: type = Gpu, prefix: str = "") -> dict[str, Any]:
    """Keyword arguments of `cls` from the rows' values by path: a part (ecc, pcie, ...) is built from
    its rows, and a part the model allows to be None (retired_pages, fabric, ...) is None when none of
    its values was read (the view printed N/A or nothing)."""
    kwargs: dict[str, Any] = {}
    for name, (part, optional) in parts_of(cls).items():
        path = prefix + name
        if part is None:
            if path in values:
                kwargs[name] = values[path]
            continue
        inner = model_parts(values, part, path + ".")
        kwargs[name] = None if optional and all(v is None for v in inner.values()) else part(**inner)
    return kwargs


_PARTS_OF: dict[type, dict[str, tuple[Any, bool]]] = {}


def parts_of(cls: type) -> dict[str, tuple[Any, bool]]:
    """Each field of a model class: its part's class (None: a value) and whether it may be None."""
    if cls not in _PARTS_OF:
        hints = typing.get_type_hints(cls)
        out: dict[str, tuple[Any, bool]] = {}
        for f in fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            part = next((a for a in args if isinstance(a, type) and is_dataclass(a)), None)
            out[f.name] = (part, type(None) in args)
        _PARTS_OF[cls] = out
    return _PARTS_OF[cls]
