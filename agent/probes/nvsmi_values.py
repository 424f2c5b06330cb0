"""Cell values as nvidia-smi prints them ("16x", "36 C", "N/A", "[Not Supported]", "Active"), turned
into Python values the same way for the XML and the text parser, so both give identical models."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from agent.core.gpu import Fabric, Gpu, LostGpu, RemapHistogram, RemappedRows, RetiredPages

# Where each judged value is printed, by Gpu.where key (a model field path): the -q section path and
# the -q -x element path of each line or element that can hold it.
WHERE_TEXT: dict[str, tuple[tuple[str, ...], ...]] = {
    "name": (("Product Name",),),
    "ecc.volatile_dram_uncorrectable": (
        ("ECC Errors", "Volatile", "DRAM Uncorrectable"),
        ("ECC Errors", "Volatile", "Double Bit", "Total"),
    ),
    "ecc.sram_uncorrectable": tuple(
        ("ECC Errors", scope, key)
        for scope in ("Volatile", "Aggregate")
        for key in ("SRAM Uncorrectable", "SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED")
    ),
    "ecc.sram_threshold_exceeded": (("ECC Errors", "Aggregate", "SRAM Threshold Exceeded"),),
    "remapped_rows.failure": (("Remapped Rows", "Remapping Failure Occurred"),),
    "remapped_rows.pending": (("Remapped Rows", "Pending"),),
    "retired_pages.double_bit": (("Retired Pages", "Double Bit ECC"),),
    "retired_pages.single_bit": (("Retired Pages", "Single Bit ECC"),),
    "retired_pages.pending": (
        ("Retired Pages", "Pending Page Blacklist"),
        ("Retired Pages", "Pending Page Retirement"),
        ("Retired Pages", "Pending"),
    ),
    "recovery_action": (
        ("GPU Recovery Action",),
        ("GPU Reset Status", "Reset Required"),
        ("GPU Reset Status", "Drain and Reset Recommended"),
    ),
    "pcie.width": (
        ("PCI", "GPU Link Info", "Link Width", "Current"),
        ("PCI", "GPU Link Info", "Link Width", "Max"),
    ),
    "persistence_mode": (("Persistence Mode",),),
    "fabric": (("Fabric", "State"), ("Fabric", "Status")),
    # What the trend warnings (checks/trends.py) rest on.
    "remapped_rows.correctable": (("Remapped Rows", "Correctable Error"),),
    "remapped_rows.histogram": tuple(
        ("Remapped Rows", "Bank Remap Availability Histogram", k)
        for k in ("Max", "High", "Partial", "Low", "None")
    ),
    "ecc.volatile_correctable": (
        ("ECC Errors", "Volatile", "SRAM Correctable"),
        ("ECC Errors", "Volatile", "DRAM Correctable"),
        ("ECC Errors", "Volatile", "Single Bit", "Total"),
    ),
    "thermal": (
        ("Temperature", "GPU Current Temp"),
        ("Temperature", "GPU T.Limit Temp"),
        ("Temperature", "GPU Slowdown Temp"),
        ("Temperature", "GPU Slowdown T.Limit Temp"),
        ("Temperature", "Memory Current Temp"),
        ("Temperature", "Memory Max Operating Temp"),
    ),
    "clocks": (
        ("Performance State",),
        ("Utilization", "Gpu"),
        ("Clocks", "SM"),
        ("Applications Clocks", "Graphics"),
    ),
}
WHERE_XML: dict[str, tuple[str, ...]] = {
    "name": ("product_name",),
    "ecc.volatile_dram_uncorrectable": (
        "ecc_errors/volatile/dram_uncorrectable",
        "ecc_errors/volatile/double_bit/total",
    ),
    "ecc.sram_uncorrectable": tuple(
        f"ecc_errors/{scope}/{key}"
        for scope in ("volatile", "aggregate")
        for key in ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")
    ),
    "ecc.sram_threshold_exceeded": ("ecc_errors/aggregate/sram_threshold_exceeded",),
    "remapped_rows.failure": ("remapped_rows/remapped_row_failure",),
    "remapped_rows.pending": ("remapped_rows/remapped_row_pending",),
    "retired_pages.double_bit": ("retired_pages/double_bit_retirement/retired_count",),
    "retired_pages.single_bit": ("retired_pages/multiple_single_bit_retirement/retired_count",),
    "retired_pages.pending": ("retired_pages/pending_blacklist", "retired_pages/pending_retirement"),
    "recovery_action": (
        "gpu_recovery_action",
        "gpu_reset_status/reset_required",
        "gpu_reset_status/drain_and_reset_recommended",
    ),
    "pcie.width": (
        "pci/pci_gpu_link_info/link_widths/current_link_width",
        "pci/pci_gpu_link_info/link_widths/max_link_width",
    ),
    "persistence_mode": ("persistence_mode",),
    "fabric": ("fabric/state", "fabric/status"),
    "remapped_rows.correctable": ("remapped_rows/remapped_row_corr",),
    "remapped_rows.histogram": tuple(
        f"remapped_rows/row_remapper_histogram/row_remapper_histogram_{k}"
        for k in ("max", "high", "partial", "low", "none")
    ),
    "ecc.volatile_correctable": (
        "ecc_errors/volatile/sram_correctable",
        "ecc_errors/volatile/dram_correctable",
        "ecc_errors/volatile/single_bit/total",
    ),
    "thermal": (
        "temperature/gpu_temp",
        "temperature/gpu_temp_tlimit",
        "temperature/gpu_temp_slow_threshold",
        "temperature/gpu_temp_slow_tlimit_threshold",
        "temperature/memory_temp",
        "temperature/gpu_temp_max_mem_threshold",
    ),
    "clocks": (
        "performance_state",
        "utilization/gpu_util",
        "clocks/sm_clock",
        "applications_clocks/graphics_clock",
    ),
}

# Cells that mean "the tool did not say": never zero, never False.
_ABSENT = {
    "",
    "n/a",
    "[n/a]",
    "na",
    "not supported",
    "[not supported]",
    "requested functionality has been deprecated",
    "unknown",
    "[unknown]",
    "unknown error",
    "[unknown error]",
    "insufficient permissions",
    "[insufficient permissions]",
}
_TRUE = {"yes", "enabled", "active", "true", "on"}
_FALSE = {"no", "disabled", "not active", "false", "off"}
_INT = re.compile(r"^[+-]?\d+")


def clean(raw: str | None) -> str | None:
    """Collapse odd whitespace (tabs, newlines inside XML text); None for the absent markers."""
    if raw is None:
        return None
    text = " ".join(raw.split())
    if text.lower() in _ABSENT:
        return None
    return text


def as_int(raw: str | None) -> int | None:
    """Leading integer of a cell ("16x" → 16, "120" → 120); None when absent or not a number."""
    text = clean(raw)
    if text is None:
        return None
    match = _INT.match(text)
    return int(match.group(0)) if match else None


def as_bool(raw: str | None) -> bool | None:
    """Yes/No, Enabled/Disabled, Active/Not Active → bool; anything else → None."""
    text = clean(raw)
    if text is None:
        return None
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    return None


def add_optional(*values: int | None) -> int | None:
    """Sum of the values that are present; None when none is (SRAM parity + SEC-DED)."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def any_true(*values: bool | None) -> bool | None:
    """True if one is True, False if one is False and none True, else None."""
    if any(v is True for v in values):
        return True
    if any(v is False for v in values):
        return False
    return None


