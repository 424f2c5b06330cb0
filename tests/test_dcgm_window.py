"""The idle window a DCGM diag runs in (probes/dcgm/window.py), with the real diag runner on our DCGM
binding mirror over the fake libdcgm.so.4: what it reports (this node's active-check state, a diag
that ended without a result by why, as the agent's Prometheus metrics show them) and the record of an
operator's request (the results annotation's lastDiag: started, then completed or aborted), and a
diag aborted for work: not run (the last completed verdict stays), retried once the GPUs are idle
again (the tiers' thread waits for it). The fleet slot, the testing taint and the pods arriving are
held in memory here, through our own protocols: the exception DESIGN.md §8 states, and why; the real
ones, on the real API server: test_active_checks_kube.py."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from agent.checks.dcgm import check_dcgm_diag
from agent.core.active_checks import Abort, ActiveState, DiagRequest
from agent.core.dcgm_report import DiagReport
from agent.core.facts import NodeFacts
from agent.core.metric_labels import ActiveCheckAbort, ActiveCheckState
from agent.core.node_keys import EventReason
from agent.core.probed import ProbeError
from agent.core.severity import Status
from agent.engine.validation import diag_passed
from agent.probes.dcgm.idle import IdleGate
from agent.probes.dcgm.tiers import DcgmTiers
from agent.probes.dcgm.window import DiagWindow
from agent.reporters.metrics import Metrics
from tests.conftest import cfg

REQUEST = DiagRequest("alice@example.com", "INC-7: after a reseat", "2026-11-28T10:00:00Z", 3)
AT = "2026-11-28T10:05:00Z"
WALL = datetime.fromisoformat("2026-11-28T10:05:00+00:00").timestamp()  # AT, in wall seconds
TRAIN = "pod team-a/train-0 arrived asking for nvidia.com/gpu"
# A retry 300 s after the first abort, doubling, at most intervals.dcgmDiag (3600 s here).
CFG = cfg(
    {"node": {"activeChecks": {"maxConcurrent": 1, "retrySeconds": 300}}, "intervals": {"dcgmDiag": 3600}}
)
PASS_DOC = Path(__file__).parent / "fixtures" / "dcgm" / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"


class Slots:
    """The fleet bound: granted, or why not."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse, self.held = refuse, False

    def acquire(self) -> str | None:
        self.held = self.refuse is None
        return self.refuse

    def release(self) -> None:
        self.held = False


class Hold:
    """The testing taint, on the Node at once."""

    def __init__(self) -> None:
        self.on = False

    def hold(self, on: bool) -> None:
        self.on = on

    def held(self) -> bool:
        return self.on

    def lifted(self) -> bool:
        return not self.on


class Arrivals:
    def __init__(self, abort: Abort | None = None) -> None:
        self.abort = abort

    def start(self) -> None:
        pass

    def poll(self) -> Abort | None:
        return self.abort


