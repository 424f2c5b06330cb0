"""The reads that the trend warnings judge (checks/trends.py): per GPU, a handful of counters and
levels taken from inputs the tiers already read, kept at most every `trends.readSpacingSeconds`, the
last `trends.keepReads` of them, in the results annotation so that an agent restart keeps them.

A read is one row per GPU (by its lasting name: serial, else UUID, else PCI address, so a replaced
board starts afresh), in COLUMNS order; None is "not read", never zero. Counters come in two kinds:
volatile ones start again at zero when the driver reloads or the node reboots (ECC since driver
load, NVLink errors, AER), persistent ones live in the GPU's InfoROM (remapped rows, retired
pages). A trend is judged on a run: the trailing reads of one continuous count (RUN below), so a
reset never looks like growth, nor like negative growth, and a read that is missing never counts.

Pure: the engine calls take_read and advance on each gpu-tier run, `check` on its one read
(probes/source.with_read); both hand the checks the history with this read in it (when it was due).
The checks judge it in runs (checks/trend_series.py).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.gpu import Gpu, GpuInventory
from agent.core.nvlink import NvlinkErrorSample
from agent.core.pci import PciSample
from agent.core.probed import Probed

TRENDS_FIELD = "trends"  # the results annotation's key
CHECK_PREFIX = "trend."  # every trend check's name starts so (metrics count their GPUs per rule)
VERSION = 1

# The columns of a row. Counters: CE (volatile correctable ECC errors: SRAM + DRAM, or the
# single-bit total before Ampere), REMAP (rows remapped for correctable errors), PAGES (single-bit
# retired pages), NVLINK (CRC flit + CRC data + replay errors over the active links), AER
# (correctable PCIe errors at both ends of the GPU's link). Levels: GPU_MARGIN and MEM_MARGIN
# (degrees left before slowdown), CLOCK (how far, in %, the SM clock runs below the application
# clock while the GPU is busy and no clock event reason explains it; 0 when it does not).
COLUMNS = ("ce", "remap", "pages", "nvlink", "aer", "gpu_margin", "mem_margin", "clock")
CE, REMAP, PAGES, NVLINK, AER, GPU_MARGIN, MEM_MARGIN, CLOCK = range(len(COLUMNS))
VOLATILE = frozenset({CE, NVLINK, AER})
COUNTERS = (CE, REMAP, PAGES, NVLINK, AER)
NVLINK_COUNTERS = ("crc_flit", "crc_data", "replay")  # link recovery: nvlink-errors judges any

Row = tuple[int | None, ...]


@dataclass(frozen=True)
class Read:
    """One kept read: its time (epoch seconds), the boot it was taken in (the first 8 characters of
    the boot id, "" unknown) and a row per GPU."""

    at: int
    boot: str
    gpus: Mapping[str, Row] = field(default_factory=dict)


@dataclass(frozen=True)
class TrendHistory:
    """Immutable: a new one when a read is kept (advance), so what is derived from it (each GPU's
    series, the annotation form, the digest) is computed once per kept read, not per cycle."""

    reads: tuple[Read, ...] = ()

    @property
    def latest(self) -> Read | None:
        return self.reads[-1] if self.reads else None

    @functools.cached_property
    def series(self) -> Mapping[str, tuple[tuple[Point, ...], ...]]:
        """GPU (of the latest read) → per column, its points in the reads that have it."""
        out: dict[str, tuple[tuple[Point, ...], ...]] = {}
        for name in self.latest.gpus if self.latest is not None else ():
            rows = [(r.at, r.boot, r.gpus[name]) for r in self.reads if name in r.gpus]
            out[name] = tuple(
                tuple(Point(at, boot, row[c]) for at, boot, row in rows) for c in range(len(COLUMNS))
            )
        return out

    @functools.cached_property
    def memo(self) -> dict[Hashable, Any]:
        """What the checks derive from this history, kept with it (checks/trend_series.run_of): a
        history is judged every cycle and changes once a spacing."""
        return {}

    @functools.cached_property
    def doc(self) -> dict[str, Any] | None:
        return _to_doc(self)

    @functools.cached_property
    def digest(self) -> str:
        return _digest(self)


@dataclass(frozen=True)
class Point:
    at: int
    boot: str
    value: int | None


# --------------------------------------------------------------------------- taking a read


def boot_tag(boot_id: str | None) -> str:
    return (boot_id or "")[:8]


def _nvlink_totals(sample: Any) -> dict[str, int]:
    """normalised PCI → CRC + replay errors summed over the GPU's active links (absent: no link)."""
    if not isinstance(sample, NvlinkErrorSample):
        return {}
    out: dict[str, int] = {}
    for g in sample.gpus:
        if g.links:
            out[g.pci_bus_id] = sum(c.get(k, 0) for c in g.links.values() for k in NVLINK_COUNTERS)
    return out


