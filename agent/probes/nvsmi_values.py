"""Cell values as nvidia-smi prints them ("16x", "36 C", "700.00 W", "N/A", "[Not Supported]",
"Active"), turned into Python values the same way for the XML and the text parser (the `cell` of each
row of agent.probes.gpu_fields), so both give identical models."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from agent.core.gpu import Gpu, LostGpu

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
_WATTS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*W\s*$")
_PSTATE = re.compile(r"^P([0-9]{1,2})$")


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


def watts(raw: str | None) -> float | None:
    """ "700.00 W" → 700.0; "N/A", "[N/A]", "Unknown Error" → None."""
    m = _WATTS.match(raw or "")
    return float(m.group(1)) if m else None


def pstate(raw: str | None) -> str | None:
    """A performance state "P0".."P15"; anything else → None."""
    text = (raw or "").strip()
    return text if _PSTATE.match(text) else None


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