def retired_pages_or_none(
    single: int | None, double: int | None, pending: bool | None
) -> RetiredPages | None:
    if single is None and double is None and pending is None:
        return None
    return RetiredPages(single_bit=single, double_bit=double, pending=pending)


def remapped_rows_or_none(
    corr: int | None,
    unc: int | None,
    pending: bool | None,
    failure: bool | None,
    histogram: RemapHistogram | None = None,
) -> RemappedRows | None:
    if corr is None and unc is None and pending is None and failure is None and histogram is None:
        return None
    return RemappedRows(
        correctable=corr, uncorrectable=unc, pending=pending, failure=failure, histogram=histogram
    )


def histogram_or_none(
    max_: int | None, high: int | None, partial: int | None, low: int | None, none: int | None
) -> RemapHistogram | None:
    """The bank remap availability histogram; None when no bucket is reported."""
    if all(v is None for v in (max_, high, partial, low, none)):
        return None
    return RemapHistogram(max=max_, high=high, partial=partial, low=low, none=none)


def fabric_or_none(state: str | None, status: str | None) -> Fabric | None:
    if state is None and status is None:
        return None
    return Fabric(state=state, status=status)


def assign_indices(gpus: Sequence[Gpu], lost: Sequence[LostGpu]) -> tuple[Gpu, ...]:
    """nvidia-smi's index is the enumeration (PCI bus) order, and a lost GPU keeps its slot in it.

    Without lost GPUs the index is the document order. With lost GPUs whose PCI ids are known, and
    GPU blocks printed in PCI order (as nvidia-smi does), a GPU's index is its rank among all of
    them, so "GPU 5" in a message is the GPU nvidia-smi calls 5. Otherwise document order.
    """
    pcis = [g.pci_bus_id for g in gpus]
    lost_pcis = [lg.pci_bus_id for lg in lost]
    if lost_pcis and all(p is not None for p in lost_pcis) and pcis == sorted(pcis):
        order = sorted({*pcis, *(p for p in lost_pcis if p is not None)})
        rank = {p: i for i, p in enumerate(order)}
        return tuple(replace(g, index=rank[g.pci_bus_id]) for g in gpus)
    return tuple(replace(g, index=i) for i, g in enumerate(gpus))
