"""The dcgm-diag tier: run `dcgmi diag -r N` through the API on idle GPUs; latch the result until the next.

Why it looks like this (dcgm.md §0.3, §0.4, §2.2):
* DcgmDiag(timeout=N).Execute (dcgmActionValidate_v2), never RunDiagnostic (waits forever remotely);
  plus our own watchdog thread, since the timeout is client-side only.
* The heartbeat flag + a thread calling dcgmDiagSendHeartbeat: when the agent dies or gives up, the
  heartbeats stop and the engine aborts the diag (its timeout: 600 s, DCGM >= 4.4.2).
* Use a client (handle) of its own: a diag holds its request for minutes.
* A run that could not run or did not finish is a ProbeError (check `unknown`), never a pass; one
  the window aborted for work did not run (window.py keeps the last completed verdict).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.core.dcgm_report import DiagError, DiagReport, DiagResult, DiagStatus, effective_status
from agent.core.probed import NotCaptured, Probed, ProbeError, ProbeErrorKind
from agent.probes.dcgm.bindings import DCGM_FE_GPU, DCGM_FE_NONE, DCGM_ST_DIAG_ALREADY_RUNNING, error_code
from agent.probes.dcgm.client import DcgmClient, EngineUnavailable
from agent.probes.dcgm.idle import IdleGate, IdleVerdict

log = logging.getLogger(__name__)
SOURCE = "dcgm diag"
_RESULTS = {
    0: DiagStatus.PASS,
    1: DiagStatus.SKIP,
    2: DiagStatus.WARN,
    3: DiagStatus.FAIL,
    4: DiagStatus.NOT_RUN,
}
_GROUPS = {DCGM_FE_GPU: "GPU", 3: "NVSwitch", 7: "CPU"}


def _text(value: Any) -> str:
    """bytes, or a fixed-size char array (c_char*N, e.g. an item of `categories`, whose .value is bytes)."""
    raw = getattr(value, "value", value) if not isinstance(value, (bytes, str)) else value
    return raw.decode("utf-8", "replace").rstrip("\x00") if isinstance(raw, bytes) else str(raw)


def _entity(group: int, eid: int) -> str:
    if group == DCGM_FE_GPU:
        return str(eid)
    if group == DCGM_FE_NONE:
        return "node"
    return f"{_GROUPS.get(group, f'group{group}').lower()}:{eid}"


def response_to_report(resp: Any, level: int | None = None, finished_at: float | None = None) -> DiagReport:
    """Walk a c_dcgmDiagResponse_v11/v12 (tests → results/errors/info by index, dcgm.md §2.3)."""
    if not hasattr(resp, "numTests"):
        raise ValueError("unsupported diag response (expected c_dcgmDiagResponse_v11 or later)")
    results: list[DiagResult] = []
    cats = list(getattr(resp, "categories", []))
    for t in list(resp.tests)[: int(resp.numTests)]:
        name = _text(t.name)
        cat = _text(cats[t.categoryIndex]) if 0 <= int(t.categoryIndex) < len(cats) else ""
        errs = [resp.errors[i] for i in list(t.errorIndices)[: int(t.numErrors)]]
        infos = [resp.info[i] for i in list(t.infoIndices)[: int(t.numInfo)]]

        def mine(items: list[Any], group: int, eid: int) -> list[Any]:
            return [
                x for x in items if int(x.entity.entityGroupId) == group and int(x.entity.entityId) == eid
            ]

        def as_errors(items: list[Any]) -> tuple[DiagError, ...]:
            return tuple(
                DiagError(_text(e.msg), int(e.code), int(e.category), int(e.severity)) for e in items
            )

        per_entity: list[DiagResult] = []
        for ri in list(t.resultIndices)[: int(t.numResults)]:
            r = resp.results[ri]
            group, eid = int(r.entity.entityGroupId), int(r.entity.entityId)
            raw = _RESULTS.get(int(r.result), DiagStatus.UNKNOWN)
            errors = as_errors(mine(errs, group, eid))
            status = effective_status(raw, errors)
            info = tuple(_text(i.msg) for i in mine(infos, group, eid))
            per_entity.append(DiagResult(name, _entity(group, eid), status, cat, errors, info, raw.value))
        results.extend(per_entity)
        test_status = _RESULTS.get(int(t.result), DiagStatus.UNKNOWN)
        node_errs = as_errors([e for e in errs if int(e.entity.entityGroupId) == DCGM_FE_NONE])
        bad = (DiagStatus.FAIL, DiagStatus.WARN, DiagStatus.UNKNOWN)
        if test_status in bad and not any(r.status in bad for r in per_entity):
            results.append(DiagResult(name, "node", test_status, cat, node_errs, (), test_status.value))
    version = _text(getattr(resp, "dcgmVersion", "")) or None
    return DiagReport(tuple(results), "DCGM API", version, level, None, finished_at)


class DiagRunner:
    """run_if_idle() once per interval; `latest` keeps the last outcome until the next run (latched)."""

    def __init__(
        self,
        client: DcgmClient,
        idle: IdleGate,
        *,
        level: int = 2,
        timeout_s: float = 900.0,
        heartbeat_s: float = 60.0,
        watchdog_margin_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if level not in (1, 2, 3, 4):
            raise ValueError(f"diag level must be 1-4, got {level}")
        self.client, self.idle = client, idle
        self.level, self.timeout_s, self.heartbeat_s = level, timeout_s, heartbeat_s
        self.watchdog_margin_s = watchdog_margin_s  # past the API timeout, before we give up ourselves
        self._clock = clock
        self.latest: Probed[DiagReport] = NotCaptured("dcgm diag (not run yet)")
        self.in_progress = False
        self.last_skip: str = ""
        self.aborted = False  # the last run was aborted (a pod arrived): not run (window.py)

    def run_if_idle(self) -> IdleVerdict:
        verdict = self.idle.check()
        if not verdict.idle:
            self.last_skip = f"DCGM diag postponed: {verdict.reason}"
            log.info("%s", self.last_skip)
            return verdict
        self.last_skip = ""
        self.latest = self.run()
        return verdict

    def run(self, abort: Callable[[], str | None] | None = None, poll_s: float = 2.0) -> Probed[DiagReport]:
        """One diag. *abort()*, asked every *poll_s* while it runs, says why to stop it (a pod
        arrived): the diag's own connection is closed, which makes the engine abort a diag run with
        the heartbeat flag; its result is an error (never `fail`) that the window turns into "not
        run" (the last completed verdict stays)."""
        self.in_progress, self.aborted = True, False
        try:
            return self._run(abort, poll_s)
        finally:
            self.in_progress = False

    def _wait(
        self, done: threading.Event, abort: Callable[[], str | None] | None, poll_s: float
    ) -> tuple[bool, str | None]:
        """(finished, why aborted) within the API timeout and our margin past it."""
        deadline = time.monotonic() + self.timeout_s + self.watchdog_margin_s
        while True:
            left = deadline - time.monotonic()
            if done.wait(max(0.0, min(left, poll_s if abort is not None else left))):
                return True, None
            if left <= 0:
                return False, None
            why = abort() if abort is not None else None
            if why:
                return False, why

    def _run(self, abort: Callable[[], str | None] | None = None, poll_s: float = 2.0) -> Probed[DiagReport]:
        try:
            handle = self.client.handle()
            b = self.client.bindings
        except EngineUnavailable as exc:
            return ProbeError(SOURCE, ProbeErrorKind.UNAVAILABLE, str(exc))
        try:
            dd = b.DcgmDiag.DcgmDiag(testNamesStr=str(self.level), timeout=int(self.timeout_s))
        except TypeError:  # bindings without the timeout parameter: our watchdog is the only bound
            dd = b.DcgmDiag.DcgmDiag(testNamesStr=str(self.level))
        beat = hasattr(dd, "SetEnableHeartbeat") and hasattr(b.dcgm_agent, "dcgmDiagSendHeartbeat")
        if beat:
            dd.SetEnableHeartbeat(True)
        box: dict[str, Any] = {}
        done, stop = threading.Event(), threading.Event()

        def work() -> None:
            try:
                box["resp"] = dd.Execute(handle.handle)
            except BaseException as exc:  # handed to the waiting thread
                box["exc"] = exc
            finally:
                done.set()

        def heartbeat() -> None:
            while not stop.wait(self.heartbeat_s):
                try:
                    b.dcgm_agent.dcgmDiagSendHeartbeat(handle.handle)
                except Exception as exc:
                    log.warning("DCGM diag heartbeat failed: %s", exc)

        threading.Thread(target=work, name="dcgm-diag", daemon=True).start()
        if beat:
            threading.Thread(target=heartbeat, name="dcgm-diag-heartbeat", daemon=True).start()
        finished, why = self._wait(done, abort, poll_s)
        stop.set()  # no more heartbeats: an abandoned diag is aborted by the engine
        if why:
            self.aborted = True
            self.client.drop(f"diag aborted: {why}")  # its connection closed: the engine stops it
            # Not run, not "could not look": the window keeps the last completed verdict and
            # retries (window.py); this error never reaches a check.
            return ProbeError(SOURCE, ProbeErrorKind.UNAVAILABLE, f"level {self.level} diag aborted: {why}")
        if not finished:
            self.client.count_hang("dcgmActionValidate_v2", self.timeout_s + self.watchdog_margin_s)
            self.client.drop("diag past its timeout")
            return ProbeError(
                SOURCE,
                ProbeErrorKind.TIMEOUT,
                f"level {self.level} diag did not finish within {self.timeout_s:g} s; abandoned "
                "(the engine aborts it when heartbeats stop)",
            )
        if "exc" in box:
            err: BaseException = box["exc"]
            code = error_code(err)
            if code == DCGM_ST_DIAG_ALREADY_RUNNING:
                return ProbeError(
                    SOURCE, ProbeErrorKind.TOOL_FAILED, "another diag is already running on the engine"
                )
            if code in (-21, -11):
                self.client.drop(f"{type(err).__name__}: {err}")
                return ProbeError(SOURCE, ProbeErrorKind.UNAVAILABLE, self.client.reason())
            return ProbeError(
                SOURCE, ProbeErrorKind.TOOL_FAILED, f"diag could not run: {type(err).__name__}: {err}"
            )
        try:
            return response_to_report(box["resp"], self.level, self._clock())
        except (ValueError, AttributeError, IndexError, TypeError) as exc:
            return ProbeError(SOURCE, ProbeErrorKind.UNREADABLE, f"diag response unreadable: {exc}")
