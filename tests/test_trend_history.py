"""The kept reads (agent/core/trend_history.py): when a read is kept, how many, how they are written in the
results annotation and read back, and what of them makes a Node write."""

from __future__ import annotations

from typing import Any

from agent.checks import trend_series
from agent.core import trend_history
from agent.core.results_doc import fit
from agent.core.trend_history import Point, Read, TrendHistory

ROW = (10, 1, None, 5, 0, 40, None, 0)


def history(*times: int, boot: str = "boot0001", row: tuple[int | None, ...] = ROW) -> TrendHistory:
    return TrendHistory(tuple(Read(t, boot, {"GPU-A": row}) for t in times))


def test_a_read_is_kept_once_per_spacing_and_the_last_n_are_kept() -> None:
    h = TrendHistory()
    for t in range(0, 3600 * 5, 60):  # a gpu-tier read every minute for five hours
        h = trend_history.advance(h, Read(t, "b", {"GPU-A": ROW}), spacing_s=900, keep=12)
    assert [r.at for r in h.reads] == list(range(5 * 3600 - 12 * 900, 5 * 3600, 900))
    same = trend_history.advance(h, Read(h.reads[-1].at + 60, "b", {"GPU-A": ROW}), 900, 12)
    assert same is h  # not due: nothing changes, nothing is copied
    assert len(trend_history.advance(h, None, 900, 4).reads) == 4  # a smaller keepReads applies at once


def test_no_read_is_kept_for_a_gpu_list_that_could_not_be_read() -> None:
    assert trend_history.advance(TrendHistory(), None, 900, 12) == TrendHistory()


def test_reads_from_the_future_are_dropped_when_the_clock_goes_back() -> None:
    h = trend_history.advance(history(1000, 1900, 2800), Read(2000, "b", {"GPU-A": ROW}), 900, 12)
    assert [r.at for r in h.reads] == [1000, 1900]  # 2800 dropped; 2000 not due yet
    assert [r.at for r in trend_history.advance(h, Read(2800, "b", {"GPU-A": ROW}), 900, 12).reads] == [
        1000,
        1900,
        2800,
    ]


def test_a_run_stops_at_a_reset_a_reboot_a_missing_value_or_a_gap() -> None:
    def pts(*vals: int | None, boots: str = "aaaa", step: int = 900) -> list[Point]:
        return [Point(i * step, boots[i] if len(boots) > 1 else boots, v) for i, v in enumerate(vals)]

    assert [p.value for p in trend_series.run(pts(1, 2, 3), counter=True, volatile=True, max_gap_s=2000)] == [
        1,
        2,
        3,
    ]
    assert [p.value for p in trend_series.run(pts(5, 9, 2, 3), counter=True, max_gap_s=2000)] == [
        2,
        3,
    ]  # reset
    assert [p.value for p in trend_series.run(pts(1, 2, None, 3), counter=True, max_gap_s=2000)] == [3]
    reboot = pts(1, 2, 3, boots="aabb")
    assert [p.value for p in trend_series.run(reboot, counter=True, volatile=True, max_gap_s=2000)] == [3]
    assert [p.value for p in trend_series.run(reboot, counter=True, volatile=False, max_gap_s=2000)] == [
        1,
        2,
        3,
    ]
    assert [p.value for p in trend_series.run(pts(1, 2, step=3000), counter=True, max_gap_s=2000)] == [2]
    # A level may go down: only a missing value or a gap ends it.
    assert [p.value for p in trend_series.run(pts(9, 4, 7), counter=False, max_gap_s=2000)] == [9, 4, 7]


def test_the_annotation_form_round_trips_and_is_compact() -> None:
    h = TrendHistory(
        (
            Read(1000, "boot0001", {"GPU-A": ROW, "GPU-B": (None,) * 8}),
            Read(1900, "boot0001", {"GPU-A": ROW}),  # GPU-B was not in this read
        )
    )
    doc = trend_history.to_doc(h)
    assert doc == {
        "v": 1,
        "t": [1000, 1900],
        "b": ["boot0001", "boot0001"],
        "g": {"GPU-A": [[10, 1, None, 5, 0, 40, None, 0]] * 2, "GPU-B": [[], None]},
    }
    assert trend_history.parse(doc) == h
    assert trend_history.to_doc(TrendHistory()) is None


def test_anything_else_in_the_annotation_reads_as_no_history() -> None:
    good: Any = trend_history.to_doc(history(1000, 1900))
    for bad in (None, [], {"v": 2, **{k: v for k, v in good.items() if k != "v"}}, {**good, "t": [1]}):
        assert trend_history.parse(bad) == TrendHistory()
    assert trend_history.parse({**good, "g": {"GPU-A": [[1, "x"], [True]]}}).reads[0].gpus["GPU-A"][:2] == (
        1,
        None,
    )


def test_only_moving_counters_change_what_must_be_written() -> None:
    flat = trend_history.counters_digest(history(0, 900, 1800))
    warmer = (10, 1, None, 5, 0, 31, None, 0)  # the GPU's margin moved: a level, not a counter
    assert trend_history.counters_digest(history(0, 900, 1800, 2700, row=ROW)) == flat
    assert (
        trend_history.counters_digest(
            TrendHistory((*history(0, 900).reads, Read(1800, "boot0001", {"GPU-A": warmer})))
        )
        == flat
    )
    moved = TrendHistory((*history(0, 900).reads, Read(1800, "boot0001", {"GPU-A": (11, *ROW[1:])})))
    assert trend_history.counters_digest(moved) != flat
    assert trend_history.counters_digest(history(0, 900, 1800, boot="boot0002")) != flat  # a reboot


def test_a_full_annotation_loses_its_oldest_reads_before_any_latch() -> None:
    latched = [
        {"check": "xid", "key": f"xid/{i}", "severity": "reboot", "message": "x" * 50} for i in range(40)
    ]
    reads = TrendHistory(tuple(Read(i * 900, "b", {f"GPU-{g}": ROW for g in range(8)}) for i in range(24)))
    doc = {"checks": [], "latched": latched, "trends": trend_history.to_doc(reads)}
    out = fit(doc, limit=7000)  # latches 4.6 KB, 24 reads 5.3 KB
    assert len(out["latched"]) == 40 and 2 < len(out["trends"]["t"]) < 24
    assert out["trends"]["t"][-1] == 23 * 900  # the newest stay
