"""Cell values as nvidia-smi prints them ("16x", "36 C", "N/A", "[Not Supported]", "Active"), turned
into Python values the same way for the XML and the text parser, so both give identical models."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from agent.core.model import Fabric, Gpu, LostGpu, RemappedRows, RetiredPages

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
    corr: int | None, unc: int | None, pending: bool | None, failure: bool | None
) -> RemappedRows | None:
    if corr is None and unc is None and pending is None and failure is None:
        return None
    return RemappedRows(correctable=corr, uncorrectable=unc, pending=pending, failure=failure)


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
