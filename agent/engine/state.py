"""What the engine remembers from one cycle to the next: latched findings of this boot (restored from
the Node's results annotation after a restart), the reboot history and the trend reads (restored
across boots), the findings an operator cleared, and the hysteresis
that keeps a failing node tainted until recoverAfter passing gpu-tier cycles. Only pass/warn cycles
count: an unknown one (a tool unreadable, the engine down) freezes the count, since a missing signal
must never clear a taint."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.core.actions import Recommendation
from agent.core.contract import CLEAR_ALL, TAINT_FIELD, NodeEvent, Reason
from agent.core.findings import CheckResult, Finding
from agent.core.model import NodeObject
from agent.core.probed import Probed
from agent.core.severity import Severity, Status
from agent.core.telemetry import Telemetry
from agent.core.trends import TRENDS_FIELD, TrendHistory
from agent.core.trends import parse as parse_trends
from agent.engine import history

log = logging.getLogger("gpu-healthcheck.engine")


@dataclass(frozen=True)
class Latch:
    check: str
    key: str
    severity: Severity
    since: str
    message: str
    next_step: Recommendation | None = None  # its action and escalation, as the finding had them

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "check": self.check,
            "key": self.key,
            "severity": self.severity.label,
            "since": self.since,
            "message": self.message,
        }
        if self.next_step is not None:
            out.update(self.next_step.as_dict())  # the shape of a check's entry
        return out


class EngineState:
    def __init__(self, boot_id: str | None, metrics: Telemetry) -> None:
        self.boot_id = boot_id
        self.metrics = metrics
        self.latches: dict[str, Latch] = {}
        self.new_latches: list[Latch] = []  # latched since the last evaluation: one Event each
        # Findings an operator cleared, with the message they had: hidden until the evidence changes.
        self.cleared: dict[str, str] = {}
        self.operator_cleared = False
        self.taint_wanted = False
        self.taint_severity = Severity.NONE  # the taint's value: the last failing severity
        self.pass_streak = 0
        self.recovery_frozen = False  # the last gpu cycle while tainted was not a pass/warn
        self.last_status: Status | None = None
        self.history: dict[tuple[str, str], history.Seen] = {}  # failing findings per GPU and boot
        self.trends = TrendHistory()  # the kept reads the trend warnings judge (core/trends.py)
        self._last_gpu_run_seen = -1.0

    # ------------------------------------------------------------------ restore

    def restore(self, doc: dict[str, Any] | None) -> None:
        """Take latches and the taint state back from the Node's results annotation (same boot only)."""
        if not doc or not isinstance(doc, dict):
            return
        same_boot = bool(self.boot_id) and doc.get("bootId") == self.boot_id
        if same_boot:
            for item in doc.get("latched") or []:
                try:
                    latch = Latch(
                        str(item["check"]),
                        str(item["key"]),
                        Severity.parse(str(item["severity"])),
                        str(item["since"]),
                        str(item["message"]),
                        Recommendation.from_dict(item),
                    )
                except (KeyError, TypeError, ValueError):
                    continue
                self.latches[latch.key] = latch
        self.history = history.parse(doc)  # across boots: that is its point
        self.trends = parse_trends(doc.get(TRENDS_FIELD))  # across boots too (each counter knows its boot)
        taint = doc.get(TAINT_FIELD)
        if isinstance(taint, dict):  # tainted, maybe recovering or frozen: keep the count and value
            self.taint_wanted = True
            self.taint_severity = _severity_or(taint.get("severity"), Severity.RESET)
            passes = taint.get("passes")
            self.pass_streak = passes if isinstance(passes, int) and passes >= 0 else 0
        elif doc.get("status") == Status.FAIL.value:
            self.taint_wanted = True  # hysteresis survives a restart: recoverAfter passes are needed again
            self.taint_severity = _severity_or(doc.get("severity"), Severity.RESET)
        try:
            self.last_status = Status(str(doc.get("status")))
        except ValueError:
            self.last_status = None
        log.info("restored state from the Node", extra={"event": "restore", "status": doc.get("status")})
        if same_boot and self.latches:
            log.info(
                f"restored {len(self.latches)} latched finding(s) of this boot", extra={"event": "restore"}
            )

    def observe_boot(self, boot: str | None) -> None:
        """The boot id as the gpu tier read it: a new boot drops the old boot's latches."""
        if boot and self.boot_id and boot != self.boot_id:
            log.info("boot id changed: latched findings of the old boot dropped", extra={"event": "reboot"})
            self.latches.clear()
            self.cleared.clear()
        self.boot_id = boot or self.boot_id

    # ------------------------------------------------------------------ latches

    def latch(self, res: CheckResult, stamp: str) -> None:
        """Latch the result's new latched findings (each gets an Event at the next evaluation)."""
        new = []
        for f in res.findings:
            if self.cleared.get(f.key) == f.message:
                continue
            if f.latched and f.key and f.key not in self.latches and f.severity > Severity.NONE:
                latch = Latch(f.check, f.key, f.severity, stamp, f.message, f.recommendation)
                self.latches[f.key] = latch
                new.append(latch)
                if f.check == "xid" and f.key.startswith("xid/"):
                    self.metrics.record_xid(f.key.split("/")[1])
        self.new_latches.extend(new)

    def take_new_latches(self) -> list[Latch]:
        new, self.new_latches = self.new_latches, []
        return new

    def take_clear_request(
        self, node: Probed[NodeObject], annotation: str, results: Mapping[str, CheckResult]
    ) -> tuple[str | None, NodeEvent | None]:
        """An operator's `<prefix>/clear-latched` annotation ("all" or comma-separated keys).

        Returns the annotation key to remove and an Event. Cleared findings stay hidden until their
        evidence changes (a new Xid line changes the count), so a cleared Xid still in the kernel
        ring does not come straight back.
        """
        if not isinstance(node, NodeObject):
            return None, None
        value = node.annotations.get(annotation)
        if value is None:
            return None, None
        wanted = [k.strip() for k in value.split(",") if k.strip()]
        keys = (
            list(self.latches)
            if value.strip().lower() == CLEAR_ALL
            else [k for k in wanted if k in self.latches]
        )
        for key in keys:
            self.cleared[key] = self.latches.pop(key).message
        self.history = history.forget(self.history, keys)  # a cleared latch starts afresh
        for res in results.values():
            for f in res.findings:
                if f.key in keys:
                    self.cleared[f.key] = f.message
        self.operator_cleared = True
        msg = f"cleared {len(keys)} latched finding(s): {', '.join(keys) or 'none matched ' + value!r}"
        log.info(msg, extra={"event": "clear-latched"})
        return annotation, NodeEvent(Reason.LATCHES_CLEARED, msg)

    def current_results(self, latest: Mapping[str, CheckResult], order: list[str]) -> list[CheckResult]:
        """Latest results, with latched findings whose evidence is gone kept in their check."""
        results = {
            name: replace(
                res, findings=tuple(f for f in res.findings if self.cleared.get(f.key) != f.message)
            )
            if self.cleared
            else res
            for name, res in latest.items()
        }
        for latch in self.latches.values():
            res = results.get(latch.check) or CheckResult(latch.check)
            if any(f.key == latch.key for f in res.findings):
                continue
            kept = Finding(
                check=latch.check,
                rule=f"{latch.check}.latched",
                severity=latch.severity,
                message=f"{latch.message} (latched since {latch.since})",
                key=latch.key,
                latched=True,
            )
            results[latch.check] = replace(res, findings=(*res.findings, kept))
        return sorted(results.values(), key=lambda r: order.index(r.name) if r.name in order else len(order))

    # ------------------------------------------------------------------ hysteresis

    def settle_taint(
        self,
        status: Status,
        severity: Severity,
        gpu_last_run: float,
        recover_after: int,
        min_severity: Severity = Severity.RESET,
    ) -> bool:
        """Whether the node should be tainted after a verdict of `status`/`severity`.

        A failure at min_severity or above (re)starts the taint. A tainted node is untainted only
        after recover_after gpu-tier cycles (gpu_last_run tells a new one) whose verdict was pass or
        warn, or at once when an operator cleared its latches. Any other cycle (unknown, or a
        failure below min_severity) freezes the count where it is: it neither advances nor resets it.
        """
        new_cycle = self._gpu_cycle_completed(gpu_last_run)
        if status is Status.FAIL and severity >= min_severity:
            self.taint_wanted, self.pass_streak, self.recovery_frozen = True, 0, False
            self.taint_severity = severity
        elif self.operator_cleared:
            self.taint_wanted, self.pass_streak = False, 0  # the operator said it is fixed: no hysteresis
            self.recovery_frozen = False
        elif self.taint_wanted and new_cycle:
            if status in (Status.PASS, Status.WARN):
                self.recovery_frozen = False
                self.pass_streak += 1
                if self.pass_streak >= recover_after:
                    self.taint_wanted, self.pass_streak = False, 0
            else:
                self.recovery_frozen = True
        self.operator_cleared = False
        return self.taint_wanted

    def recovery_note(self, recover_after: int) -> str:
        """What the condition message says of a node kept unhealthy (tainted, or labelled in mode
        `label`) while its verdict is not fail."""
        if not self.taint_wanted:
            return ""
        if self.recovery_frozen:
            return (
                f"recovery paused at {self.pass_streak}/{recover_after} passing cycles: "
                "an unknown cycle does not count as passing"
            )
        return f"recovering: {self.pass_streak}/{recover_after} passing cycles"

    def taint_document(self) -> dict[str, Any] | None:
        """The results annotation's `taint` field: present while the taint is wanted, so that a
        restarted agent keeps the taint, its value and the recovery count."""
        if not self.taint_wanted:
            return None
        return {"severity": self.taint_severity.label, "passes": self.pass_streak}

    def _gpu_cycle_completed(self, ran: float) -> bool:
        if ran != self._last_gpu_run_seen:
            self._last_gpu_run_seen = ran
            return True
        return False


def _severity_or(text: Any, default: Severity) -> Severity:
    try:
        sev = Severity.parse(str(text))
    except ValueError:
        return default
    return sev if sev >= Severity.RESET else default
