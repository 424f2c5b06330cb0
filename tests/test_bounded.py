"""Bounded reads: a stuck reader is parked, not started again while stuck, and never blocks the caller."""

from __future__ import annotations

import threading

import pytest

from agent.probes.bounded import Bounded, StillStuck, TimedOut


def test_a_read_that_finishes_returns_its_value_and_parks_nothing() -> None:
    reads = Bounded()
    assert reads.run("a", lambda: 42, 5, thread_name="probe-a") == 42
    assert reads.parked("a") == []


def test_a_reader_exception_reaches_the_caller() -> None:
    def broken() -> int:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        Bounded().run("a", broken, 5, thread_name="probe-a")


def test_a_stuck_read_is_parked_and_not_started_again_until_it_returns() -> None:
    reads = Bounded()
    release = threading.Event()
    started: list[str] = []

    def stuck() -> str:
        started.append("x")
        release.wait(30)
        return "late"

    with pytest.raises(TimedOut):
        reads.run("a", stuck, 0.05, thread_name="probe-a")
    with pytest.raises(StillStuck) as exc:
        reads.run("a", stuck, 0.05, thread_name="probe-a")
    assert exc.value.count == 1 and started == ["x"]
    assert reads.run("b", lambda: "other key", 5, thread_name="probe-b") == "other key"
    (worker,) = reads.parked("a")
    assert worker.name == "probe-a" and worker.daemon
    release.set()
    worker.join(10)
    assert reads.run("a", lambda: "again", 5, thread_name="probe-a") == "again"
    assert reads.parked("a") == []


def test_run_each_waits_once_for_all_and_one_stuck_reader_costs_only_its_key() -> None:
    import time

    reads = Bounded()
    release = threading.Event()
    calls: list[str] = []

    def reader(key: str) -> object:
        def read() -> str:
            calls.append(key)
            if key == "gpu3":
                release.wait(30)
            if key == "gpu5":
                raise ValueError("gpu5 broke")
            return key

        return read

    keys = [f"gpu{i}" for i in range(8)]
    started = time.monotonic()
    got = reads.run_each({k: reader(k) for k in keys}, 0.3, thread_prefix="t")
    assert 0.3 <= time.monotonic() - started < 1.0  # one deadline for all, not one each
    assert list(got) == keys
    assert isinstance(got["gpu3"], TimedOut) and isinstance(got["gpu5"], ValueError)
    assert [got[k] for k in keys if k not in ("gpu3", "gpu5")] == [
        "gpu0",
        "gpu1",
        "gpu2",
        "gpu4",
        "gpu6",
        "gpu7",
    ]
    calls.clear()
    again = reads.run_each({k: reader(k) for k in keys}, 0.3, thread_prefix="t")
    assert isinstance(again["gpu3"], StillStuck) and "gpu3" not in calls  # not started again
    release.set()
    for t in reads.parked("gpu3"):
        t.join(5)
    assert reads.run_each({"gpu3": reader("gpu3")}, 5, thread_prefix="t") == {"gpu3": "gpu3"}