def aer_correctable(sample: Any, pci: str) -> int | None:
    """Correctable AER errors at both ends of the GPU's link (the GPU and the port above it)."""
    if not isinstance(sample, PciSample):
        return None
    by_addr = sample.by_address()
    dev = by_addr.get(pci)
    if dev is None or "correctable" not in dev.aer:
        return None
    total = _cor(dev.aer["correctable"])
    up = by_addr.get(dev.upstream) if dev.upstream else None
    if up is not None and "correctable" in up.aer:
        total += _cor(up.aer["correctable"])
    return total


def _cor(counters: Mapping[str, int]) -> int:
    return counters.get("TOTAL_ERR_COR", sum(counters.values()))


def clock_shortfall(g: Gpu, busy_percent: float) -> int | None:
    """How far (%) the SM clock runs below the application clock while the GPU is busy (P0, at
    least busy_percent utilization) and no clock event reason is active; 0 when the GPU is not
    busy or a reason explains it; None when a value it needs is not reported."""
    c, reasons = g.clocks, g.clock_events.active()
    state = g.power.performance_state
    if c.utilization_percent is None or state is None:
        return None
    if state != "P0" or c.utilization_percent < busy_percent:
        return 0
    if reasons is None or c.sm_mhz is None or not c.applications_mhz:
        return None
    if reasons:
        return 0
    return max(0, round((c.applications_mhz - c.sm_mhz) * 100 / c.applications_mhz))


def gpu_row(g: Gpu, nvlink: Mapping[str, int], pci: Any, busy_percent: float) -> Row:
    rows, pages = g.remapped_rows, g.retired_pages
    return (
        g.ecc.volatile_correctable if g.ecc.mode_enabled is not False else None,
        rows.correctable if rows is not None else None,
        pages.single_bit if pages is not None and rows is None else None,
        nvlink.get(g.pci_bus_id),
        aer_correctable(pci, g.pci_bus_id),
        g.thermal.gpu_margin_c,
        g.thermal.memory_margin_c,
        clock_shortfall(g, busy_percent),
    )


def take_read(
    gpus: Probed[GpuInventory],
    nvlink_errors: Probed[NvlinkErrorSample],
    pci: Probed[PciSample],
    boot_id: str | None,
    now: float,
    busy_percent: float,
) -> Read | None:
    """This cycle's read, from the inputs as their tiers last read them; None when the GPU list
    could not be read whole (a trend is never built on a read that is not one)."""
    if not isinstance(gpus, GpuInventory) or not gpus.gpus:
        return None
    nvlink = _nvlink_totals(nvlink_errors)
    rows = {g.lasting_name: gpu_row(g, nvlink, pci, busy_percent) for g in gpus.gpus}
    return Read(int(now), boot_tag(boot_id), rows)


def advance(history: TrendHistory, read: Read | None, spacing_s: float, keep: int) -> TrendHistory:
    """The history with this read kept when one is due (none kept yet, or spacing_s since the last),
    bounded to the last `keep` reads. Reads stamped after `read` (the clock went back) are dropped."""
    reads = history.reads
    if read is not None:
        reads = tuple(r for r in reads if r.at <= read.at)
        if not reads or read.at - reads[-1].at >= spacing_s:
            reads = (*reads, read)
    reads = reads[-max(keep, 1) :]
    return history if reads == history.reads else TrendHistory(reads)


