"""The series a trend warning is judged on (checks/trends.py): a GPU's points in one column of the
kept reads (core/trend_history.py), cut to the run that is one continuous count, and how they are
shown as evidence. Only the checks judge the reads, so these helpers live beside them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.findings import Evidence
from agent.core.gpu import Gpu
from agent.core.trend_history import VOLATILE, Point, TrendHistory

KEPT = "kept reads"  # the evidence's source: the reads kept in the results annotation


def points(history: TrendHistory, gpu: str, column: int) -> tuple[Point, ...]:
    """The GPU's value in each kept read that has it, oldest first; none unless the latest read has
    the GPU (a GPU that did not answer now has no trend now)."""
    columns = history.series.get(gpu)
    return columns[column] if columns is not None else ()


def run(pts: Sequence[Point], *, counter: bool, volatile: bool = False, max_gap_s: float) -> list[Point]:
    """The trailing points that are one continuous series: values read (None ends it), no gap longer
    than max_gap_s between two reads, and for a counter no decrease (a reset by a driver reload, a
    reboot or a new board) and, for a volatile counter, one boot."""
    out: list[Point] = []
    for p in reversed(pts):
        if p.value is None:
            break
        if out:
            after = out[-1]
            assert after.value is not None
            if after.at - p.at > max_gap_s:
                break
            if counter and p.value > after.value:
                break
            if volatile and (p.boot != after.boot or not p.boot):
                break
        out.append(p)
    out.reverse()
    return out


def run_of(
    history: TrendHistory, gpu: str, column: int, *, counter: bool, max_gap_s: float
) -> tuple[Point, ...]:
    """run() of the GPU's points in a column, remembered with the history (TrendHistory.memo)."""
    key = ("run", gpu, column, counter, max_gap_s)
    found: tuple[Point, ...] | None = history.memo.get(key)
    if found is None:
        pts = points(history, gpu, column)
        found = tuple(run(pts, counter=counter, volatile=column in VOLATILE, max_gap_s=max_gap_s))
        history.memo[key] = found
    return found


def hours(seconds: float) -> str:
    """ "45 min", "2.5 h"."""
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def per_hour(first: Point, last: Point) -> float:
    assert first.value is not None and last.value is not None
    span = last.at - first.at
    return (last.value - first.value) * 3600 / span if span > 0 else 0.0


def describe(pts: Sequence[Point], unit: str = "") -> str:
    """The reads as evidence: "10:00Z 12 · 10:15Z 15 · 10:30Z 19"."""
    return " · ".join(
        f"{datetime.fromtimestamp(p.at, timezone.utc).strftime('%H:%MZ')} {p.value}{unit}" for p in pts
    )


def steady(pts: Sequence[Point], intervals: int) -> list[Point] | None:
    """The last intervals + 1 points when the count grew in each interval, else None."""
    if len(pts) < intervals + 1:
        return None
    tail = list(pts[-(intervals + 1) :])
    grew = all(
        b.value is not None and a.value is not None and b.value > a.value for a, b in itertools.pairwise(tail)
    )
    return tail if grew else None


def last(pts: Sequence[Point], n: int, ok: Callable[[int], bool]) -> list[Point] | None:
    """The last n points when each one's value passes ok, else None."""
    if len(pts) < n:
        return None
    last = list(pts[-n:])
    return last if all(p.value is not None and ok(p.value) for p in last) else None


def max_gap(cfg: Config) -> float:
    """Two kept reads further apart than this are not one series (an agent down, a read missed)."""
    return 2.5 * max(cfg.trends.read_spacing_s, cfg.intervals.gpu)


def series(facts: NodeFacts, cfg: Config, g: Gpu, column: int, *, counter: bool) -> tuple[Point, ...]:
    return run_of(facts.trends, g.lasting_name, column, counter=counter, max_gap_s=max_gap(cfg))


def span(pts: Sequence[Point]) -> str:
    return hours(pts[-1].at - pts[0].at)


def kept(what: str, pts: Sequence[Point], unit: str = "") -> Evidence:
    return Evidence(KEPT, None, f"{what}: {describe(pts, unit)}")


def lines(source: str, g: Gpu, where: str) -> tuple[Evidence, ...]:
    """The input's lines that state the values (nvidia-smi), else the values as read (NVML has no
    lines to point at)."""
    found = g.where.get(where, ())
    if found:
        return Evidence.of(source, found)
    return (Evidence(source, None, _stated(g, where)),)


def _stated(g: Gpu, where: str) -> str:
    rows, pages, e, th, c = g.remapped_rows, g.retired_pages, g.ecc, g.thermal, g.clocks
    if where == "remapped_rows.histogram" and rows is not None and rows.histogram is not None:
        h = rows.histogram
        buckets = {"max": h.max, "high": h.high, "partial": h.partial, "low": h.low, "none": h.none}
        return "bank remap histogram: " + ", ".join(f"{k} {v}" for k, v in buckets.items())
    if where == "remapped_rows.correctable" and rows is not None:
        return f"rows remapped for correctable errors: {rows.correctable}"
    if where == "ecc.volatile_correctable":
        sram, dram = e.volatile_sram_correctable, e.volatile_dram_correctable
        return f"volatile correctable ECC: SRAM {sram}, DRAM {dram}, single-bit {e.volatile_single_bit_total}"
    if where.startswith("retired_pages") and pages is not None:
        return f"retired pages: single-bit {pages.single_bit}, double-bit {pages.double_bit}"
    if where == "thermal":
        gpu, mem = f"GPU {th.gpu_c} C, slowdown {th.gpu_slowdown_c} C", f"memory {th.memory_c} C"
        return f"{gpu}; {mem}, max {th.memory_max_c} C"
    if where == "clocks":
        state, reasons = g.power.performance_state, g.clock_events.active()
        busy = f"{state}, utilization {c.utilization_percent} %"
        clock = f"SM {c.sm_mhz} MHz, application {c.applications_mhz} MHz"
        return f"{busy}, {clock}, clock event reasons: {', '.join(reasons) if reasons else 'none'}"
    return where
