"""Warnings before the fault: trends that predict a failing GPU, at `monitor` (never a taint), each
with its evidence, its rate and a next step of `plan-service` (it still works, plan its repair) or
`watch`. Each is a rule with its own severity knob (`none` or `monitor`) and its own threshold under
`trends:` in config.yaml, both live.

They read the kept reads (agent.core.trend_history: one row per GPU every `trends.readSpacingSeconds`,
kept across agent restarts in the results annotation) and, for the two that are levels, the GPU
list as read now. A trend is judged only on a run of reads that are one continuous count: a read
missing or unreadable, a gap, a reboot or driver reload (for counters that start again) or a
decrease ends it, so a reset never looks like growth and a missing read never counts. Judged on
kept reads only, a warning (and its message) changes when a read is kept, not on every cycle.

Thresholds and their sources (docs/checks.md "Warnings before a fault"):
- remap headroom: a bank at Low or None spare-row availability (NVML: "None means that there are no
  reserved rows available"; NVIDIA's memory error management guide: a remap that cannot be made is
  a row-remapping failure, an RMA condition) → plan-service.
- remapped rows growing, ECC correctable rate, NVLink and PCIe growing steadily, thermal margin and
  clock: our reasoning, stated at each threshold in config/config.yaml.
- retired pages: NVIDIA's page retirement limit of 64 pages per GPU (memory error management guide).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from agent.checks import CheckSpec, gpu_finding, typed_input
from agent.checks import trend_series as ts
from agent.config import Config
from agent.core import trend_history
from agent.core.actions import Action
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.nvlink import NvlinkErrorSample
from agent.core.pci import PciSample, short_pci
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.trend_history import Point

MEMORY, NVLINK, THERMAL, PCIE = "trend.memory", "trend.nvlink", "trend.thermal", "trend.pcie"
NVIDIA_PAGE_LIMIT = 64  # pages a GPU can retire (NVIDIA's memory error management guide)


def _rule(name: str, text: str, action: Action) -> Rule:
    return Rule(name, Severity.MONITOR, text, action, max_severity=Severity.MONITOR)


REMAP_HEADROOM = _rule(
    "trend.memory.remap-headroom",
    "DRAM banks at Low or None spare-row availability: a new error there may not be remappable",
    Action.PLAN_SERVICE,
)
REMAP_GROWTH = _rule("trend.memory.remap-growth", "rows remapped for correctable errors grow", Action.WATCH)
ECC_RATE = _rule(
    "trend.memory.ecc-rate",
    "volatile correctable ECC errors grow faster than the configured rate",
    Action.WATCH,
)
RETIRED_PAGES = _rule(
    "trend.memory.retired-pages",
    "retired pages near NVIDIA's limit of 64 (before Ampere)",
    Action.PLAN_SERVICE,
)
NVLINK_GROWING = _rule(
    "trend.nvlink.errors-growing",
    "NVLink CRC and replay errors grew in each of the last reads (hours)",
    Action.PLAN_SERVICE,
)
NEAR_SLOWDOWN = _rule(
    "trend.thermal.near-slowdown",
    "GPU or memory temperature within the margin of its slowdown threshold in each of the last reads",
    Action.WATCH,
)
CLOCK_STUCK = _rule(
    "trend.thermal.clock-stuck",
    "SM clock below the application clock while busy, with no clock event reason, in each of the last reads",
    Action.WATCH,
)
AER_GROWING = _rule(
    "trend.pcie.errors-growing",
    "correctable PCIe (AER) errors on a GPU's link grew in each of the last reads (hours)",
    Action.PLAN_SERVICE,
)


@dataclass(frozen=True)
class Warn:
    rule: Rule
    message: str
    rate: str
    evidence: tuple[Evidence, ...]


Judge = Callable[[Gpu], Iterable[Warn]]


def _judge(
    name: str,
    facts: NodeFacts,
    cfg: Config,
    judge: Judge,
    applies: Callable[[Gpu], bool],
    not_applicable: str,
    ok: str,
) -> CheckResult:
    """judge(gpu) over the GPUs the check applies to. The GPU list must have been read whole: this
    cycle's read is then among the kept ones (when due); a damaged capture gives no read, and no
    warning, only `unknown`."""
    inv = typed_input(name, facts.gpus, GpuInventory)
    if isinstance(inv, CheckResult):
        return inv
    gpus = [g for g in inv.gpus if applies(g)]
    if not inv.gpus:
        return CheckResult(name, skipped="no GPU visible")
    if not gpus:
        return CheckResult(name, skipped=not_applicable)
    findings: list[Finding] = []
    for g in gpus:
        for w in judge(g):
            f = gpu_finding(cfg, name, w.rule, f"{g.label}: {w.message}", g, w.evidence)
            findings.append(replace(f, rate=w.rate))
    first = " (one read kept so far: rates from the next)" if len(facts.trends.reads) < 2 else ""
    return CheckResult(name, findings=tuple(findings), note=f"{len(gpus)} GPU(s): {ok}{first}")


# --------------------------------------------------------------------------- memory


def _growth(pts: Sequence[Point]) -> int:
    assert pts[0].value is not None and pts[-1].value is not None
    return pts[-1].value - pts[0].value


def _remap_headroom(facts: NodeFacts, cfg: Config, g: Gpu, source: str) -> Iterable[Warn]:
    hist = g.remapped_rows.histogram if g.remapped_rows is not None else None
    if hist is None or hist.low is None or hist.none is None:
        return
    short = hist.low + hist.none
    if short < cfg.trends.remap_banks_low:
        return
    msg = (
        f"{hist.low} DRAM bank(s) at Low and {hist.none} at None spare-row availability (of "
        f"{hist.banks}): a new uncorrectable error there may not be remappable"
    )
    rate, evidence = f"{short} bank(s) low", ts.lines(source, g, "remapped_rows.histogram")
    rows = ts.series(facts, cfg, g, trend_history.REMAP, counter=True)
    if len(rows) >= 2:
        grew = _growth(rows)
        rate = (
            f"+{grew} remapped rows in {ts.span(rows)}" if grew else f"no new remapped row in {ts.span(rows)}"
        )
        msg += f"; {rate}"
        evidence = (*evidence, ts.kept("rows remapped for correctable errors", rows))
    yield Warn(REMAP_HEADROOM, msg, rate, evidence)


def _remap_growth(facts: NodeFacts, cfg: Config, g: Gpu, source: str) -> Iterable[Warn]:
    rows = ts.series(facts, cfg, g, trend_history.REMAP, counter=True)
    if len(rows) < 2 or _growth(rows) < cfg.trends.remap_rows_growth:
        return
    msg = f"rows remapped for correctable errors grew {rows[0].value} → {rows[-1].value} in {ts.span(rows)}"
    evidence = (*ts.lines(source, g, "remapped_rows.correctable"), ts.kept("remapped rows", rows))
    yield Warn(REMAP_GROWTH, msg, f"+{_growth(rows)} in {ts.span(rows)}", evidence)


def _ecc_rate(facts: NodeFacts, cfg: Config, g: Gpu, source: str) -> Iterable[Warn]:
    """The rate between the last two kept reads of one driver load."""
    ce = ts.series(facts, cfg, g, trend_history.CE, counter=True)
    if len(ce) < 2:
        return
    before, last = ce[-2], ce[-1]
    per_hour, limit = ts.per_hour(before, last), cfg.trends.ecc_correctable_per_hour
    if per_hour <= limit:
        return
    msg = (
        f"volatile correctable ECC errors {before.value} → {last.value} in {ts.hours(last.at - before.at)} "
        f"({per_hour:.0f}/h, above {limit:g}/h)"
    )
    evidence = (*ts.lines(source, g, "ecc.volatile_correctable"), ts.kept("correctable ECC errors", ce))
    yield Warn(ECC_RATE, msg, f"{per_hour:.0f}/h", evidence)


def _retired_pages(facts: NodeFacts, cfg: Config, g: Gpu, source: str) -> Iterable[Warn]:
    """Before Ampere: every retired page (single- or double-bit) uses one of the 64."""
    pages = g.retired_pages
    if pages is None or g.remapped_rows is not None or pages.single_bit is None:
        return
    total, warn_at = pages.single_bit + (pages.double_bit or 0), cfg.trends.retired_pages_warn_at
    if total < warn_at:
        return
    msg = (
        f"{total} of NVIDIA's {NVIDIA_PAGE_LIMIT} retirable pages used (single-bit {pages.single_bit}, "
        f"double-bit {pages.double_bit or 0}; warns at {warn_at})"
    )
    rate = f"{total} of {NVIDIA_PAGE_LIMIT}"
    evidence = ts.lines(source, g, "retired_pages.single_bit")
    kept = ts.series(facts, cfg, g, trend_history.PAGES, counter=True)
    if len(kept) >= 2:
        rate = f"+{_growth(kept)} single-bit in {ts.span(kept)}"
        msg += f"; {rate}"
        evidence = (*evidence, ts.kept("single-bit retired pages", kept))
    yield Warn(RETIRED_PAGES, msg, rate, evidence)


def check_memory(facts: NodeFacts, cfg: Config) -> CheckResult:
    source = facts.gpus.source if isinstance(facts.gpus, GpuInventory) else ""

    def judge(g: Gpu) -> Iterable[Warn]:
        for rule in (_remap_headroom, _remap_growth, _ecc_rate, _retired_pages):
            yield from rule(facts, cfg, g, source)

    def applies(g: Gpu) -> bool:
        return (
            g.remapped_rows is not None
            or g.retired_pages is not None
            or g.ecc.volatile_correctable is not None
        )

    return _judge(
        MEMORY,
        facts,
        cfg,
        judge,
        applies,
        "no GPU reports ECC counters, remapped rows or retired pages",
        "memory not wearing (remap headroom, remapped rows, correctable ECC rate, retired pages)",
    )


# --------------------------------------------------------------------------- growing link errors


def check_nvlink(facts: NodeFacts, cfg: Config) -> CheckResult:
    sample = typed_input(NVLINK, facts.nvlink_errors, NvlinkErrorSample)
    if isinstance(sample, CheckResult):
        return sample
    with_links = {g.pci_bus_id: g for g in sample.gpus if g.links}
    n = cfg.trends.nvlink_growing_reads

    def judge(g: Gpu) -> Iterable[Warn]:
        steady = ts.steady(ts.series(facts, cfg, g, trend_history.NVLINK, counter=True), n)
        if steady is None:
            return
        rate = ts.per_hour(steady[0], steady[-1])
        counts = with_links[g.pci_bus_id]
        now = {k: sum(c.get(k, 0) for c in counts.links.values()) for k in trend_history.NVLINK_COUNTERS}
        msg = (
            f"NVLink CRC and replay errors grew in each of the last {n} reads ({ts.span(steady)}): "
            f"{steady[0].value} → {steady[-1].value} ({rate:.1f}/h) over {len(counts.links)} link(s)"
        )
        evidence = (
            Evidence("nvml nvlink error counters", None, ", ".join(f"{k} {v}" for k, v in now.items())),
            ts.kept("CRC + replay errors", steady),
        )
        yield Warn(NVLINK_GROWING, msg, f"{rate:.1f}/h", evidence)

    return _judge(
        NVLINK,
        facts,
        cfg,
        judge,
        lambda g: g.pci_bus_id in with_links,
        "no GPU with an active NVLink reports error counters",
        f"NVLink errors not growing steadily (over {n} reads)",
    )


def check_pcie(facts: NodeFacts, cfg: Config) -> CheckResult:
    sample = typed_input(PCIE, facts.pci, PciSample)
    if isinstance(sample, CheckResult):
        return sample
    by_addr = sample.by_address()
    n = cfg.trends.pcie_growing_reads

    def judge(g: Gpu) -> Iterable[Warn]:
        steady = ts.steady(ts.series(facts, cfg, g, trend_history.AER, counter=True), n)
        if steady is None:
            return
        rate = ts.per_hour(steady[0], steady[-1])
        dev = by_addr[g.pci_bus_id]
        up = f" and its port {short_pci(dev.upstream)}" if dev.upstream else ""
        msg = (
            f"correctable PCIe errors (AER) on its link grew in each of the last {n} reads "
            f"({ts.span(steady)}): {steady[0].value} → {steady[-1].value} ({rate:.1f}/h)"
        )
        aer = trend_history.aer_correctable(sample, g.pci_bus_id)
        now = f"{short_pci(dev.address)}{up}: TOTAL_ERR_COR {aer}"
        evidence = (
            Evidence("sysfs aer_dev_correctable", None, now),
            ts.kept("correctable AER errors", steady),
        )
        yield Warn(AER_GROWING, msg, f"{rate:.1f}/h", evidence)

    def applies(g: Gpu) -> bool:
        dev = by_addr.get(g.pci_bus_id)
        return dev is not None and "correctable" in dev.aer

    return _judge(
        PCIE,
        facts,
        cfg,
        judge,
        applies,
        "no AER counters in sysfs for the GPUs",
        f"correctable PCIe errors not growing steadily (over {n} reads)",
    )


# --------------------------------------------------------------------------- thermal and clock


def check_thermal(facts: NodeFacts, cfg: Config) -> CheckResult:
    t = cfg.trends
    source = facts.gpus.source if isinstance(facts.gpus, GpuInventory) else ""

    def within(n: int, pts: Sequence[Point]) -> str:
        return f"in each of the last {n} reads ({ts.span(pts)})" if n > 1 else "in the last read"

    def judge(g: Gpu) -> Iterable[Warn]:
        near = []
        for column, what in ((trend_history.GPU_MARGIN, "GPU"), (trend_history.MEM_MARGIN, "memory")):
            pts = ts.last(
                ts.series(facts, cfg, g, column, counter=False),
                t.thermal_reads,
                lambda v: v <= t.thermal_margin_c,
            )
            if pts is not None:
                near.append((what, pts))
        if near:
            parts = [f"{what} {', '.join(str(p.value) for p in pts)} °C" for what, pts in near]
            when = within(t.thermal_reads, near[0][1])
            msg = f"within {t.thermal_margin_c:g} °C of slowdown {when}: {'; '.join(parts)} left"
            evidence = ts.lines(source, g, "thermal") + tuple(
                ts.kept(f"{what} °C left before slowdown", pts) for what, pts in near
            )
            yield Warn(NEAR_SLOWDOWN, msg, f"{near[0][1][-1].value} °C left", evidence)
        stuck = ts.last(
            ts.series(facts, cfg, g, trend_history.CLOCK, counter=False),
            t.clock_reads,
            lambda v: v >= t.clock_shortfall_percent,
        )
        if stuck is not None:
            msg = (
                f"SM clock {', '.join(str(p.value) for p in stuck)} % below its application clock while busy "
                f"(P0, ≥ {t.clock_busy_percent:g} % utilization) with no clock event reason, "
                f"{within(t.clock_reads, stuck)}"
            )
            evidence = (*ts.lines(source, g, "clocks"), ts.kept("% below the application clock", stuck))
            yield Warn(CLOCK_STUCK, msg, f"{stuck[-1].value} % below", evidence)

    def applies(g: Gpu) -> bool:
        return (
            g.thermal.gpu_margin_c is not None
            or g.thermal.memory_margin_c is not None
            or (g.clocks.sm_mhz is not None and g.clocks.applications_mhz is not None)
        )

    return _judge(
        THERMAL,
        facts,
        cfg,
        judge,
        applies,
        "no GPU reports temperatures with their slowdown limit or clocks",
        "temperatures away from slowdown, clocks not stuck low",
    )


CHECKS = (
    CheckSpec(
        MEMORY, check_memory, (Input.GPUS,), "gpu", (REMAP_HEADROOM, REMAP_GROWTH, ECC_RATE, RETIRED_PAGES)
    ),
    CheckSpec(NVLINK, check_nvlink, (Input.GPUS, Input.NVLINK_ERRORS), "gpu", (NVLINK_GROWING,)),
    CheckSpec(THERMAL, check_thermal, (Input.GPUS,), "gpu", (NEAR_SLOWDOWN, CLOCK_STUCK)),
    CheckSpec(PCIE, check_pcie, (Input.GPUS, Input.PCI), "gpu", (AER_GROWING,)),
)
