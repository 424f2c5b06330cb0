"""The live agent's DCGM inputs: a health poller and a diag runner on the shared host engine.

The diag takes minutes, so it runs in its own thread: the loop (and Xid latency) never waits for it.
Two connections, as dcgm.md recommends: a long diag does not stall the health polls.
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
        return self.runner.latest

    def _run(self) -> None:
        self.running_since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = time.monotonic()
        self.metrics.record_diag_running(True)
        wanted = self.wanted_level() if self.wanted_level is not None else None
        self.runner.level = max(self.level, wanted or 0)
        ran = False
        try:
            verdict = self.runner.run_if_idle()
            ran = verdict.idle
            if verdict.idle:
                log.info(
                    f"DCGM diag level {self.runner.level} finished in {time.monotonic() - started:.0f} s"
                )
        except Exception:  # a bindings bug must not kill the agent; the check reads `unknown`
            log.exception("DCGM diag failed")
        finally:
            self.running_since = ""
            self.metrics.record_diag_running(False)
        if ran and self.on_done is not None:
            self._unread = True
            self.on_done()

    def progress(self) -> str:
        """A stable text for the condition message (no running seconds: no write every cycle)."""
        if self.runner.in_progress and self.running_since:
            return f"DCGM diag level {self.runner.level} running since {self.running_since}"
        return self.runner.last_skip or ""
