"""The agent's engine: tiers on their intervals, the kernel log followed as it is written, latched
findings per boot, hysteresis before an untaint, and one verdict turned into Marks for the Node.

Each tier refreshes only its own inputs; a check reads the freshest value of every input it needs
(the xid check maps PCI ids to GPUs with the gpu tier's last inventory, not a new nvidia-smi run).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agent.checks.registry import CHECKS, run_checks
from agent.config import Config
from agent.core.contract import (
    CLEAR_ALL,
    CONDITION_MESSAGE_MAX,
    NORMAL,
    WARNING,
    Keys,
    Marks,
    NodeEvent,
    Reason,
    encode,
    now_iso,
    results_document,
)
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding, Verdict
from agent.core.model import NodeObject, RdmaSample
from agent.core.probed import NotCaptured, Probed, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.engine.verdict import decide
from agent.probes.bounded import Bounded, StillStuck, TimedOut
from agent.probes.source import Source, assemble_facts, resolve_instance_type, source_readers

log = logging.getLogger("gpu-healthcheck.engine")

TIER_INPUTS: dict[str, tuple[Input, ...]] = {
    "gpu": (Input.GPUS,),
    "xid": (Input.KERNEL,),
    "efa": (Input.RDMA,),
    "topology": (Input.TOPO, Input.NVLINK),
    "dcgm-health": (Input.DCGM_HEALTH,),
    "dcgm-diag": (Input.DCGM_DIAG,),
}
TIER_INTERVAL = {
    "gpu": "gpu",
    "xid": "gpu",
    "efa": "efa",
    "topology": "topology",
    "dcgm-health": "dcgmHealth",
    "dcgm-diag": "dcgmDiag",
}


@dataclass(frozen=True)
class Latch:
    check: str
    key: str
    severity: Severity
    since: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {
            "check": self.check,
            "key": self.key,
            "severity": self.severity.label,
            "since": self.since,
            "message": self.message,
        }


class Engine:
    def __init__(
        self,
        source: Source,
        cfg: Config,
        *,
        metrics: Telemetry | None = None,
        node_getter: Callable[[], Probed[NodeObject]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        extra_inputs: dict[str, Callable[[], Any]] | None = None,
        progress: Callable[[], str] | None = None,
    ) -> None:
        """extra_inputs override how an input is read (the live agent's DCGM poller and diag runner);
        progress() adds a line to the condition message (a DCGM diag in progress)."""
        self.source = source
        self.cfg = cfg
        self.metrics: Telemetry = metrics or NoTelemetry()
        self.node_getter = node_getter
        self.extra_inputs = extra_inputs or {}
        self.progress = progress
        self.clock = clock
        self.rng = rng or random.Random()
        self.inputs: dict[Input, Any] = {}
        self.results: dict[str, CheckResult] = {}
        self.result_at: dict[str, str] = {}
        self.last_run: dict[str, float] = {}
        self.next_due: dict[str, float] = dict.fromkeys(TIER_INPUTS, 0.0)  # first run at start
        self.latches: dict[str, Latch] = {}
        self.boot_id: str | None = source.boot_id()
        self.rdma_previous: RdmaSample | None = None
        self.taint_wanted = False
        self.pass_streak = 0
        self.last_status: Status | None = None
        self.last_evaluated_at = ""
        self.heartbeat = clock()
        self.evaluations = 0
        self._new_latches: list[Latch] = []
        # Findings an operator cleared, with the message they had: hidden until the evidence changes.
        self.cleared: dict[str, str] = {}
        self.operator_cleared = False
        self._reads = Bounded()  # per input: a read stuck past its limit is parked, not restarted
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
                    )
                except (KeyError, TypeError, ValueError):
                    continue
                self.latches[latch.key] = latch
        if doc.get("status") == Status.FAIL.value:
            self.taint_wanted = True  # hysteresis survives a restart: recoverAfter passes are needed again
        try:
            self.last_status = Status(str(doc.get("status")))
        except ValueError:
            self.last_status = None
        log.info("restored state from the Node", extra={"event": "restore", "status": doc.get("status")})
        if same_boot and self.latches:
            log.info(
                f"restored {len(self.latches)} latched finding(s) of this boot", extra={"event": "restore"}
            )

    # ------------------------------------------------------------------ scheduling

    def interval(self, tier: str) -> float:
        return float(self.cfg.get(f"intervals.{TIER_INTERVAL[tier]}"))

    def reschedule_all(self) -> None:
        """After a config change: a shorter interval takes effect at once."""
        for tier in TIER_INPUTS:
            if tier in self.last_run:
                self.next_due[tier] = min(self.next_due[tier], self.last_run[tier] + self.interval(tier))

    def due_tiers(self, now: float) -> list[str]:
        return [t for t, due in self.next_due.items() if due <= now]

    def seconds_to_next(self, now: float) -> float:
        return max(0.0, min(self.next_due.values()) - now)

    # ------------------------------------------------------------------ running

    def _read(self, name: Input) -> Any:
        reader = self.extra_inputs.get(name)
        if reader is None:
            readers: dict[Input, Callable[[], Any]] = {
                **source_readers(self.source),
                Input.DCGM_HEALTH: lambda: NotCaptured("dcgm health (no host engine configured)"),
            }
            reader = readers[name]
        value = self._bounded(name.value, reader)
        if isinstance(value, ProbeError):
            self.metrics.record_probe_error(name.value, value.kind.value)
        return value

    def _bounded(self, name: str, reader: Callable[[], Any]) -> Any:
        """Read one input within `timeouts.check`: a probe stuck in the kernel (a sysfs read of a dying
        device) costs one parked thread and an `unknown`, never the loop. A read still stuck from
        last time is not started again."""
        limit = float(self.cfg.get("timeouts.check"))

        def guarded() -> Any:
            try:
                return reader()
            except Exception as exc:  # a probe bug must not stop the loop: record "could not look"
                log.exception("probe failed", extra={"tier": name})
                return ProbeError(
                    name, ProbeErrorKind.UNREADABLE, f"internal error: {type(exc).__name__}: {exc}"
                )

        try:
            return self._reads.run(name, guarded, limit, thread_name=f"probe-{name}")
        except StillStuck:
            return ProbeError(
                name, ProbeErrorKind.TIMEOUT, f"still stuck from an earlier read (> {limit:g} s)"
            )
        except TimedOut:
            log.error(f"probe {name} did not finish in {limit:g} s", extra={"tier": name})
            return ProbeError(name, ProbeErrorKind.TIMEOUT, f"did not finish in {limit:g} s")

    def run_tier(self, tier: str) -> list[CheckResult]:
        started = self.clock()
        if tier == "efa":
            prev = self.inputs.get(Input.RDMA)
            self.rdma_previous = prev if isinstance(prev, RdmaSample) else self.rdma_previous
        for name in TIER_INPUTS[tier]:
            self.inputs[name] = self._read(name)
        if tier == "gpu":
            boot = self.source.boot_id()
            if boot and self.boot_id and boot != self.boot_id:
                log.info(
                    "boot id changed: latched findings of the old boot dropped", extra={"event": "reboot"}
                )
                self.latches.clear()
                self.cleared.clear()
            self.boot_id = boot or self.boot_id
        specs = [s for s in CHECKS if s.tier == tier and self.cfg.enabled(s.name)]
        results = run_checks(specs, self.facts(), self.cfg)
        stamp = now_iso()
        for res in results:
            self.results[res.name] = res
            self.result_at[res.name] = stamp
            self._latch(res, stamp)
            log.debug(res.message, extra={"check": res.name, "status": res.status.value, "tier": tier})
        for spec in CHECKS:  # a check switched off in config no longer counts
            if not self.cfg.enabled(spec.name):
                self.results.pop(spec.name, None)
        self.metrics.record_results(results)
        now = self.clock()
        self.last_run[tier] = now
        jitter = self.interval(tier) * float(self.cfg.get("jitterFraction")) * self.rng.random()
        self.next_due[tier] = now + self.interval(tier) + jitter
        self.metrics.record_tier_run(tier)
        log.info(
            f"tier {tier}: {len(results)} check(s) in {(now - started) * 1000:.1f} ms",
            extra={"tier": tier, "durationMs": round((now - started) * 1000, 1)},
        )
        return results

    def _node(self) -> Probed[NodeObject]:
        """The Node: the writer's watched copy in the agent, the snapshot's node.json otherwise."""
        return self.node_getter() if self.node_getter else self.source.node()

    def facts(self) -> NodeFacts:
        """Each input as its tier last read it; the Node as it is now."""
        return assemble_facts(
            self.source,
            self.cfg,
            {**self.inputs, Input.NODE: self._node()},
            boot_id=self.boot_id,
            rdma_previous=self.rdma_previous,
        )

    def _latch(self, res: CheckResult, stamp: str) -> list[Latch]:
        new = []
        for f in res.findings:
            if self.cleared.get(f.key) == f.message:
                continue
            if f.latched and f.key and f.key not in self.latches and f.severity > Severity.NONE:
                latch = Latch(f.check, f.key, f.severity, stamp, f.message)
                self.latches[f.key] = latch
                new.append(latch)
                if f.check == "xid" and f.key.startswith("xid/"):
                    self.metrics.record_xid(f.key.split("/")[1])
        self._new_latches.extend(new)
        return new

    def take_clear_request(self, node: Probed[NodeObject]) -> tuple[str | None, NodeEvent | None]:
        """An operator's `<prefix>/clear-latched` annotation ("all" or comma-separated keys).

        Returns the annotation key to remove and an Event. Cleared findings stay hidden until their
        evidence changes (a new Xid line changes the count), so a cleared Xid still in the kernel
        ring does not come straight back.
        """
        if not isinstance(node, NodeObject):
            return None, None
        ann = Keys(str(self.cfg.get("prefix"))).clear_latched
        value = node.annotations.get(ann)
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
        for res in self.results.values():
            for f in res.findings:
                if f.key in keys:
                    self.cleared[f.key] = f.message
        self.operator_cleared = True
        msg = f"cleared {len(keys)} latched finding(s): {', '.join(keys) or 'none matched ' + value!r}"
        log.info(msg, extra={"event": "clear-latched"})
        return ann, NodeEvent(Reason.LATCHES_CLEARED, msg)

    # ------------------------------------------------------------------ verdict

    def current_results(self) -> list[CheckResult]:
        """Latest results, with latched findings whose evidence is gone kept in their check."""
        order = [s.name for s in CHECKS]
        results = {
            name: replace(
                res, findings=tuple(f for f in res.findings if self.cleared.get(f.key) != f.message)
            )
            if self.cleared
            else res
            for name, res in self.results.items()
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

    def evaluate(self) -> tuple[Verdict, Marks]:
        node = self._node()
        drop, clear_event = self.take_clear_request(node)
        results = self.current_results()
        verdict = decide(results)
        self.metrics.record_verdict(verdict.status, results)
        # Hysteresis: a failing node is untainted only after recoverAfter passing gpu-tier cycles.
        if verdict.status is Status.FAIL:
            self.taint_wanted, self.pass_streak = True, 0
        elif self.operator_cleared:
            self.taint_wanted, self.pass_streak = False, 0  # the operator said it is fixed: no hysteresis
        elif self.taint_wanted and self._gpu_cycle_completed():
            self.pass_streak += 1
            if self.pass_streak >= int(self.cfg.get("node.recoverAfter")):
                self.taint_wanted, self.pass_streak = False, 0
        self.operator_cleared = False
        self.metrics.record_taint_wanted(self.taint_wanted)
        events = self._events(verdict) + ((clear_event,) if clear_event else ())
        self.last_status = verdict.status
        self.evaluations += 1
        self.heartbeat = self.clock()
        stamp = now_iso()
        doc = results_document(
            verdict,
            checked_at=stamp,
            boot_id=self.boot_id,
            instance_type=resolve_instance_type(self.source, self.cfg, node, None)[0],
            latched=[latch.as_dict() for latch in self.latches.values()],
            check_times=self.result_at,
        )
        worst = verdict.worst
        message = f"{verdict.status.value}: " + (
            f"{worst.check}: {worst.message}"
            if worst is not None and worst.severity > Severity.NONE
            else "; ".join(f"{r.name}: {r.message}" for r in results if r.status is Status.UNKNOWN)
            or "all checks passed"
        )
        doing = self.progress() if self.progress else ""
        if doing and doing != "idle":
            message = f"{message} ({doing})"
        marks = Marks(
            status=verdict.status,
            severity=verdict.severity,
            results_json=encode(doc),
            taint=self.taint_wanted,
            condition_message=message[:CONDITION_MESSAGE_MAX],
            events=events,
            drop_annotations=(drop,) if drop else (),
        )
        return verdict, marks

    def _gpu_cycle_completed(self) -> bool:
        ran = self.last_run.get("gpu", -1.0)
        if ran != self._last_gpu_run_seen:
            self._last_gpu_run_seen = ran
            return True
        return False

    def _events(self, verdict: Verdict) -> tuple[NodeEvent, ...]:
        events: list[NodeEvent] = []
        if verdict.status is not self.last_status:
            worst = verdict.worst
            detail = f": {worst.check}: {worst.message}" if worst is not None else ""
            was = self.last_status.value if self.last_status else "none"
            kind = WARNING if verdict.status in (Status.FAIL, Status.UNKNOWN) else NORMAL
            events.append(
                NodeEvent(Reason.GPU_HEALTH_CHANGED, f"{was} → {verdict.status.value}{detail}", kind)
            )
        for latch in self._new_latches:
            events.append(
                NodeEvent(Reason.LATCHED_FINDING, f"{latch.severity.label}: {latch.message}", WARNING)
            )
        self._new_latches = []
        return tuple(events)


def fingerprint(marks: Marks) -> str:
    """What makes a write necessary: everything but timestamps and durations."""
    doc = json.loads(marks.results_json)
    doc.pop("checkedAt", None)
    for c in doc.get("checks", []):
        c.pop("at", None)
        c.pop("durationMs", None)
    return "|".join(
        (
            marks.status.value,
            marks.severity.label,
            str(marks.taint),
            marks.condition_status,
            marks.condition_reason,
            marks.condition_message,
            encode(doc),
        )
    )
