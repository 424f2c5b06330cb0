"""The idle window a DCGM diag runs in (core/active_checks.py says why): GPUs idle, a fleet slot taken,
the node held by the testing taint, GPUs still idle once it is on; while the diag runs, a pod that
arrives anyway aborts it (its result: `unknown`, never `fail`); afterwards the taint is lifted and the
slot given back, whatever happened. A window that is not there now is waited for by the caller
(tiers.py) and tried again every `node.activeChecks.retrySeconds`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from agent.core.active_checks import ActiveState, Slots
from agent.core.marks import NodeEvent
from agent.core.node_keys import NORMAL, WARNING, Reason
from agent.core.probed import ProbeError
from agent.probes.dcgm.diag import DiagRunner

log = logging.getLogger(__name__)

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
    def poll(self) -> str | None: ...


class DiagWindow:
    def __init__(
        self,
        state: ActiveState,
        slots: Slots,
        hold: Hold,
        arrivals: Arrivals,
        *,
        hold_wait_s: float = HOLD_WAIT_S,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.state, self.slots, self.hold, self.arrivals = state, slots, hold, arrivals
        self.hold_wait_s, self.poll_s = hold_wait_s, poll_s
        self._clock, self._sleep = clock, sleep
        self._said = ""

    def run(self, runner: DiagRunner) -> bool:
        """One try: True when a diag ran (finished, failed or aborted: its result is latched),
        False when the window is not there now (runner.last_skip says why)."""
        verdict = runner.idle.check()
        if not verdict.idle:
            return self._postponed(runner, verdict.reason)
        why = self.slots.acquire()
        if why is not None:
            return self._postponed(runner, why)
        try:
            self.hold.hold(True)
            if not self._wait(self.hold.held):
                return self._postponed(
                    runner, f"the testing taint was not on the Node within {self.hold_wait_s:g} s"
                )
            self.arrivals.start()
            verdict = runner.idle.check()  # a pod scheduled before the taint landed
            if not verdict.idle:
                return self._postponed(runner, verdict.reason)
            request = self.state.start()
            if request is not None and request.level:
                runner.level = max(runner.level, request.level)
            self._said = runner.last_skip = ""
            log.info("DCGM diag level %d starting: GPUs idle, fleet slot taken, node held", runner.level)
            if request is not None:
                self.state.say(
                    NodeEvent(
                        Reason.ACTIVE_CHECK_STARTED,
                        f"DCGM diag level {runner.level} started, asked by {request.who()}",
                        NORMAL,
                    )
                )
            result = runner.run(abort=self.arrivals.poll, poll_s=self.poll_s)
            runner.latest = result
            if isinstance(result, ProbeError) and runner.aborted:
                self.state.say(NodeEvent(Reason.ACTIVE_CHECK_ABORTED, result.message, WARNING))
            return True
        finally:
            self.hold.hold(False)
            # The slot is given back once the Node no longer shows the taint, so that a node that
            # takes it next never stands tainted beside this one (within hold_wait_s; after that it
            # is given back anyway: a refused write must not keep the fleet's slot).
            if not self._wait(self.hold.lifted):
                log.warning(
                    "the testing taint still shows %g s after the diag; fleet slot given back",
                    self.hold_wait_s,
                )
            self.slots.release()

    def _wait(self, done: Callable[[], bool]) -> bool:
        deadline = self._clock() + self.hold_wait_s
        while not done():
            if self._clock() >= deadline:
                return False
            self._sleep(0.2)
        return True

    def _postponed(self, runner: DiagRunner, why: str) -> bool:
        runner.last_skip = f"DCGM diag postponed: {why}"
        if why != self._said:  # once per reason, not at every retry
            self._said = why
            log.info("%s", runner.last_skip)
        return False


__all__ = ["Arrivals", "DiagWindow", "Hold"]
