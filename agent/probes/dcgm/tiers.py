"""The live agent's DCGM inputs: a health poller and a diag runner on the shared host engine.

The diag takes minutes, so it runs in its own thread: the loop (and Xid latency) never waits for it.
Two connections, as dcgm.md recommends: a long diag does not stall the health polls. With a window
(probes/dcgm/window.py: a fleet slot, the testing taint, pods arriving) a diag that is due waits in
that thread for the next idle window, trying again every `window.retry_s` or when woken (an operator's
request), until one runs. One the window aborted for work (a pod arrived) runs again: the thread
waits until its retry is due (ActiveState.retry), then for an idle window as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from agent.config import Config
from agent.core.dcgm_report import DiagReport
from agent.core.facts import Input
from agent.core.probed import Probed
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.probes.dcgm.client import DcgmClient
from agent.probes.dcgm.diag import DiagRunner
from agent.probes.dcgm.health import HealthPoller
from agent.probes.dcgm.idle import IdleGate
from agent.probes.dcgm.window import DiagWindow

log = logging.getLogger("gpu-healthcheck.dcgm")


class DcgmTiers:
    def __init__(
        self,
        cfg: Config,
        pods_requesting_gpus: Callable[[], list[str]] | None,
        metrics: Telemetry | None = None,
        engines_on_node: Callable[[], list[str]] | None = None,
        *,
        wanted_level: Callable[[], int | None] | None = None,
        on_done: Callable[[], None] | None = None,
        window: DiagWindow | None = None,
    ) -> None:
        """wanted_level(): the diag level a pending validation needs (node.validate.diagLevel; None
        once validated): the next diag runs at least that deep. on_done(): a diag finished (the
        agent reads it at once instead of one dcgmDiag interval later)."""
        self.level = cfg.dcgm.diag_level  # dcgm.diagLevel: the level of a routine diag
        self.wanted_level = wanted_level
        self.on_done = on_done
        self._unread = False  # a finished diag the tier has not read yet
        self.metrics: Telemetry = metrics or NoTelemetry()
        dcgm = cfg.dcgm
        address, timeout, grace = dcgm.address, dcgm.connect_timeout, dcgm.grace_seconds

        def client() -> DcgmClient:
            return DcgmClient(
                address,
                timeout,
                grace,
                call_timeout_s=dcgm.call_timeout,
                on_hang=self.metrics.record_dcgm_call_hang,
            )

        self.health = HealthPoller(client(), engines_on_node=engines_on_node)
        self.runner = DiagRunner(
            client(),
            IdleGate(pods_requesting_gpus=pods_requesting_gpus),
            level=dcgm.diag_level,
            timeout_s=dcgm.diag_timeout,
            heartbeat_s=dcgm.heartbeat_seconds,
        )
        self.window = window
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self.running_since: str = ""

    def inputs(self) -> dict[Input, Callable[[], Any]]:
        return {Input.DCGM_HEALTH: self.health.poll, Input.DCGM_DIAG: self.diag}

    def diag(self) -> Probed[DiagReport]:
        """Start a diag in the background if none runs; return the latched result of the last one.
        A diag that finished since the last read is read first, without starting another."""
        if self._unread:
            self._unread = False
            return self.runner.latest
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="dcgm-diag", daemon=True)
            self._thread.start()
        elif self.window is not None and self.window.state.pending is not None:
            self._wake.set()  # an operator's request while it waits for a window: try now
        return self.runner.latest

    @property
    def waiting(self) -> bool:
        """A diag is due and waits for an idle window (its thread alive, no diag running)."""
        return self._thread is not None and self._thread.is_alive() and not self.runner.in_progress

    def stop(self) -> None:
        """A reload rebuilt the tiers: a diag waiting for a window stops waiting (one running
        finishes on its own)."""
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        """Try until a diag runs (or the tiers stop); a request that came meanwhile, or the retry of
        one aborted for work, runs next, once the loop has read this one's result."""
        while not self._stop.is_set():
            due = self._retry_in()
            if due > 0:  # an aborted diag's retry is not due yet; a request wakes it
                self._wake.wait(due)
                self._wake.clear()
                continue
            if not self._attempt():
                if self.window is None or self._stop.is_set():
                    return
                self._wake.wait(self.window.retry_s)
                self._wake.clear()
                continue
            if self.on_done is not None:
                self._unread = True
                self.on_done()
            if self.window is None or (self.window.state.pending is None and self.window.state.retry is None):
                return
            deadline = time.monotonic() + 60.0
            while self._unread and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.2)

    def _retry_in(self) -> float:
        """Seconds until the retry of a diag aborted for work is due (0: none waits, or due, or an
        operator's request came: that one tries now)."""
        if self.window is None or self.window.state.pending is not None:
            return 0.0
        retry = self.window.state.retry
        return max(0.0, retry.due - time.monotonic()) if retry is not None else 0.0

    def _attempt(self) -> bool:
        """One try at a diag: True when one ran (its result is latched in the runner)."""
        self._wake.clear()
        self.running_since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = time.monotonic()
        self.metrics.record_diag_running(True)
        wanted = self.wanted_level() if self.wanted_level is not None else None
        self.runner.level = max(self.level, wanted or 0)
        ran = False
        try:
            ran = self.window.run(self.runner) if self.window is not None else self.runner.run_if_idle().idle
            if ran:
                how = "aborted after" if self.runner.aborted else "finished in"
                log.info(f"DCGM diag level {self.runner.level} {how} {time.monotonic() - started:.0f} s")
        except Exception:  # a bindings bug must not kill the agent; the check reads `unknown`
            log.exception("DCGM diag failed")
        finally:
            self.running_since = ""
            self.metrics.record_diag_running(False)
        return ran

    def progress(self) -> str:
        """A stable text for the condition message (no running seconds: no write every cycle)."""
        if self.runner.in_progress and self.running_since:
            return f"DCGM diag level {self.runner.level} running since {self.running_since}"
        return self.runner.last_skip or ""
