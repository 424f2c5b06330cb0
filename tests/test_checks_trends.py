"""Warnings before a fault (agent/checks/trends.py), read by read.

Each test feeds real recordings (and the variants tests/fixtures/derived/make_trend_variants.py
derives from them, said in their .source.txt) through the kept-read history the engine keeps
(core/trend_history: take_read, advance), one read per `trends.readSpacingSeconds`, then judges. Every rule
passes on the healthy real recordings and warns on its derived variant; resets, reboots, missing
values and too few reads never warn.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checks import trends as checks
from agent.config import Config
from agent.config.schema import ConfigError
from agent.core import trend_history
from agent.core.actions import Action
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.nvlink import NvlinkErrorCounts, NvlinkErrorSample, NvlinkReport
from agent.core.pci import PciSample
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.nvlink import parse_nvlink
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.pci import read_pci
from agent.probes.source import with_read
from tests.conftest import cfg
from tests.pci_sysfs_tree import build_from_lspci

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures"
CFG = cfg()
T0 = 1_764_000_000  # epoch seconds of the first read
STEP = int(CFG.trends.read_spacing_s)

H100X8 = "gpud-h100x8-535.183.01.txt"
A100 = "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending.txt"
H100_LOAD = "h100-capture-580.159.04-q-load.txt"
AZ_CLEAN = "aznhc-azure-8gpu-535.86.10-page-retirement-clean.txt"
AZ_BAD = "aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt"
HEALTHY_TEXT = (
    H100X8,
    A100,  # 353 correctable DRAM errors and a pending remap: a count, not a rate, and no bank low
    "gpud-rtx4090x8-535.154.05.txt",
    "gpud-a10x1-535.129.03.txt",
    "gpud-titanv-560.35.03.txt",
    "thamada-h200-550.90.12.txt",
    "thamada-h100-nvl-x2-550.54.14.txt",
    "thamada-l4-550.90.07.txt",
    "nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt",
    "nvgpuexp-h100-80gb-hbm3-590.48.01-q-load.txt",
    "nvgpuexp-h200-590.48.01-q-idle.txt",
    "nvgpuexp-h200-590.48.01-q-load.txt",
    "nvgpuexp-l40s-595.80-q-idle.txt",
    "nvgpuexp-l40s-595.80-q-load.txt",
    "nvidia-smi-q_h100_idle_driver590.txt",
    "h100-capture-580.159.04-q.txt",
    H100_LOAD,  # busy at 1380 of 1980 MHz: SW Power Cap explains it
    AZ_CLEAN,
)
HEALTHY_XML = (
    "h100-capture-580.159.04-qx.xml",
    "telegraf-a10g-515.105.01.xml",
    "telegraf-tesla-t4-515.105.01.xml",
    "telegraf-dual-rtx-a5000-590.44.01-v13.xml",
    "telegraf-rtx-4000-sff-ada-595.84-v13.xml",
)
CHECKS = (checks.check_memory, checks.check_nvlink, checks.check_thermal, checks.check_pcie)


@functools.cache
def inventory(name: str) -> GpuInventory:
    if name.endswith(".xml"):
        return parse_nvsmi_xml((FIX / "nvidia-smi-xml" / name).read_text())
    return parse_nvsmi_text((FIX / "nvidia-smi-q" / name).read_text())


def read_of(name: str | GpuInventory, boot: str = "boot-aaa1", **kw: Any) -> NodeFacts:
    gpus = inventory(name) if isinstance(name, str) else name
    return NodeFacts(gpus=gpus, boot_id=boot, **kw)


def kept(reads: Sequence[NodeFacts], cfg: Config = CFG, step: int = STEP) -> NodeFacts:
    """The last read's facts, carrying the history of all of them, one read every `step` seconds
    (what the engine does on its gpu tier)."""
    t = cfg.trends
    history = trend_history.TrendHistory()
    facts = reads[0]
    for i, f in enumerate(reads):
        facts = with_read(f, history, T0 + i * step, t.read_spacing_s, t.keep_reads, t.clock_busy_percent)
        history = facts.trends
    return facts


def warnings(result: CheckResult) -> list[Finding]:
    return [f for f in result.findings if f.severity > Severity.NONE]


def only(result: CheckResult, rule: str, pci: str) -> Finding:
    (f,) = warnings(result)
    assert f.rule == rule and f.severity is Severity.MONITOR and result.status is Status.WARN
    assert pci in f.key and any(pci in e for e in f.entities), (f.key, f.entities)
    assert f.rate and f.evidence and f.recommendation.action in (Action.PLAN_SERVICE, Action.WATCH)
    return f


# --------------------------------------------------------------------------- healthy real recordings


@pytest.mark.parametrize("name", HEALTHY_TEXT + HEALTHY_XML)
def test_every_rule_passes_on_a_healthy_real_recording_read_after_read(name: str) -> None:
    facts = kept([read_of(name)] * CFG.trends.keep_reads)
    assert len(facts.trends.reads) == CFG.trends.keep_reads
    for check in CHECKS:
        result = check(facts, CFG)
        assert result.status in (Status.PASS, Status.SKIPPED), (check.__name__, result.message)
        assert not warnings(result)


def test_the_first_read_says_rates_come_later() -> None:
    result = checks.check_memory(kept([read_of(H100X8)]), CFG)
    assert result.status is Status.PASS and "rates from the next" in result.message


# --------------------------------------------------------------------------- trend.memory


def test_remap_headroom_low_and_none_banks_warn_with_one_read() -> None:
    facts = kept([read_of("DERIVED-h100x8-remap-histogram-low.txt")])
    f = only(checks.check_memory(facts, CFG), "trend.memory.remap-headroom", "0000:75:00.0")
    assert "2 DRAM bank(s) at Low and 1 at None" in f.message and "(of 2560)" in f.message
    assert f.recommendation.action is Action.PLAN_SERVICE and f.rate == "3 bank(s) low"
    assert any("Low" in e.text and e.line for e in f.evidence)


def test_remap_headroom_from_xml_names_its_rate_over_the_kept_reads() -> None:
    facts = kept(
        [
            read_of("h100-capture-580.159.04-qx.xml"),
            read_of("h100-capture-580.159.04-qx-DERIVED-remap-histogram-none.xml"),
        ]
    )
    f = only(checks.check_memory(facts, CFG), "trend.memory.remap-headroom", "0000:00:06.0")
    assert "0 DRAM bank(s) at Low and 1 at None" in f.message and f.rate == "no new remapped row in 15 min"
    assert any(e.source == "nvidia-smi -q -x" and "row_remapper_histogram_none" in e.text for e in f.evidence)


def test_remapped_rows_growing_warn_and_a_count_alone_does_not() -> None:
    grown = kept([read_of(A100), read_of("DERIVED-a100x4-remapped-rows-grown.txt")])
    f = only(checks.check_memory(grown, CFG), "trend.memory.remap-growth", "0000:9e:00.0")
    assert "grew 1 → 3 in 15 min" in f.message and f.rate == "+2 in 15 min"
    assert f.recommendation.action is Action.WATCH
    # Persistent rows: a reboot between the reads does not hide the growth ...
    across = kept(
        [read_of(A100, boot="boot-aaa1"), read_of("DERIVED-a100x4-remapped-rows-grown.txt", boot="boot-bbb2")]
    )
    assert [w.rule for w in warnings(checks.check_memory(across, CFG))] == ["trend.memory.remap-growth"]
    # ... and fewer rows later (a new board, an InfoROM cleared) is a reset, not a warning.
    down = kept([read_of("DERIVED-a100x4-remapped-rows-grown.txt"), read_of(A100)])
    assert not warnings(checks.check_memory(down, CFG))


def test_correctable_ecc_rate_warns_above_the_configured_rate() -> None:
    facts = kept([read_of(A100), read_of("DERIVED-a100x4-dram-correctable-grown.txt")])
    f = only(checks.check_memory(facts, CFG), "trend.memory.ecc-rate", "0000:9e:00.0")
    assert "353 → 653 in 15 min (1200/h, above 100/h)" in f.message and f.rate == "1200/h"
    assert any(e.source == "kept reads" and "353" in e.text and "653" in e.text for e in f.evidence)
    assert any(e.source == "nvidia-smi -q" and "DRAM Correctable" in e.text for e in f.evidence)
    # The threshold is live: a config that allows more does not warn on the same reads.
    lenient = cfg({"trends": {"eccCorrectablePerHour": 2000}})
    assert not warnings(
        checks.check_memory(
            kept([read_of(A100), read_of("DERIVED-a100x4-dram-correctable-grown.txt")], lenient), lenient
        )
    )


def test_a_reset_never_looks_like_growth_nor_negative_growth() -> None:
    grown = "DERIVED-a100x4-dram-correctable-grown.txt"
    reload = kept([read_of(grown), read_of(A100)])  # 653 → 353: the driver reloaded
    assert not warnings(checks.check_memory(reload, CFG))
    reboot = kept([read_of(A100, boot="boot-aaa1"), read_of(grown, boot="boot-bbb2")])  # a new boot
    assert not warnings(checks.check_memory(reboot, CFG))
    unknown_boot = kept([read_of(A100, boot=""), read_of(grown, boot="")])
    assert not warnings(checks.check_memory(unknown_boot, CFG))


def test_a_missing_value_or_an_unreadable_list_never_warns() -> None:
    bad = inventory("DERIVED-a100x4-dram-correctable-grown.txt")
    # The middle read's ECC counters were not reported (N/A): it ends the series.
    blank = replace(
        bad,
        gpus=tuple(
            replace(g, ecc=replace(g.ecc, volatile_dram_correctable=None, volatile_sram_correctable=None))
            for g in bad.gpus
        ),
    )
    gap = kept([read_of(A100), read_of(blank), read_of(bad)])
    assert not warnings(checks.check_memory(gap, CFG))
    # This cycle's GPU list unreadable: unknown, and no warning from the reads kept before it.
    history = kept([read_of(A100), read_of(bad)]).trends
    broken = NodeFacts(
        gpus=ProbeError("nvidia-smi -q", ProbeErrorKind.UNREADABLE, "cut short"), trends=history
    )
    result = checks.check_memory(broken, CFG)
    assert result.status is Status.UNKNOWN and not result.findings
    # A gap longer than 2.5 spacings (the agent was down) is no series either.
    far = kept([read_of(A100), read_of(bad)], step=3 * STEP)
    assert not warnings(checks.check_memory(far, CFG))


def test_retired_pages_near_the_limit_warn_before_ampere() -> None:
    facts = kept([read_of(AZ_CLEAN), read_of("DERIVED-aznhc-8gpu-page-retirement-sbe-50.txt")])
    f = only(checks.check_memory(facts, CFG), "trend.memory.retired-pages", "0003:00:00.0")
    assert "50 of NVIDIA's 64 retirable pages used" in f.message and f.rate == "+50 single-bit in 15 min"
    assert f.recommendation.action is Action.PLAN_SERVICE
    # The upstream's hand-edited bad case: the GPUs at 48 pages or more (SBE + DBE) warn.
    bad = checks.check_memory(kept([read_of(AZ_BAD)]), CFG)
    warned = sorted(f.entities[0] for f in warnings(bad) if f.rule == "trend.memory.retired-pages")
    assert warned == [
        "GPU 0 (0001:00:00.0)",
        "GPU 1 (0002:00:00.0)",
        "GPU 5 (0006:00:00.0)",
        "GPU 7 (0008:00:00.0)",
    ]


# --------------------------------------------------------------------------- trend.nvlink


def _nvlink_series() -> dict[str, Any]:
    return json.loads(
        (FIX / "trend-series" / "DERIVED-h100x8-gpu2-link5-nvlink-crc-growing.json").read_text()
    )


@functools.cache
def _listing() -> tuple[NvlinkReport, dict[int, str]]:
    text = (ROOT / "examples/snapshots/p5.48xlarge-healthy/nvidia-smi-nvlink-s.txt").read_text()
    return parse_nvlink(text), {g.index: g.pci_bus_id for g in inventory(H100X8).gpus}


def nvlink_sample(counters: dict[str, int] | None, gpu_pci: str = "", link: int = -1) -> NvlinkErrorSample:
    """The p5 snapshot's real NVLink listing (18 active links per GPU) at the H100 recording's GPUs,
    every counter 0 but `counters` on one link."""
    listing, pcis = _listing()
    gpus = []
    for g in listing.gpus:
        links = {
            n: dict.fromkeys(("replay", "recovery", "crc_flit", "crc_data"), 0)
            for n, v in g.links.items()
            if v
        }
        if pcis[g.index] == gpu_pci and counters is not None:
            links[link] = dict(counters)
        gpus.append(NvlinkErrorCounts(g.index, pcis[g.index], links))
    return NvlinkErrorSample(tuple(gpus), taken_at=0.0)


def nvlink_reads(
    series: Sequence[dict[str, int]] | None, boots: Sequence[str] | None = None
) -> list[NodeFacts]:
    s = _nvlink_series()
    counts = series if series is not None else [None] * len(s["reads"])
    return [
        read_of(
            H100X8,
            boot=(boots[i] if boots else "boot-aaa1"),
            nvlink_errors=nvlink_sample(c, s["gpu_pci"], s["link"]),
        )
        for i, c in enumerate(counts)
    ]


def test_nvlink_errors_growing_in_every_read_warn() -> None:
    facts = kept(nvlink_reads(_nvlink_series()["reads"]))
    f = only(checks.check_nvlink(facts, CFG), "trend.nvlink.errors-growing", "0000:75:00.0")
    assert "grew in each of the last 8 reads (2.0 h): 0 → 30" in f.message and "over 18 link(s)" in f.message
    assert f.rate == "15.0/h" and f.recommendation.action is Action.PLAN_SERVICE
    assert any("crc_flit 24" in e.text for e in f.evidence)


def test_nvlink_healthy_flat_too_few_reads_a_flat_read_or_a_reload_do_not_warn() -> None:
    reads = _nvlink_series()["reads"]
    assert not warnings(checks.check_nvlink(kept(nvlink_reads(None)), CFG))  # all 0, read after read
    assert checks.check_nvlink(kept(nvlink_reads(None)), CFG).status is Status.PASS
    assert not warnings(checks.check_nvlink(kept(nvlink_reads(reads[:-1])), CFG))  # 7 intervals
    flat = [*reads[:4], reads[3], *reads[5:]]  # one interval without growth
    assert not warnings(checks.check_nvlink(kept(nvlink_reads(flat)), CFG))
    reload = [*reads[:4], {k: 0 for k in reads[0]}, *reads[5:]]  # counters back to 0 mid-way
    assert not warnings(checks.check_nvlink(kept(nvlink_reads(reload)), CFG))
    boots = ["boot-aaa1"] * 4 + ["boot-bbb2"] * 5  # a reboot after the fourth read
    assert not warnings(checks.check_nvlink(kept(nvlink_reads(reads, boots)), CFG))
    fewer = cfg({"trends": {"nvlinkGrowingReads": 3}})  # live: 3 reads do
    assert warnings(checks.check_nvlink(kept(nvlink_reads(reads[:4]), fewer), fewer))


# --------------------------------------------------------------------------- trend.pcie


def aer_reads(tmp: Path, growing: bool) -> list[NodeFacts]:
    """The 8x H100 node's real PCI bus (lspci -vvv → sysfs, AER 0), one GPU's correctable AER
    counters from the derived series; the H100 recording's GPUs, at this bus's GPU addresses."""
    series = json.loads(
        (FIX / "trend-series" / "DERIVED-h100x8-gpu19-aer-correctable-growing.json").read_text()
    )
    gpu_bus = ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")
    inv = inventory(H100X8)
    inv = replace(
        inv,
        gpus=tuple(
            replace(g, pci_bus_id=f"00000000:{b}:00.0") for g, b in zip(inv.gpus, gpu_bus, strict=True)
        ),
    )
    devices = build_from_lspci(tmp)
    out = []
    for text in series["reads"]:
        if growing:  # the device's counters as this read shows them
            (devices / series["device"] / "aer_dev_correctable").write_text(text)
        out.append(read_of(inv, pci=read_pci(devices)))
    return out


def test_pcie_correctable_errors_growing_in_every_read_warn(tmp_path: Path) -> None:
    facts = kept(aer_reads(tmp_path, growing=True))
    f = only(checks.check_pcie(facts, CFG), "trend.pcie.errors-growing", "0000:19:00.0")
    assert "grew in each of the last 8 reads (2.0 h): 0 → 27" in f.message and f.rate == "13.5/h"
    assert any("TOTAL_ERR_COR 27" in e.text for e in f.evidence)
    assert isinstance(facts.pci, PciSample)


def test_pcie_healthy_bus_does_not_warn(tmp_path: Path) -> None:
    result = checks.check_pcie(kept(aer_reads(tmp_path, growing=False)), CFG)
    assert result.status is Status.PASS and not result.findings


# --------------------------------------------------------------------------- trend.thermal


def test_gpu_near_slowdown_in_every_read_warns_and_once_does_not() -> None:
    hot = "DERIVED-h100x8-gpu-near-slowdown.txt"
    f = only(
        checks.check_thermal(kept([read_of(hot)] * 3), CFG), "trend.thermal.near-slowdown", "0000:75:00.0"
    )
    assert "within 5 °C of slowdown in each of the last 3 reads (30 min): GPU 4, 4, 4 °C left" in f.message
    assert f.recommendation.action is Action.WATCH and f.rate == "4 °C left"
    assert any("GPU T.Limit Temp" in e.text for e in f.evidence)
    assert not warnings(checks.check_thermal(kept([read_of(H100X8), read_of(hot), read_of(hot)]), CFG))
    cooler = cfg({"trends": {"thermalMarginC": 3}})
    assert not warnings(checks.check_thermal(kept([read_of(hot)] * 3, cooler), cooler))


def test_memory_near_its_maximum_warns() -> None:
    facts = kept([read_of("DERIVED-a100x4-memory-near-max.txt")] * 3)
    f = only(checks.check_thermal(facts, CFG), "trend.thermal.near-slowdown", "0000:68:00.0")
    assert "memory 3, 3, 3 °C" in f.message


def test_clock_stuck_low_while_busy_with_no_reason_warns() -> None:
    stuck = "h100-capture-580.159.04-q-load-DERIVED-clock-unexplained.txt"
    f = only(
        checks.check_thermal(kept([read_of(stuck)] * 3), CFG), "trend.thermal.clock-stuck", "0000:00:06.0"
    )
    assert "SM clock 30, 30, 30 % below its application clock while busy" in f.message
    assert any("SM" in e.text and "1380" in e.text for e in f.evidence)
    # The real recording: the same clock, explained by SW Power Cap.
    assert not warnings(checks.check_thermal(kept([read_of(H100_LOAD)] * 3), CFG))


# --------------------------------------------------------------------------- severities


def test_a_trend_rule_is_monitor_at_most_and_may_be_silenced() -> None:
    with pytest.raises(ConfigError, match="never taints"):
        cfg({"severities": {"trend.memory.ecc-rate": "reset"}})
    silent = cfg({"severities": {"trend.memory.remap-headroom": "none"}})
    result = checks.check_memory(kept([read_of("DERIVED-h100x8-remap-histogram-low.txt")]), silent)
    assert result.status is Status.PASS and all(f.severity is Severity.NONE for f in result.findings)
    with pytest.raises(ConfigError, match="keepReads"):
        cfg({"trends": {"keepReads": 4, "thermalReads": 5}})
