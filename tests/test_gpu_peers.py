"""gpu.peers: a GPU persistently behind the other busy GPUs its pod holds (SM clock or draw below
their median by more than the margin, no clock event reason) is a warning naming the pod.

On per-GPU series derived from real recordings (tests/fixtures/peer-series/*.source.txt: the real
H100 load read for each GPU of the real 8x H100 listing): healthy, a straggler, one slow sample, a
throttled GPU, an idle GPU, two pods doing different work, and a straggler in the second pod. The
engine's side: the kubelet is asked who holds the GPUs only in a read where a GPU runs behind."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checks.gpu_peers import BEHIND, NAME, check_peers
from agent.core.facts import NodeFacts
from agent.core.gpu import ClockEvents, GpuInventory
from agent.core.gpu_stall import GpuActivity, Sample
from agent.core.severity import Severity, Status
from agent.engine.stalls import observe
from agent.probes.nvsmi_text import parse_nvsmi_text
from tests.conftest import cfg

FIX = Path(__file__).parent / "fixtures"
SERIES = FIX / "peer-series"
CFG = cfg()


def series(kind: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SERIES / f"DERIVED-h100x8-{kind}.json").read_text())
    return doc


def inventory(doc: dict[str, Any]) -> GpuInventory:
    return parse_nvsmi_text((FIX / doc["base"]).read_text(encoding="utf-8"))


def activity(doc: dict[str, Any], inv: GpuInventory, reads: int | None = None) -> GpuActivity:
    """The samples as engine/stalls.observe keeps them: pods where the kubelet was asked."""
    by_index = {g.index: g.lasting_name for g in inv.gpus}
    out: dict[str, list[Sample]] = {}
    for read in doc["reads"][:reads]:
        for index, s in read["gpus"].items():
            out.setdefault(by_index[int(index)], []).append(
                Sample(
                    read["at"],
                    s["util"],
                    s["power_w"],
                    (f"{s['pod']}/main",),
                    s["sm_mhz"],
                    bool(s["reasons"]),
                )
            )
    return GpuActivity({k: tuple(v) for k, v in out.items()})


def judge(kind: str, reads: int | None = None, config: Any = CFG) -> Any:
    doc = series(kind)
    inv = inventory(doc)
    return check_peers(NodeFacts(gpus=inv, activity=activity(doc, inv, reads)), config), inv


@pytest.mark.parametrize("kind", ["healthy", "one-slow-sample", "throttled", "idle", "different-pods"])
def test_no_warning(kind: str) -> None:
    r, _ = judge(kind)
    assert r.status is Status.PASS and not r.findings, r.findings


def test_an_idle_gpu_is_never_judged_even_without_an_idle_reason() -> None:
    """The real idle read sets the Idle reason; without it (a GPU between kernels), the busy floor
    alone keeps the idle GPU out of the comparison."""
    doc = series("idle")
    for read in doc["reads"]:
        read["gpus"]["5"]["reasons"] = []
    inv = inventory(doc)
    assert not check_peers(NodeFacts(gpus=inv, activity=activity(doc, inv)), CFG).findings


def test_the_straggler_warns_naming_the_pod_and_margins() -> None:
    r, inv = judge("straggler")
    (f,) = r.findings
    gpu5 = inv.gpus[5]
    assert f.rule == BEHIND.name and f.severity is Severity.MONITOR and f.entities == (gpu5.label,)
    assert f.message.startswith(f"{gpu5.label}: a straggler in pod ml/train-0: its SM clock and power draw")
    assert "median of the 7 other busy GPUs" in f.message
    assert "peers.clockMarginPercent 10 %" in f.message and "peers.powerMarginPercent 20 %" in f.message
    assert "in at least 3 of the last 5 reads" in f.message
    assert "SM clock 1410 MHz, median 1980 MHz" in f.evidence[0].text


def test_the_straggler_message_holds_no_live_reading() -> None:
    """Judged after five and after six reads: the same words (no Node write per cycle)."""
    five, _ = judge("straggler", reads=5)
    six, _ = judge("straggler")
    assert five.findings[0].message == six.findings[0].message


def test_fewer_behind_reads_than_the_threshold_do_not_warn() -> None:
    r, _ = judge("straggler", reads=2)  # behind in reads 0 and 1 only
    assert not r.findings
    r, _ = judge("straggler", reads=4)  # reads 0, 1, 3: three
    assert r.findings


def test_a_straggler_in_the_second_pod_is_judged_against_that_pod_alone() -> None:
    r, inv = judge("two-pods-straggler")
    (f,) = r.findings
    assert "pod ml/infer-1" in f.message and "the 3 other busy GPUs" in f.message
    assert f.entities == (inv.gpus[5].label,)


def test_a_pod_of_two_gpus_is_never_judged() -> None:
    doc = series("two-pods-straggler")
    for read in doc["reads"]:
        for g in ("6", "7"):
            read["gpus"][g]["pod"] = "ml/other"
    inv = inventory(doc)
    r = check_peers(NodeFacts(gpus=inv, activity=activity(doc, inv)), CFG)
    assert not r.findings  # GPUs 4 and 5 in ml/infer-1: a median of two names no odd one


def test_one_read_is_skipped() -> None:
    doc = series("straggler")
    assert check_peers(NodeFacts(gpus=inventory(doc)), CFG).status is Status.SKIPPED
    assert NAME == "gpu.peers"


# --------------------------------------------------------------------------- the engine's side


def _busy(inv: GpuInventory, slow: int | None = None) -> GpuInventory:
    """The 8x H100 listing under the real load read (100 %, 1980 MHz, 631.95 W, no reason)."""
    gpus = []
    for g in inv.gpus:
        mhz, watts = (1410, 452.0) if g.index == slow else (1980, 631.95)
        gpus.append(
            replace(
                g,
                clocks=replace(g.clocks, sm_mhz=mhz, utilization_percent=100),
                power=replace(g.power, draw_w=watts, performance_state="P0"),
                clock_events=ClockEvents(*(False,) * 9),
            )
        )
    return replace(inv, gpus=tuple(gpus))


def test_the_kubelet_is_asked_only_in_a_read_where_a_gpu_runs_behind() -> None:
    inv = inventory(series("healthy"))
    asked: list[int] = []

    def holders() -> dict[int, tuple[str, ...]]:
        asked.append(1)
        return {g.index: ("ml/train-0/main",) for g in inv.gpus}

    act = observe(GpuActivity(), _busy(inv), CFG, holders, 1_780_000_000)
    assert not asked and all(s[-1].pods is None for s in act.gpus.values())
    act = observe(act, _busy(inv, slow=5), CFG, holders, 1_780_000_060)
    assert len(asked) == 1 and all(s[-1].pods == ("ml/train-0/main",) for s in act.gpus.values())
    last = act.series(inv.gpus[5].lasting_name)[-1]
    assert (last.sm_mhz, last.explained) == (1410, False)
