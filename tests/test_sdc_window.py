"""The SDC probe through the active-check window (probes/dcgm/window.run_active), the diag's own: the
agent's real client (probes/sdc_probe.py) against the real probe server over HTTP, each run a real
subprocess on the CPU stand-in with a one-bit fault injected. The fleet slot, the testing taint and
the pods arriving are the in-memory ones of test_dcgm_window.py (the exception DESIGN.md §8 states);
one active check at a time; a pod arriving aborts the run and kills its compute; the last completed
verdict stays."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.checks.sdc import check_sdc
from agent.core.active_checks import Abort, ActiveState
from agent.core.facts import Input, NodeFacts
from agent.core.metric_labels import ActiveCheckAbort
from agent.core.node_keys import EventReason
from agent.core.probed import NotCaptured, ProbeError
from agent.core.sdc_report import SdcReport
from agent.core.severity import Status
from agent.probes.dcgm.idle import IdleGate
from agent.probes.dcgm.window import DiagWindow
from agent.probes.sdc_probe import SdcRunner, SdcTier
from tests.conftest import cfg
from tests.test_dcgm_window import AT, CFG, WALL, Hold, Seen, Slots
from tests.test_sdcprobe_server import call, serve

TRAIN = "pod team-a/train-0 arrived asking for nvidia.com/gpu"
IDLE = IdleGate(compute_processes=lambda: {}, pods_requesting_gpus=lambda: [])


class Arrivals:
    """A pod arrives after *after* polls (None: never)."""

    def __init__(self, after: int | None = None) -> None:
        self.after, self.polls = after, 0

    def start(self) -> None:
        self.polls = 0

    def poll(self) -> Abort | None:
        self.polls += 1
        if self.after is not None and self.polls > self.after:
            return Abort(ActiveCheckAbort.POD_ARRIVED, TRAIN)
        return None


def window_for(
    arrivals: Arrivals | None = None, slots: Slots | None = None
) -> tuple[DiagWindow, Seen, Slots, Hold]:
    metrics, s, h = Seen(), slots or Slots(), Hold()
    window = DiagWindow(
        ActiveState(),
        s,
        h,
        arrivals or Arrivals(),
        hold_wait_s=1.0,
        poll_s=0.05,
        metrics=metrics,
        now=lambda: AT,
        wall=lambda: WALL,
        cfg=CFG,
    )
    return window, metrics, s, h


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path, inject="2:1", cpu_devices=4)


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[str]:
    yield from serve(tmp_path, cpu_delay=5.0, cpu_devices=4)


def test_a_run_goes_through_the_window_and_its_verdict_is_latched(server: str) -> None:
    window, metrics, slots, hold = window_for()
    seen: list[tuple[bool, bool]] = []
    runner = SdcRunner(server, 60.0, IDLE)
    run = runner.run
    runner.run = lambda abort, poll_s: (seen.append((slots.held, hold.on)), run(abort, poll_s))[1]  # type: ignore[method-assign]
    assert window.run_active(runner, "SDC probe", "sdc-probe")
    assert seen == [(True, True)]  # the fleet slot held and the testing taint on while it ran
    assert not slots.held and not hold.on  # given back after
    assert metrics.states == ["idle", "holding", "running", "idle"]
    assert isinstance(runner.latest, SdcReport)
    facts = NodeFacts(sdc=runner.latest)  # no NVML inventory here: the GPU cannot be matched
    res = check_sdc(facts, cfg())
    assert res.status is Status.UNKNOWN and "CUDA device 2" in (res.unknown or "")


def test_a_pod_arriving_aborts_the_run_kills_its_compute_and_the_last_verdict_stays(
    slow: str, server: str
) -> None:
    window, metrics, _, hold = window_for(Arrivals(after=2))
    runner = SdcRunner(slow, 60.0, IDLE)
    done = run_once(server)
    runner.latest = done
    started = time.monotonic()
    assert window.run_active(runner, "SDC probe", "sdc-probe")
    assert time.monotonic() - started < 4.0  # not the 5 s a kernel takes: stopped at once
    assert runner.aborted and not hold.on
    assert isinstance(runner.latest, SdcReport) and runner.latest.attempts == done.attempts
    assert runner.latest.kept.startswith(f"SDC probe aborted: {TRAIN}, at {AT}")
    assert metrics.sample("active_check_aborts_total", reason="pod-arrived") == 1.0
    (event,) = window.state.take_events()
    assert event.reason == EventReason.ACTIVE_CHECK_ABORTED
    assert (
        event.message == f"SDC probe aborted: {TRAIN}; not run: the last completed SDC probe's verdict stands"
    )
    # the server's run was aborted, its compute killed: the next run may start at once
    code, doc = call(slow, "POST", "/runs")
    assert code == 202
    call(slow, "POST", f"/runs/{doc['id']}/abort")


def run_once(address: str) -> SdcReport:
    runner = SdcRunner(address, 60.0, IDLE)
    got = runner.run(lambda: None, 0.05)
    assert isinstance(got, SdcReport)
    return got


def test_one_active_check_at_a_time(server: str) -> None:
    window, _, slots, _ = window_for()
    runner = SdcRunner(server, 60.0, IDLE)
    with window._one:  # the diag holds the window
        assert not window.run_active(runner, "SDC probe", "sdc-probe")
    assert runner.last_skip == "SDC probe postponed: another active check runs on this node"
    assert not slots.held and isinstance(runner.latest, NotCaptured)


def test_busy_gpus_or_no_slot_postpone_it(server: str) -> None:
    window, _, _, hold = window_for(slots=Slots(refuse="2 of 1 slots taken"))
    runner = SdcRunner(server, 60.0, IDLE)
    assert not window.run_active(runner, "SDC probe", "sdc-probe")
    assert runner.last_skip == "SDC probe postponed: 2 of 1 slots taken" and not hold.on
    busy = IdleGate(compute_processes=lambda: {0: 1}, pods_requesting_gpus=lambda: [])
    runner = SdcRunner(server, 60.0, busy)
    assert not window_for()[0].run_active(runner, "SDC probe", "sdc-probe")
    assert runner.last_skip == "SDC probe postponed: compute processes on GPU(s) 0"


def test_an_unreachable_server_is_unknown_not_a_pass() -> None:
    window, _, _, _ = window_for()
    runner = SdcRunner("http://127.0.0.1:9", 5.0, IDLE)
    assert window.run_active(runner, "SDC probe", "sdc-probe")
    assert isinstance(runner.latest, ProbeError) and not runner.aborted
    assert check_sdc(NodeFacts(sdc=runner.latest), cfg()).status is Status.UNKNOWN


def test_the_tier_runs_once_when_due_and_is_read_once_done(server: str) -> None:
    window, _, _, _ = window_for()
    conf = cfg({"sdc": {"address": server}})
    done = threading.Event()
    tier = SdcTier(conf, window, None, on_done=done.set, idle=IDLE)
    assert isinstance(tier.inputs()[Input.SDC](), NotCaptured)  # not run yet: starts one
    assert done.wait(60)
    got = tier.read()
    assert isinstance(got, SdcReport)
    assert [a.number for a in got.attempts] == [1, 2]  # device 2 flipped once: re-run at once
    assert "CUDA device 2" in (check_sdc(NodeFacts(sdc=got), conf).unknown or "")  # no NVML here
    assert tier._thread is not None and not tier._thread.is_alive()  # reading it started none
