"""GPU memory health checks: ECC errors, row remapping (Ampere and later), retired pages (before
Ampere). Pure functions of NodeFacts and Config; their CHECKS take their place in gpu.CHECKS."""

from __future__ import annotations

from collections.abc import Iterable

from agent.checks import CheckSpec, per_gpu
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult
from agent.core.gpu import Gpu
from agent.core.rules import Rule
from agent.core.severity import Severity

ECC_DRAM_UNCORRECTABLE = Rule(
    "gpu.ecc.dram-uncorrectable",
    Severity.RESET,
    "volatile uncorrectable DRAM ECC errors",
)
ECC_SRAM_UNCORRECTABLE = Rule(
    "gpu.ecc.sram-uncorrectable",
    Severity.ISOLATE,
    "uncorrectable SRAM ECC errors (volatile or aggregate)",
)
ECC_SRAM_THRESHOLD = Rule(
    "gpu.ecc.sram-threshold",
    Severity.ISOLATE,
    "aggregate SRAM error threshold exceeded",
)
ROW_REMAP_FAILURE = Rule("gpu.row-remap.failure", Severity.ISOLATE, "row remapping failed (no spare rows)")
ROW_REMAP_PENDING = Rule("gpu.row-remap.pending", Severity.RESET, "a row remap waits for a GPU reset")
RETIRED_PAGES_DOUBLE_BIT = Rule(
    "gpu.retired-pages.double-bit",
    Severity.ISOLATE,
    "pages retired for double-bit ECC errors",
)
RETIRED_PAGES_PENDING = Rule("gpu.retired-pages.pending", Severity.REBOOT, "page retirement pending")
RETIRED_PAGES_SINGLE_BIT = Rule(
    "gpu.retired-pages.single-bit",
    Severity.MONITOR,
    "more single-bit retired pages than the threshold",
)

# The Gpu.where key of the lines each rule's finding rests on (`check --explain`).
WHERE = {
    ECC_DRAM_UNCORRECTABLE.name: "ecc.volatile_dram_uncorrectable",
    ECC_SRAM_UNCORRECTABLE.name: "ecc.sram_uncorrectable",
    ECC_SRAM_THRESHOLD.name: "ecc.sram_threshold_exceeded",
    ROW_REMAP_FAILURE.name: "remapped_rows.failure",
    ROW_REMAP_PENDING.name: "remapped_rows.pending",
    RETIRED_PAGES_DOUBLE_BIT.name: "retired_pages.double_bit",
    RETIRED_PAGES_PENDING.name: "retired_pages.pending",
    RETIRED_PAGES_SINGLE_BIT.name: "retired_pages.single_bit",
}


def _ecc(g: Gpu) -> Iterable[tuple[Rule, str]]:
    e = g.ecc
    dram = e.volatile_dram_uncorrectable
    if dram is None and e.volatile_double_bit_total is not None:
        dram = e.volatile_double_bit_total  # pre-Ampere: double-bit = uncorrectable
    if dram:
        yield ECC_DRAM_UNCORRECTABLE, f"{dram} volatile uncorrectable DRAM ECC error(s)"
    sram = max(e.volatile_sram_uncorrectable or 0, e.aggregate_sram_uncorrectable or 0)
    if sram:
        yield ECC_SRAM_UNCORRECTABLE, f"{sram} uncorrectable SRAM ECC error(s)"
    if e.sram_threshold_exceeded:
        yield ECC_SRAM_THRESHOLD, "aggregate SRAM ECC error threshold exceeded"


def check_ecc(facts: NodeFacts, cfg: Config) -> CheckResult:
    def has_counters(g: Gpu) -> bool:
        e = g.ecc
        return e.mode_enabled is not False and any(
            v is not None
            for v in (
                e.volatile_dram_uncorrectable,
                e.volatile_sram_uncorrectable,
                e.aggregate_sram_uncorrectable,
                e.volatile_double_bit_total,
                e.sram_threshold_exceeded,
            )
        )

    return per_gpu(
        "gpu.ecc",
        facts,
        cfg,
        _ecc,
        has_counters,
        not_applicable="no GPU reports ECC counters (ECC off or not supported)",
        ok="no uncorrectable ECC errors",
        where=WHERE,
    )


def _remap(g: Gpu) -> Iterable[tuple[Rule, str]]:
    r = g.remapped_rows
    assert r is not None
    if r.failure:
        yield ROW_REMAP_FAILURE, "row remapping failed: no spare rows left"
    if r.pending:
        yield (
            ROW_REMAP_PENDING,
            (
                f"row remap pending (correctable {r.correctable or 0}, "
                f"uncorrectable {r.uncorrectable or 0}); needs a GPU reset"
            ),
        )


def check_row_remap(facts: NodeFacts, cfg: Config) -> CheckResult:
    return per_gpu(
        "gpu.row-remap",
        facts,
        cfg,
        _remap,
        lambda g: g.remapped_rows is not None,
        not_applicable="no GPU reports row remapping (before Ampere, or MIG)",
        ok="no remap pending or failed",
        where=WHERE,
    )


def check_retired_pages(facts: NodeFacts, cfg: Config) -> CheckResult:
    limit = cfg.thresholds.retired_pages_single_bit_max

    def judge(g: Gpu) -> Iterable[tuple[Rule, str]]:
        p = g.retired_pages
        assert p is not None
        if p.double_bit:
            yield RETIRED_PAGES_DOUBLE_BIT, f"{p.double_bit} page(s) retired for double-bit ECC errors"
        if p.pending:
            yield RETIRED_PAGES_PENDING, "page retirement pending: takes effect after a reboot"
        if p.single_bit is not None and p.single_bit > limit:
            yield RETIRED_PAGES_SINGLE_BIT, f"{p.single_bit} single-bit retired pages (> {limit:g})"

    return per_gpu(
        "gpu.retired-pages",
        facts,
        cfg,
        judge,
        lambda g: g.retired_pages is not None and g.remapped_rows is None,
        not_applicable="no GPU uses page retirement (Ampere and later remap rows instead)",
        ok="no retired-page problem",
        where=WHERE,
    )


CHECKS = (
    CheckSpec(
        "gpu.ecc",
        check_ecc,
        (Input.GPUS,),
        "gpu",
        (ECC_DRAM_UNCORRECTABLE, ECC_SRAM_UNCORRECTABLE, ECC_SRAM_THRESHOLD),
    ),
    CheckSpec("gpu.row-remap", check_row_remap, (Input.GPUS,), "gpu", (ROW_REMAP_FAILURE, ROW_REMAP_PENDING)),
    CheckSpec(
        "gpu.retired-pages",
        check_retired_pages,
        (Input.GPUS,),
        "gpu",
        (RETIRED_PAGES_DOUBLE_BIT, RETIRED_PAGES_PENDING, RETIRED_PAGES_SINGLE_BIT),
    ),
)
