"""The SDC probe as the live agent drives it: a client of the node's probe server (sdcprobe/server.py,
the optional DaemonSet) run inside the active-check window (probes/dcgm/window.py run_active: idle
GPUs, a fleet slot, the testing taint; a pod that arrives aborts it), and the tier that latches its
last completed report as the `sdc` input (checks/sdc.py).

The run takes a minute or more, so it runs in its own thread, as the DCGM diag does (dcgm/tiers.py):
the loop never waits for it. A run aborted for work did not run: the last completed report stays in
force, and it runs again once the GPUs are idle, at the pace of node.activeChecks' retry (capped at
intervals.sdcProbe). A run that ended without a report otherwise (the server unreachable, the run
failed or went past sdc.timeoutSeconds) is a ProbeError: the check reads `unknown`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from agent.config import Config
from agent.core.facts import Input
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.core.sdc_report import SdcReport, report_from_doc
from agent.probes.dcgm.idle import IdleGate, IdleVerdict

log = logging.getLogger("gpu-healthcheck.sdc")
SOURCE = "sdc probe"
TIER = "sdc-probe"  # the tier that reads it (engine/scheduler.py)


class Gate(Protocol):
    def check(self) -> IdleVerdict: ...


class SdcRunner:
    """One run on the server at *address*; `latest` keeps the last outcome (latched)."""

    def __init__(self, address: str, timeout_s: float, idle: Gate, *, call_timeout_s: float = 10.0) -> None:
        self.address, self.timeout_s, self.idle = address.rstrip("/"), timeout_s, idle
        self.call_timeout_s = call_timeout_s
        self.latest: Probed[SdcReport] = NotCaptured("sdc probe (not run yet)")
        self.in_progress = self.aborted = False
        self.last_skip = ""

    def _call(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(
            self.address + path, method=method, data=b"" if method == "POST" else None
        )
        try:
            with urllib.request.urlopen(req, timeout=self.call_timeout_s) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), json.loads(err.read() or b"{}")

    def run(self, abort: Callable[[], str | None], poll_s: float = 2.0) -> Probed[SdcReport]:
        """Start a run, ask *abort()* every *poll_s* (a pod arrived: the server kills the compute at
        once, self.aborted), and return its report or why there is none."""
        self.in_progress, self.aborted = True, False
        run_id = ""
        try:
            code, doc = self._call("POST", "/runs")
            if code != 202:
                return ProbeError(
                    SOURCE, ProbeErrorKind.TOOL_FAILED, f"the probe server refused a run: {doc}"
                )
            run_id = str(doc["id"])
            deadline = time.monotonic() + self.timeout_s
            while True:
                why = abort()
                if why is not None:
                    self.aborted = True
                    self._call("POST", f"/runs/{run_id}/abort")
                    return ProbeError(SOURCE, ProbeErrorKind.TOOL_FAILED, f"SDC probe aborted: {why}")
                _, doc = self._call("GET", f"/runs/{run_id}")
                state = doc.get("state")
                if state == "completed":
                    return report_from_doc(doc.get("report"))
                if state != "running":
                    err = doc.get("error") or state
                    return ProbeError(
                        SOURCE, ProbeErrorKind.TOOL_FAILED, f"the run ended without a report: {err}"
                    )
                if time.monotonic() >= deadline:
                    self._call("POST", f"/runs/{run_id}/abort")
                    return ProbeError(
                        SOURCE, ProbeErrorKind.TIMEOUT, f"past sdc.timeoutSeconds ({self.timeout_s:g} s)"
                    )
                time.sleep(poll_s)
        except ParseError as exc:
            return ProbeError(SOURCE, ProbeErrorKind.UNREADABLE, str(exc))
        except (OSError, ValueError, KeyError) as exc:
            if run_id and self.aborted is False:
                self._abort_quietly(run_id)
            return ProbeError(SOURCE, ProbeErrorKind.UNAVAILABLE, f"{self.address}: {exc}")
        finally:
            self.in_progress = False

    def _abort_quietly(self, run_id: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the server is gone: nothing runs there either
            self._call("POST", f"/runs/{run_id}/abort")

    def kept(self, why: str) -> None:
        """The run was aborted for work: the last completed report stays, saying why."""
        if isinstance(self.latest, SdcReport):
            self.latest = replace(self.latest, kept=why)


class Window(Protocol):
    """What the tier needs of the active-check window (probes/dcgm/window.DiagWindow)."""

    @property
    def retry_s(self) -> float: ...
    def run_active(self, runner: SdcRunner, what: str, tier: str) -> bool: ...


class SdcTier:
    """The `sdc` input: start a run in the background when due, return the latched report."""

    def __init__(
        self,
        cfg: Config,
        window: Window,
        pods_requesting_gpus: Callable[[], list[str]] | None,
        *,
        on_done: Callable[[], None] | None = None,
        idle: Gate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.window, self.on_done, self._clock = cfg, window, on_done, clock
        gate = idle or IdleGate(pods_requesting_gpus=pods_requesting_gpus)
        self.runner = SdcRunner(cfg.sdc.address, cfg.sdc.timeout_s, gate)
        self._unread = False
        self._aborts, self._due = 0, 0.0  # runs aborted for work in a row; the next not before
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def inputs(self) -> dict[Input, Callable[[], Any]]:
        return {Input.SDC: self.read}

    def read(self) -> Probed[SdcReport]:
        """A run finished since the last read: its result, without starting another; else start one
        if none runs or waits, and return the last result."""
        if self._unread:
            self._unread = False
            return self.runner.latest
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="sdc-probe", daemon=True)
            self._thread.start()
        return self.runner.latest

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        """Try until a run completes or ends without a report (an abort for work retries, paced)."""
        while not self._stop.is_set():
            wait = self._due - self._clock()
            if wait > 0:
                self._wake.wait(wait)
                continue
            try:
                ran = self.window.run_active(self.runner, "SDC probe", TIER)
            except Exception:  # a bug must not kill the agent; the input stays as it was
                log.exception("SDC probe failed")
                return
            if not ran:
                self._wake.wait(self.window.retry_s)
                continue
            if self.runner.aborted:
                self._aborts += 1
                pace = self.cfg.node.active_checks.retry_after(self._aborts, self.cfg.intervals.sdc_probe)
                self._due = self._clock() + pace
                continue
            self._aborts, self._due = 0, 0.0
            self._unread = True
            if self.on_done is not None:
                self.on_done()
            return


__all__ = ["SOURCE", "TIER", "SdcRunner", "SdcTier"]
