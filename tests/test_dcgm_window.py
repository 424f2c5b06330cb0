"""The idle window a DCGM diag runs in (probes/dcgm/window.py), with the real diag runner on our DCGM
binding mirror over the fake libdcgm.so.4: what it reports (this node's active-check state, a diag
that ended without a result by why, as the agent's Prometheus metrics show them) and the record of an
operator's request (the results annotation's lastDiag: started, then completed or aborted). The fleet
slot, the testing taint and the pods arriving are held in memory here; the real ones, on the real
API server: test_active_checks_kube.py."""

from __future__ import annotations

from typing import Any

from agent.core.active_checks import POD_ARRIVED, Abort, ActiveState, DiagRequest
from agent.core.node_keys import EventReason
from agent.probes.dcgm.idle import IdleGate
from agent.probes.dcgm.tiers import DcgmTiers
from agent.probes.dcgm.window import DiagWindow
from agent.reporters.metrics import Metrics
from tests.conftest import cfg

REQUEST = DiagRequest("alice@example.com", "INC-7: after a reseat", "2026-11-28T10:00:00Z", 3)
AT = "2026-11-28T10:05:00Z"
TRAIN = "pod team-a/train-0 arrived asking for nvidia.com/gpu"


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

    def record_active_check(self, state: str) -> None:
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
    state, window, tiers, metrics = window_for(arrivals=Arrivals(Abort(POD_ARRIVED, TRAIN)))
    state.ask(REQUEST)
    assert window.run(tiers.runner)
    record = state.record
    assert record is not None and record["outcome"] == "aborted" and record["endedAt"] == AT
    assert TRAIN in record["abortReason"] and "result unknown" in record["abortReason"]
    assert metrics.sample("active_check_aborts_total", reason="pod-arrived") == 1.0
    assert metrics.sample("active_check_aborts_total", reason="unfinished") is None
    assert metrics.states[-1] == "idle"
    reasons = [e.reason for e in state.take_events()]
    assert reasons == [EventReason.ACTIVE_CHECK_STARTED, EventReason.ACTIVE_CHECK_ABORTED]


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
