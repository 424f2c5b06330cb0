"""The idle window a DCGM diag runs in (core/active_checks.py says why): GPUs idle, a fleet slot taken,
the node held by the testing taint, GPUs still idle once it is on; while the diag runs, a pod that
arrives anyway aborts it; afterwards the taint is lifted and the slot given back, whatever happened.
A window that is not there now is waited for by the caller (tiers.py) and tried again every
`node.activeChecks.retrySeconds`. A diag aborted for work did not run: the last completed diag's
verdict stays in force (kept_after_abort), and a retry is due (ActiveState.retry, at the pace of
ActivePolicy.retry_after), which the caller waits for before it tries again; a diag that ended
without a result otherwise (past its timeout, the engine lost) is `unknown`, and none is retried.

It reports where it stands (Telemetry.record_active_check: idle, waiting, no-slot, holding, running),
counts a diag that ended without a result by why (record_active_check_abort), and records the
outcome of an operator's request in the shared state (lastDiag: started, completed, aborted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from agent.config import Config
from agent.core.active_checks import (
    Abort,
    ActiveState,
    DiagRequest,
    Slots,
)
from agent.core.dcgm_report import DiagReport, kept_after_abort
from agent.core.marks import NodeEvent
from agent.core.metric_labels import ActiveCheckAbort, ActiveCheckState
from agent.core.node_keys import DIAG_ABORTED, DIAG_COMPLETED, NORMAL, WARNING, EventReason
from agent.core.probed import ProbeError
from agent.core.results_doc import now_iso
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.probes.dcgm.diag import DiagRunner
from agent.probes.dcgm.idle import IdleVerdict

log = logging.getLogger(__name__)

DIAG_TIER = "dcgm-diag"  # the tier whose read shows the diag's hold (engine/scheduler.py)
HOLD_WAIT_S = 60.0  # the testing taint must be on the Node within this, or the window is missed
POLL_S = 2.0  # how often arrivals are asked while a diag runs


class Hold(Protocol):
    """The testing taint (reporters/active_checks.NodeHold): wished on or off, and whether the Node
    shows what the diag needs (on; or nothing, where the mode puts no taint)."""

    def hold(self, on: bool) -> None: ...
    def held(self) -> bool: ...
    def lifted(self) -> bool: ...


class Arrivals(Protocol):
    """Pods that came to the node for its GPUs since start() (reporters/active_checks.PodArrivals
    with the kubelet's view): why to abort, or None."""

    def start(self) -> None: ...
    def poll(self) -> Abort | None: ...


class Gate(Protocol):
    def check(self) -> IdleVerdict: ...


class ActiveRunner(Protocol):
    """An active check other than the diag (the SDC probe: probes/sdc_probe.SdcRunner): its idle
    gate, why it last waited, whether its last run was aborted for work, its latched result."""

    idle: Gate
    last_skip: str
    aborted: bool
    latest: Any

    def run(self, abort: Callable[[], str | None], poll_s: float) -> Any: ...
    def kept(self, why: str) -> None: ...


class DiagWindow:
    def __init__(
        self,
        state: ActiveState,
        slots: Slots,
        hold: Hold,
        arrivals: Arrivals,
        *,
        cfg: Config,
        hold_wait_s: float = HOLD_WAIT_S,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        metrics: Telemetry | None = None,
        now: Callable[[], str] = now_iso,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """*cfg*: the config in force (node.activeChecks, intervals.dcgmDiag); a reload hands the new
        one (apply_config), which the next retry's pace reads."""
        self.cfg = cfg
        self.state, self.slots, self.hold, self.arrivals = state, slots, hold, arrivals
        self.hold_wait_s, self.poll_s = hold_wait_s, poll_s
        self._clock, self._sleep, self._now, self._wall = clock, sleep, now, wall
        self._said = ""
        self._abort: Abort | None = None  # why the running diag was stopped
        self._one = threading.Lock()  # one active check at a time on this node (the diag, the SDC probe)
        # The tier of the active check that holds (or last held) the node: the hold's writes make it
        # due, so that the loop publishes the taint without starting a check of another kind.
        self.holding_tier = DIAG_TIER
        self.metrics: Telemetry = metrics or NoTelemetry()
        self.metrics.record_active_check(ActiveCheckState.IDLE)

    def apply_config(self, old: Config, new: Config) -> None:
        self.cfg = new

    @property
    def retry_s(self) -> float:
        """How long a postponed diag waits before it asks again (node.activeChecks.retrySeconds)."""
        return self.cfg.node.active_checks.retry_s

    def retry_after(self, aborts: int) -> float:
        """How long after the n-th diag in a row aborted for work the next one waits
        (ActivePolicy.retry_after, capped at intervals.dcgmDiag)."""
        return self.cfg.node.active_checks.retry_after(aborts, self.cfg.intervals.dcgm_diag)

    def run(self, runner: DiagRunner) -> bool:
        """One try: True when a diag ran (finished, failed or aborted: its result is latched),
        False when the window is not there now (runner.last_skip says why)."""
        return self._window(runner, "DCGM diag", DIAG_TIER, lambda: self._diag(runner), self._diag_ended)

    def run_active(self, runner: ActiveRunner, what: str, tier: str) -> bool:
        """One try of another active check (*what*: "SDC probe") in the same window as the diag: idle
        GPUs, a fleet slot, the testing taint, GPUs still idle once it is on, a pod arriving aborts
        it. True when it ran (its result latched in runner.latest; aborted for work: runner.kept
        says why and the last completed result stays), False when the window is not there now."""
        return self._window(runner, what, tier, lambda: self._active(runner, what), lambda: None)

    def _window(
        self,
        runner: DiagRunner | ActiveRunner,
        what: str,
        tier: str,
        body: Callable[[], None],
        ended: Callable[[], None],
    ) -> bool:
        """The one window every active check runs in: one at a time on this node, GPUs idle, a
        fleet slot taken, the testing taint on the Node, GPUs still idle once it is (a pod scheduled
        before the taint landed); then *body* runs the check (True returned: it ran). Afterwards,
        whatever happened: *ended* (the check's own bookkeeping), the taint lifted and the slot
        given back once the Node no longer shows it (within hold_wait_s; after that it is given
        back anyway: a refused write must not keep the fleet's slot), so that a node that takes it
        next never stands tainted beside this one."""
        if not self._one.acquire(blocking=False):
            return self._postponed(runner, "another active check runs on this node", what=what)
        try:
            self.holding_tier = tier
            verdict = runner.idle.check()
            if not verdict.idle:
                return self._postponed(runner, verdict.reason, what=what)
            why = self.slots.acquire()
            if why is not None:
                return self._postponed(runner, why, ActiveCheckState.NO_SLOT, what)
            running = False
            try:
                self.metrics.record_active_check(ActiveCheckState.HOLDING)
                self.hold.hold(True)
                if not self._wait(self.hold.held):
                    why = f"the testing taint was not on the Node within {self.hold_wait_s:g} s"
                    return self._postponed(runner, why, what=what)
                self.arrivals.start()
                verdict = runner.idle.check()
                if not verdict.idle:
                    return self._postponed(runner, verdict.reason, what=what)
                self._said = runner.last_skip = ""
                running, self._abort = True, None
                body()
                return True
            finally:
                ended()
                self.hold.hold(False)
                if not self._wait(self.hold.lifted):
                    log.warning("the testing taint still shows %g s after the %s; fleet slot given back",
                                self.hold_wait_s, what)  # fmt: skip
                self.slots.release()
                if running:  # a postponed check stays waiting (or no-slot) until its next try
                    self.metrics.record_active_check(
                        ActiveCheckState.WAITING if self.state.retry is not None else ActiveCheckState.IDLE
                    )
        finally:
            self._one.release()

    def _diag(self, runner: DiagRunner) -> None:
        """The diag in its window: at the level an operator's request asks (its record: started,
        completed or aborted, with an Event), its result latched; aborted for work, not run."""
        request = self.state.start()
        if request is not None and request.level:
            runner.level = max(runner.level, request.level)
        log.info("DCGM diag level %d starting: GPUs idle, fleet slot taken, node held", runner.level)
        if request is not None:
            self.state.began(request, runner.level, self._now())
            tried = (self.state.record or {}).get("attempt")
            again = f" (try {tried}: the earlier ones were aborted for work)" if tried else ""
            self.state.say(
                NodeEvent(
                    EventReason.ACTIVE_CHECK_STARTED,
                    f"DCGM diag level {runner.level} started, asked by {request.who()}{again}",
                    NORMAL,
                )
            )
        self.metrics.record_active_check(ActiveCheckState.RUNNING)
        result = runner.run(abort=self._poll, poll_s=self.poll_s)
        if isinstance(result, ProbeError) and runner.aborted:
            self._aborted(runner, result, request)
            return
        self.state.settled()
        runner.latest = result
        if isinstance(result, ProbeError):
            self.metrics.record_active_check_abort(ActiveCheckAbort.UNFINISHED)
            self.state.end(DIAG_ABORTED, self._now(), result.message)
        else:
            self.state.end(DIAG_COMPLETED, self._now())

    def _diag_ended(self) -> None:
        # A requested diag still `started` here did not end as a diag does (the run raised).
        self.state.end(DIAG_ABORTED, self._now(), "the diag failed in the agent (its log says why)")

    def _active(self, runner: ActiveRunner, what: str) -> None:
        """Another active check in its window: its result latched; aborted for work, not run (the
        last completed result stays, an Event says so)."""
        log.info("%s starting: GPUs idle, fleet slot taken, node held", what)
        self.metrics.record_active_check(ActiveCheckState.RUNNING)
        result = runner.run(abort=self._poll, poll_s=self.poll_s)
        if isinstance(result, ProbeError) and runner.aborted:
            stopped = self._abort
            self.metrics.record_active_check_abort(stopped.reason if stopped else ActiveCheckAbort.UNFINISHED)
            runner.kept(f"{result.message}, at {self._now()}; it runs again once the GPUs are idle")
            text = f"{result.message}; not run: the last completed {what}'s verdict stands"
            self.state.say(NodeEvent(EventReason.ACTIVE_CHECK_ABORTED, text, WARNING))
            return
        if isinstance(result, ProbeError):
            self.metrics.record_active_check_abort(ActiveCheckAbort.UNFINISHED)
        runner.latest = result

    def _aborted(self, runner: DiagRunner, result: ProbeError, request: DiagRequest | None) -> None:
        """Stopped for work: not run. The last completed verdict stays (the message says so, and
        when the diag runs again); counted by why, an Event, lastDiag aborted with its retry."""
        stopped = self._abort
        self.metrics.record_active_check_abort(stopped.reason if stopped else ActiveCheckAbort.UNFINISHED)
        retry = self.state.retry_later(request, self.retry_after, self._clock(), self._wall())
        again = f"it runs again once the GPUs are idle, not before {retry.at}"
        runner.latest = kept_after_abort(runner.latest, f"a {result.message}, at {self._now()}; {again}")
        kept = runner.latest
        stands = (
            "the last completed diag's verdict stands"
            if isinstance(kept, DiagReport) and kept.completed
            else "no diag completed yet"
            if isinstance(kept, DiagReport)
            else "the last diag's result stands"
        )
        text = f"{result.message}; not run: {stands}; {again}"
        self.state.say(NodeEvent(EventReason.ACTIVE_CHECK_ABORTED, text, WARNING))
        self.state.end(DIAG_ABORTED, self._now(), result.message, retry.at)

    def _poll(self) -> str | None:
        """The arrivals' answer in words, for the runner; why (its reason) kept for the count."""
        abort = self.arrivals.poll()
        if abort is None:
            return None
        self._abort = abort
        return abort.text

    def _wait(self, done: Callable[[], bool]) -> bool:
        deadline = self._clock() + self.hold_wait_s
        while not done():
            if self._clock() >= deadline:
                return False
            self._sleep(0.2)
        return True

    def _postponed(
        self,
        runner: DiagRunner | ActiveRunner,
        why: str,
        state: ActiveCheckState = ActiveCheckState.WAITING,
        what: str = "DCGM diag",
    ) -> bool:
        self.metrics.record_active_check(state)
        runner.last_skip = f"{what} postponed: {why}"
        if why != self._said:  # once per reason, not at every retry
            self._said = why
            log.info("%s", runner.last_skip)
        return False


__all__ = ["ActiveRunner", "Arrivals", "DiagWindow", "Hold"]