# --------------------------------------------------------------------------- the annotation


def to_doc(history: TrendHistory) -> dict[str, Any] | None:
    """The history as the results annotation holds it: read times, boots, and per GPU one row per
    read (null where the GPU was not in that read; trailing nulls of a row left out). A new dict
    each call (results_doc.fit may drop reads from it); its lists are shared, never changed."""
    doc = history.doc
    return dict(doc) if doc is not None else None


def _to_doc(history: TrendHistory) -> dict[str, Any] | None:
    if not history.reads:
        return None
    gpus: dict[str, list[list[int | None] | None]] = {}
    for r in history.reads:
        for name in r.gpus:
            gpus.setdefault(name, [])
    for name, rows in gpus.items():
        for r in history.reads:
            row = r.gpus.get(name)
            if row is None:
                rows.append(None)
                continue
            values = list(row)
            while values and values[-1] is None:
                values.pop()
            rows.append(values)
    return {
        "v": VERSION,
        "t": [r.at for r in history.reads],
        "b": [r.boot for r in history.reads],
        "g": gpus,
    }


def drop_oldest_read(doc: dict[str, Any]) -> bool:
    """Drop the oldest read from a to_doc document in place (the annotation is over its size
    limit); False when two or fewer are left (then the caller drops it whole)."""
    times = doc.get("t")
    if not isinstance(times, list) or len(times) <= 2:
        return False
    for key in ("t", "b"):
        doc[key] = doc[key][1:]
    doc["g"] = {name: rows[1:] for name, rows in doc["g"].items() if any(r is not None for r in rows[1:])}
    return True


def _value(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse(doc: Any) -> TrendHistory:
    """to_doc's inverse; an empty history for anything that is not one (another version included):
    the reads start again rather than be misread."""
    if not isinstance(doc, Mapping) or doc.get("v") != VERSION:
        return TrendHistory()
    times, boots, gpus = doc.get("t"), doc.get("b"), doc.get("g")
    if not (isinstance(times, list) and isinstance(boots, list) and isinstance(gpus, Mapping)):
        return TrendHistory()
    if len(times) != len(boots) or not all(_value(t) is not None for t in times):
        return TrendHistory()
    rows: list[dict[str, Row]] = [{} for _ in times]
    for name, series in gpus.items():
        if not isinstance(series, list) or len(series) != len(times):
            return TrendHistory()
        for i, row in enumerate(series):
            if isinstance(row, list) and len(row) <= len(COLUMNS):
                values = [_value(v) for v in row]
                rows[i][str(name)] = tuple(values + [None] * (len(COLUMNS) - len(values)))
    return TrendHistory(tuple(Read(int(t), str(b), r) for t, b, r in zip(times, boots, rows, strict=True)))


def counters_digest(history: TrendHistory) -> str:
    """What of the history must reach the Node: each GPU's counters as runs of equal values (with
    the boot, for a volatile one), without the read times or the levels. A kept read whose counters
    did not move changes nothing here, so a healthy node costs no write for its trends; a moving
    counter, a reboot or a new GPU does (at most once a read), so that a restart finds it."""
    return history.digest


def _digest(history: TrendHistory) -> str:
    parts: list[str] = []
    names = sorted({n for r in history.reads for n in r.gpus})
    for name in names:
        for col in COUNTERS:
            last: tuple[str, int | None] | None = None
            seq: list[str] = [name, COLUMNS[col]]
            for r in history.reads:
                row = r.gpus.get(name)
                if row is None:
                    continue
                item = (r.boot if col in VOLATILE else "", row[col])
                if item != last:
                    seq.append(f"{item[0]}:{item[1]}")
                    last = item
            parts.append(",".join(seq))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
