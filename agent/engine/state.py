"""What the engine remembers from one cycle to the next: latched findings of this boot (restored from
the Node's results annotation after a restart), the reboot history and the trend reads (restored
across boots), the findings an operator cleared (their kernel-log lines, restored too: a restart in
the same boot must not find them again, core/clear_cover.py), and the hysteresis
that keeps a failing node tainted until recoverAfter passing gpu-tier cycles. Only pass/warn cycles
count: an unknown one (a tool unreadable, the engine down) freezes the count, since a missing signal
must never clear a taint."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.core import clear_cover
from agent.core.actions import Recommendation
from agent.core.clear_cover import CLEAR_COVER_FIELD, ClearCover
from agent.core.findings import CheckResult, Finding
from agent.core.marks import ClearRequest, NodeEvent
from agent.core.node import NodeObject
from agent.core.node_keys import CLEAR_ALL, EventReason
from agent.core.probed import Probed
from agent.core.remediation_types import RemediationCondition
from agent.core.results_doc import LAST_CLEAR_FIELD, REMEDIATION_FIELD, TAINT_FIELD
from agent.core.severity import Severity, Status
from agent.core.telemetry import Telemetry
from agent.core.trend_history import TRENDS_FIELD, TrendHistory
from agent.core.trend_history import parse as parse_trends
from agent.engine import reboot_escalation
from agent.engine.confirm import Confirmations
from agent.engine.degraded import still_shown
from agent.engine.recovery import Recovery, severity_or

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
        # Findings an operator cleared, with the evidence they had (Finding.seen): hidden until it changes.
        self.cleared: dict[str, str] = {}
        self.operator_cleared = False
        self.last_clear: dict[str, Any] | None = None  # the last clear request acted on (lastClear)
        # The kernel-log lines this boot's clears covered (clearCover): on the Node, so that they
        # never fail the node again, whatever agent reads the log from its start.
        self.cover: ClearCover | None = None
        self._told_covered: set[str] = set()  # keys whose restored cover was logged (once each)
        self._kept: list[str] = []  # of those, the ones no verdict has carried yet (history entry)
        self.legacy_clear: dict[str, Any] | None = None  # a lastClear of this boot with no clearCover
        self.taint = Recovery()  # the taint's hysteresis (node.taintMinSeverity)
        # node.remediationConditions: one hysteresis per type, at the entry's minSeverity
        self.remediation: dict[str, Recovery] = {}
        self.last_status: Status | None = None
        self.history: dict[tuple[str, str], reboot_escalation.Seen] = {}  # failing findings per GPU and boot
        self.trends = TrendHistory()  # the kept reads the trend warnings judge (core/trend_history.py)
        self.confirm = Confirmations()  # findings a transient can trip, until node.confirmAfter runs
        self._last_gpu_run_seen = -1.0

    # The taint's hysteresis under the names the engine and tests have always used.
    @property
    def taint_wanted(self) -> bool:
        return self.taint.wanted

    @taint_wanted.setter
    def taint_wanted(self, value: bool) -> None:
        self.taint.wanted = value

    @property
    def taint_severity(self) -> Severity:
        """The taint's value: the last failing severity."""
        return self.taint.severity

    @property
    def pass_streak(self) -> int:
        return self.taint.passes

    @property
    def recovery_frozen(self) -> bool:
        """The last gpu cycle while tainted was not a pass/warn."""
        return self.taint.frozen

    # ------------------------------------------------------------------ restore

    def restore(self, doc: dict[str, Any] | None, remediation: Sequence[RemediationCondition] = ()) -> None:
        """Take latches, the taint's and the remediation conditions' hysteresis and the last clear
        back from the Node's results annotation (latches: same boot only)."""
        if not doc or not isinstance(doc, dict):
            return
        same_boot = bool(self.boot_id) and doc.get("bootId") == self.boot_id
        if same_boot:  # an agent restart, not a reboot: a check failing then stays confirmed
            checks = [c for c in doc.get("checks") or [] if isinstance(c, dict)]
            self.confirm.restore(str(c.get("name")) for c in checks if c.get("status") == Status.FAIL.value)
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
        self.history = reboot_escalation.parse(doc)  # across boots: that is its point
        self.trends = parse_trends(doc.get(TRENDS_FIELD))  # across boots too (each counter knows its boot)
        failing = doc.get("status") == Status.FAIL.value
        doc_severity = severity_or(doc.get("severity"), Severity.RESET)
        # Tainted, maybe recovering or frozen: keep the count and value. Without the field but
        # failing: hysteresis survives a restart, recoverAfter passes are needed again.
        self.taint = Recovery.restore(doc.get(TAINT_FIELD), failing, doc_severity)
        entries = doc.get(REMEDIATION_FIELD)
        for entry in remediation:
            if isinstance(entries, dict):  # written by an agent that knew remediation conditions
                kept = entries.get(entry.type)
                self.remediation[entry.type] = Recovery.restore(kept, False, doc_severity)
            else:
                wanted = failing and doc_severity >= entry.min_severity
                self.remediation[entry.type] = Recovery.restore(None, wanted, doc_severity)
        clear = doc.get(LAST_CLEAR_FIELD)
        self.last_clear = clear if isinstance(clear, dict) else None
        # Kept whatever its boot: covers() holds it to its own (the boot may be read only later).
        self.cover = clear_cover.parse(doc.get(CLEAR_COVER_FIELD))
        if same_boot and CLEAR_COVER_FIELD not in doc and self.last_clear:
            self.legacy_clear = self.last_clear  # an older agent's clear: judged by the first xid run
        try:
            self.last_status = Status(str(doc.get("status")))
        except ValueError:
            self.last_status = None
        log.info("restored state from the Node", extra={"event": "restore", "status": doc.get("status")})
        if same_boot and self.latches:
            log.info(
                f"restored {len(self.latches)} latched finding(s) of this boot", extra={"event": "restore"}
            )

    def showing(self, status: Status) -> Status:
        """What the Node shows after a verdict of *status* (engine/degraded.still_shown)."""
        return still_shown(self.last_status, status)

    def shown(self, status: Status) -> Status | None:
        """The status the Node showed before this verdict; from now on, what it shows after it."""
        last, self.last_status = self.last_status, self.showing(status)
        return last

    def observe_boot(self, boot: str | None) -> None:
        """The boot id as the gpu tier read it: a new boot drops the old boot's latches."""
        if boot and self.boot_id and boot != self.boot_id:
            log.info("boot id changed: latched findings of the old boot dropped", extra={"event": "reboot"})
            self.latches.clear()
            self.cleared.clear()
        self.boot_id = boot or self.boot_id
        self.cover = clear_cover.for_boot(self.cover, self.boot_id)  # another boot's covers nothing

    # ------------------------------------------------------------------ latches

    def latch(self, res: CheckResult, stamp: str) -> None:
        """Latch the result's new latched findings (each gets an Event at the next evaluation)."""
        read = res.unknown is None and res.skipped is None
        if self.legacy_clear is not None and res.name == "xid" and read:
            # its lines stamped before the clear: covered as if this agent had cleared them
            boot_wall = time.time() - time.monotonic()  # a kmsg stamp is CLOCK_MONOTONIC seconds
            adopted = clear_cover.adopt(self.legacy_clear, self.boot_id, res.findings, boot_wall)
            self.cover = adopted or self.cover
            self.legacy_clear = None
        new = []
        for f in res.findings:
            if self.hidden(f):
                continue
            if f.latched and f.key and f.key not in self.latches and f.severity > Severity.NONE:
                latch = Latch(f.check, f.key, f.severity, stamp, f.message, f.recommendation)
                self.latches[f.key] = latch
                new.append(latch)
                if f.check == "xid" and f.key.startswith("xid/"):
                    self.metrics.record_xid(f.key.split("/")[1])
        self.new_latches.extend(new)

    def hidden(self, f: Finding) -> bool:
        """A finding an operator cleared: the same evidence as when cleared (this process), or
        kernel-log lines a clear of this boot covered (the Node's clearCover, any process)."""
        if self.cleared.get(f.key) == f.seen:
            return True
        if not clear_cover.covers(self.cover, self.boot_id, f):
            return False
        if f.key not in self._told_covered and f.key not in self.cleared:
            self._told_covered.add(f.key)  # a restarted agent met lines a clear covered: said once
            self._kept.append(f.key)
            log.info(
                f"{f.key}: its kernel-log lines up to {f.last_line} were cleared in this boot "
                "(the Node's clearCover); not a new failure",
                extra={"event": "clear-kept"},
            )
        return True

    def take_kept(self) -> tuple[str, ...]:
        """The cleared keys this process met again since the last verdict (its history entry)."""
        kept, self._kept = tuple(self._kept), []
        return kept

    def cover_document(self) -> dict[str, Any] | None:
        """The results annotation's clearCover field: this boot's cover (None: none)."""
        return clear_cover.to_doc(clear_cover.for_boot(self.cover, self.boot_id))

    def take_new_latches(self) -> list[Latch]:
        new, self.new_latches = self.new_latches, []
        return new

    def take_clear_request(
        self,
        node: Probed[NodeObject],
        annotation: str,
        results: Mapping[str, CheckResult],
        by_annotation: str | None = None,
        now: str = "",
    ) -> tuple[tuple[str, ...], NodeEvent | None]:
        """An operator's `<prefix>/clear-latched` annotation ("all" or comma-separated keys), with
        `<prefix>/clear-latched-by` (who asked and why) when `gpu-healthcheck clear` set it.

        Returns the annotation keys to remove and the LatchesCleared Event naming the latches, who
        and why; the request is kept as `last_clear` (the results annotation's `lastClear`, which
        `gpu-healthcheck status` shows for 24 h). Cleared findings stay hidden until their evidence
        changes (a new Xid line changes the count), so a cleared Xid still in the kernel ring does
        not come straight back.
        """
        if not isinstance(node, NodeObject):
            return (), None
        value = node.annotations.get(annotation)
        if value is None:
            return (), None
        wanted = [k.strip() for k in value.split(",") if k.strip()]
        keys = (
            list(self.latches)
            if value.strip().lower() == CLEAR_ALL
            else [k for k in wanted if k in self.latches]
        )
        for key in keys:
            self.cleared[key] = self.latches.pop(key).message
        self.history = reboot_escalation.forget(self.history, keys)  # a cleared latch starts afresh
        covered = [f for res in results.values() for f in res.findings if f.key in keys]
        for f in covered:
            self.cleared[f.key] = f.seen
        # Their lines, persisted: a restart, an upgrade or a rollback reads them again (U3).
        self.cover = clear_cover.extend(self.cover, self.boot_id, covered)
        self.operator_cleared = True
        request = ClearRequest.decode(node.annotations.get(by_annotation)) if by_annotation else None
        who = (
            f"by {request.by} (reason: {request.reason})"
            if request is not None
            else f"by an unnamed requester (no {by_annotation or 'clear-latched-by'} annotation: "
            "use `gpu-healthcheck clear`)"
        )
        if request is not None and request.force:
            who += f"; forced while {', '.join(request.failing) or 'a check'} still failed"
        names = ", ".join(keys) or f"none matched {value!r}"
        msg = f"cleared {len(keys)} latched finding(s): {names}; {who}"
        log.info(msg, extra={"event": "clear-latched"})
        self.last_clear = {
            "at": now,
            "by": request.by if request is not None else None,
            "reason": request.reason if request is not None else None,
            "latches": keys,
            "requested": value,
            **({"force": True, "failing": list(request.failing)} if request and request.force else {}),
        }
        drop = (annotation,) + ((by_annotation,) if by_annotation in node.annotations else ())
        return drop, NodeEvent(EventReason.LATCHES_CLEARED, msg)

    def visible(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """The results without the findings an operator cleared (a cleared Xid still in the log is no
        failure: not for the verdict, nor for the pass that lifts the validating taint)."""
        if not self.cleared and self.cover is None:
            return list(results)
        return [replace(r, findings=tuple(f for f in r.findings if not self.hidden(f))) for r in results]

    def current_results(self, latest: Mapping[str, CheckResult], order: list[str]) -> list[CheckResult]:
        """Latest results, with latched findings whose evidence is gone kept in their check."""
        results = {res.name: res for res in self.visible(list(latest.values()))}
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
        remediation: Sequence[RemediationCondition] = (),
        cause: str = "",
    ) -> bool:
        """Whether the node should be tainted after a verdict of `status`/`severity`; the
        remediation conditions' hysteresis moves in the same step (Recovery.settle), each at its own
        minSeverity. *cause*: what a failure says (kept while an entry recovers)."""
        new_cycle = self._gpu_cycle_completed(gpu_last_run)
        cleared = self.operator_cleared
        args = (status, severity, new_cycle, recover_after)
        self.taint.settle(*args, min_severity, cleared, cause)
        kept = {e.type: self.remediation.get(e.type) or Recovery() for e in remediation}
        for entry in remediation:
            kept[entry.type].settle(*args, entry.min_severity, cleared, cause)
        self.remediation = kept  # an entry no longer configured forgets its state
        self.operator_cleared = False
        return self.taint.wanted

    def recovery_note(self, recover_after: int) -> str:
        """What the condition message says of a node kept unhealthy (tainted, or labelled in mode
        `label`) while its verdict is not fail."""
        return self.taint.note(recover_after)

    def taint_document(self) -> dict[str, Any] | None:
        """The results annotation's `taint` field: present while the taint is wanted, so that a
        restarted agent keeps the taint, its value and the recovery count."""
        return self.taint.document()

    def remediation_document(self) -> dict[str, Any] | None:
        """The results annotation's `remediation` field: the entries kept unhealthy, with their
        recovery count and cause, so that a restarted agent keeps them (None: none is)."""
        docs = {t: r.document(with_cause=True) for t, r in self.remediation.items()}
        return {t: d for t, d in docs.items() if d is not None} or None

    def _gpu_cycle_completed(self, ran: float) -> bool:
        if ran != self._last_gpu_run_seen:
            self._last_gpu_run_seen = ran
            return True
        return False