class Seen(Metrics):
    """The agent's metrics, and every state they were told, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.states: list[str] = []

    def record_active_check(self, state: ActiveCheckState) -> None:
        self.states.append(state)
        super().record_active_check(state)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(f"gpu_healthcheck_{name}", labels)


def window_for(
    slots: Slots | None = None, arrivals: Arrivals | None = None, pods: Any = None
) -> tuple[ActiveState, DiagWindow, DcgmTiers, Seen]:
    state, metrics = ActiveState(), Seen()
    window = DiagWindow(
        state,
        slots or Slots(),
        Hold(),
        arrivals or Arrivals(),
        hold_wait_s=1.0,
        poll_s=0.05,
        metrics=metrics,
        now=lambda: AT,
        wall=lambda: WALL,
        cfg=CFG,
    )
    tiers = DcgmTiers(cfg(), pods or (lambda: []), metrics, window=window)
    tiers.runner.idle = IdleGate(compute_processes=lambda: {}, pods_requesting_gpus=pods or (lambda: []))
    return state, window, tiers, metrics


def test_a_requested_diag_that_completes_is_recorded_with_who_asked(fake_dcgm: Any) -> None:
    state, window, tiers, metrics = window_for()
    assert metrics.sample("active_check_state", state="idle") == 1.0  # a series from the start
    assert state.ask(REQUEST)
    assert window.run(tiers.runner)
    assert state.record == {
        "by": "alice@example.com",
        "reason": "INC-7: after a reseat",
        "requestedAt": "2026-11-28T10:00:00Z",
        "level": 3,
        "outcome": "completed",
        "startedAt": AT,
        "endedAt": AT,
    }
    assert fake_dcgm.stat("diag_calls") == 1
    assert metrics.states == ["idle", "holding", "running", "idle"]
    assert metrics.sample("active_check_state", state="idle") == 1.0
    assert metrics.sample("active_check_state", state="running") is None  # one series: the state now
    (started,) = state.take_events()
    assert started.reason == EventReason.ACTIVE_CHECK_STARTED and "alice@example.com" in started.message


def test_a_pod_arriving_aborts_a_requested_diag_counted_by_why(fake_dcgm: Any) -> None:
    fake_dcgm.hold_diag(True)  # the diag runs until something stops it
    state, window, tiers, metrics = window_for(arrivals=Arrivals(Abort(ActiveCheckAbort.POD_ARRIVED, TRAIN)))
    state.ask(REQUEST)
    assert window.run(tiers.runner)
    record = state.record
    assert record is not None and record["outcome"] == "aborted" and record["endedAt"] == AT
    assert record["abortReason"] == f"level 3 diag aborted: {TRAIN}"
    assert record["retryAt"] == "2026-11-28T10:10:00Z"  # retrySeconds (300) after the abort
    assert "attempt" not in record  # the first try
    assert metrics.sample("active_check_aborts_total", reason="pod-arrived") == 1.0
    assert metrics.sample("active_check_aborts_total", reason="unfinished") is None
    assert metrics.states[-1] == "waiting"  # due again: its retry
    started, aborted = state.take_events()
    assert (started.reason, aborted.reason) == (
        EventReason.ACTIVE_CHECK_STARTED,
        EventReason.ACTIVE_CHECK_ABORTED,
    )
    assert "not run: no diag completed yet" in aborted.message
    assert "not before 2026-11-28T10:10:00Z" in aborted.message
    # No diag completed yet: "not run yet" (skipped), never `unknown`; and no validation pass.
    result = check_dcgm_diag(NodeFacts(dcgm_diag=tiers.runner.latest), cfg())
    assert result.status is Status.SKIPPED, result
    assert result.message.startswith("DCGM diag not run yet: a level 3 diag aborted: pod team-a/train-0")
    assert "runs again once the GPUs are idle, not before 2026-11-28T10:10:00Z" in result.message
    assert not diag_passed(tiers.runner.latest, [result], 1, 0.0)
    retry = state.retry
    assert retry is not None and retry.aborts == 1 and retry.request == REQUEST


def test_an_aborted_diag_keeps_the_last_completed_verdict_and_its_retry_runs_the_request_again(
    fake_dcgm: Any,
) -> None:
    fake_dcgm.load_diag(str(PASS_DOC))
    arrivals = Arrivals()
    state, window, tiers, metrics = window_for(arrivals=arrivals)
    assert window.run(tiers.runner)  # a routine diag completes: pass
    passed = tiers.runner.latest
    assert isinstance(passed, DiagReport) and passed.completed and not passed.aborted
    before = check_dcgm_diag(NodeFacts(dcgm_diag=passed), cfg())
    assert before.status is Status.PASS

    fake_dcgm.hold_diag(True)
    arrivals.abort = Abort(ActiveCheckAbort.POD_ARRIVED, TRAIN)
    state.ask(REQUEST)
    assert window.run(tiers.runner)  # the requested diag, aborted for work
    kept = tiers.runner.latest
    assert isinstance(kept, DiagReport) and kept.results == passed.results  # the pass stays in force
    assert kept.finished_at == passed.finished_at  # not a new run: validation sees no new pass
    assert not diag_passed(kept, [before], 1, (passed.finished_at or 0.0) + 1.0)
    after = check_dcgm_diag(NodeFacts(dcgm_diag=kept), cfg())
    assert after.status is Status.PASS and after.message.startswith(before.message)
    assert "since then a level 3 diag aborted: pod team-a/train-0" in after.message
    said = [e.message for e in state.take_events() if e.reason == EventReason.ACTIVE_CHECK_ABORTED]
    assert len(said) == 1 and "not run: the last completed diag's verdict stands" in said[0]
    assert "not before 2026-11-28T10:10:00Z" in after.message

    # Its retry runs the request again, and is aborted again: the second abort in a row waits twice as long.
    state.take_events()
    assert window.run(tiers.runner)
    record = state.record
    assert record is not None and record["attempt"] == 2 and record["level"] == 3
    assert record["outcome"] == "aborted" and record["retryAt"] == "2026-11-28T10:15:00Z"
    assert state.retry is not None and state.retry.aborts == 2 and state.retry.request == REQUEST
    assert isinstance(tiers.runner.latest, DiagReport) and tiers.runner.latest.results == passed.results

    # Its next try completes: the record says which try, the retry is settled.
    fake_dcgm.hold_diag(False)
    arrivals.abort = None
    state.take_events()
    assert window.run(tiers.runner)
    record = state.record
    assert record is not None and record["outcome"] == "completed" and record["attempt"] == 3
    assert record["level"] == 3 and "retryAt" not in record
    (started,) = state.take_events()
    assert "asked by alice@example.com" in started.message and "(try 3" in started.message
    assert state.retry is None and metrics.states[-1] == "idle"
    done = tiers.runner.latest
    assert isinstance(done, DiagReport) and done.completed and not done.aborted


def test_a_diag_that_could_not_run_is_still_unknown_and_not_retried(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(PASS_DOC))
    state, window, tiers, _ = window_for()
    assert window.run(tiers.runner)
    fake_dcgm.hold_diag(True)
    tiers.runner.timeout_s, tiers.runner.watchdog_margin_s = 0.2, 0.1
    assert window.run(tiers.runner)  # past its deadline: we could not look
    assert isinstance(tiers.runner.latest, ProbeError)
    assert check_dcgm_diag(NodeFacts(dcgm_diag=tiers.runner.latest), cfg()).status is Status.UNKNOWN
    assert state.retry is None


def test_a_diag_past_its_timeout_is_unfinished_and_a_routine_one_records_nothing(fake_dcgm: Any) -> None:
    fake_dcgm.hold_diag(True)
    state, window, tiers, metrics = window_for()
    tiers.runner.timeout_s, tiers.runner.watchdog_margin_s = 0.2, 0.1
    assert window.run(tiers.runner)  # no request: a routine diag
    assert state.record is None and state.take_events() == ()
    assert metrics.sample("active_check_aborts_total", reason="unfinished") == 1.0
    state.ask(REQUEST)
    assert window.run(tiers.runner)
    record = state.record
    assert record is not None and record["outcome"] == "aborted"
    assert "did not finish within 0.2 s" in record["abortReason"]
    assert metrics.sample("active_check_aborts_total", reason="unfinished") == 2.0


def test_a_diag_that_cannot_start_says_why_it_waits_and_records_nothing(fake_dcgm: Any) -> None:
    state, window, tiers, metrics = window_for(slots=Slots("waiting for a fleet slot: 2 of 40 ..."))
    state.ask(REQUEST)
    assert not window.run(tiers.runner)
    assert metrics.sample("active_check_state", state="no-slot") == 1.0
    assert metrics.sample("active_check_state", state="idle") is None
    assert state.pending == REQUEST and state.record is None  # still pending: status lists it
    busy = lambda: ["team-a/train-0"]  # noqa: E731
    state, window, tiers, metrics = window_for(pods=busy)
    assert not window.run(tiers.runner)
    assert metrics.states == ["idle", "waiting"] and "team-a/train-0" in tiers.runner.last_skip
    assert fake_dcgm.stat("diag_calls") == 0


class ArrivesOnce(Arrivals):
    """A pod arrives mid-diag once, and holds the GPUs (the kubelet's view) until it leaves."""

    def __init__(self, holding: list[str]) -> None:
        super().__init__()
        self.holding, self.arrived = holding, threading.Event()

    def poll(self) -> Abort | None:
        if self.arrived.is_set():
            return None
        self.holding.append("team-a/train-0")
        self.arrived.set()
        return Abort(ActiveCheckAbort.POD_ARRIVED, TRAIN)


def test_an_aborted_diag_runs_again_within_retry_seconds_once_the_gpus_are_idle(fake_dcgm: Any) -> None:
    """The tiers' thread: after the abort it waits for its retry, then asks every retrySeconds while
    the pod holds the GPUs (no diag), and runs one within retrySeconds of the pod leaving."""
    fake_dcgm.load_diag(str(PASS_DOC))
    fake_dcgm.hold_diag(True)
    holding: list[str] = []
    arrivals = ArrivesOnce(holding)
    state, window, tiers, _ = window_for(arrivals=arrivals, pods=lambda: list(holding))
    # A reload sets the pace: the retry 1 s after the abort, then one try every second.
    window.apply_config(window.cfg, cfg({"node": {"activeChecks": {"retrySeconds": 1}}}))
    read = threading.Event()
    tiers.on_done = read.set
    tiers.diag()  # due: the thread starts
    assert read.wait(30) and arrivals.arrived.is_set()
    kept = tiers.diag()  # the loop reads the aborted diag: not run yet
    assert isinstance(kept, DiagReport) and not kept.completed and TRAIN in kept.aborted
    read.clear()
    time.sleep(2.5)  # the pod holds the GPUs: the retry is due, and postponed every second
    assert fake_dcgm.stat("diag_calls") == 1 and tiers.waiting and state.retry is not None
    assert "team-a/train-0" in tiers.progress()
    fake_dcgm.hold_diag(False)
    left = time.monotonic()
    holding.clear()  # the pod leaves
    assert read.wait(30)
    assert fake_dcgm.stat("diag_calls") == 2
    done = tiers.diag()
    assert isinstance(done, DiagReport) and done.completed and not done.aborted
    took = time.monotonic() - left
    assert took < 1.0 + 5.0, took  # retrySeconds and a margin for the diag itself
    assert tiers._thread is not None
    tiers._thread.join(10)
    assert not tiers._thread.is_alive() and state.retry is None  # settled: nothing more to run
