"""The agent's engine: tiers on their intervals (scheduler), the kernel log followed as it is written,
latched findings per boot and hysteresis before an untaint (state), and one verdict turned into
Marks for the Node.

Each tier refreshes only its own inputs; a check reads the freshest value of every input it needs
(the xid check maps PCI ids to GPUs with the gpu tier's last inventory, not a new nvidia-smi run).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agent.checks.registry import CHECKS, RULES, run_checks
from agent.config import Config
from agent.core import trend_history
from agent.core.active_checks import ActiveState
from agent.core.device_scope import confined_scope, warn_scope
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Verdict
from agent.core.gpu import GpuInventory
from agent.core.gpu_stall import GpuActivity
from agent.core.marks import Marks, NodeEvent
from agent.core.node import NodeObject
from agent.core.node_keys import CONDITION_MESSAGE_MAX, MODE_LABEL, MODE_TAINT, NORMAL, WARNING, Keys, Reason
from agent.core.probed import Probed, ProbeError, ProbeErrorKind
from agent.core.results_doc import VALIDATED_FIELD, encode, now_iso, results_document, stale_after_s
from agent.core.severity import Severity, Status
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.core.workloads import GpuIdentity, gpu_holders
from agent.engine import active, reboot_escalation, stalls
from agent.engine.gpu_verdicts import gpu_verdicts, pods_text
from agent.engine.history_annotation_reads import history_key, repair_escalation, risk_label
from agent.engine.remediation import describe, remediation_marks
from agent.engine.rollout import rollout_fields
from agent.engine.scheduler import TIER_INPUTS, Scheduler
from agent.engine.state import EngineState, Latch
from agent.engine.validation import CLEAR, REBOOT, Validation, step
from agent.engine.verdict import decide
from agent.probes.bounded import Bounded, StillStuck, TimedOut
from agent.probes.inputs import keep_previous_reads, record_reads, source_readers, unread_readers
from agent.probes.source import Source, assemble_facts, resolve_instance_type, with_read

log = logging.getLogger("gpu-healthcheck.engine")


class Engine:
    def __init__(
        self,
        source: Source,
        cfg: Config,
        *,
        metrics: Telemetry | None = None,
        node_getter: Callable[[], Probed[NodeObject]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        extra_inputs: dict[Input, Callable[[], Any]] | None = None,
        progress: Callable[[], str] | None = None,
        workloads: Callable[[], Any] | None = None,
    ) -> None:
        """extra_inputs override how an input is read (the live agent's DCGM poller and diag runner);
        progress() adds a line to the condition message (a DCGM diag in progress); wall() stamps the
        trend reads (epoch seconds: they outlive the process)."""
        self.source = source
        self.metrics: Telemetry = metrics or NoTelemetry()
        self.schedule = Scheduler(cfg, rng or random.Random())
        self.state = EngineState(source.boot_id(), self.metrics)
        self.cfg = cfg
        self.node_getter = node_getter
        self.extra_inputs = extra_inputs or {}
        self.progress = progress
        self.workloads = workloads  # the kubelet's device holders (probes/pod_resources.list_devices)
        self.clock = clock
        self.wall = wall
        self.inputs: dict[Input, Any] = {}
        self.results: dict[str, CheckResult] = {}
        self.result_at: dict[str, str] = {}
        self.previous: dict[Input, Any] = {}  # the last read that worked of each input whose spec keeps one
        self.heartbeat = clock()
        self.evaluations = 0
        self._reads = Bounded()  # per input: a read stuck past its limit is parked, not restarted
        self._readers: dict[Input, Callable[[], Any]] = {}
        self.validation = Validation(reset_at=wall())  # the validating taint (engine/validation.py)
        self.active: ActiveState | None = None  # active checks (engine/active.py); the wiring sets it
        self.activity = GpuActivity()  # recent samples per GPU for gpu.stalled (engine/stalls.py)
        self._stalled: set[str] = set()  # the stall findings of the last verdict (its Events)
        self.set_inputs(self.extra_inputs, progress)

    def set_inputs(
        self, extra_inputs: dict[Input, Callable[[], Any]], progress: Callable[[], str] | None
    ) -> None:
        """How inputs are read beyond the source; a reload that rebuilt the DCGM client calls it again."""
        self.extra_inputs, self.progress = extra_inputs, progress
        self._readers = {**unread_readers(), **source_readers(self.source), **extra_inputs}

    @property
    def cfg(self) -> Config:
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: Config) -> None:
        """A reloaded config: the scheduler reads its intervals from it too (then reschedule_all())."""
        self._cfg = cfg
        self.schedule.cfg = cfg

    # ------------------------------------------------------------------ state (agent.engine.state)

    @property
    def latches(self) -> dict[str, Latch]:
        return self.state.latches

    @property
    def taint_wanted(self) -> bool:
        return self.state.taint_wanted

    @property
    def boot_id(self) -> str | None:
        return self.state.boot_id

    def restore(self, doc: dict[str, Any] | None) -> None:
        """Take latches, the taint's and the remediation conditions' hysteresis and the last clear back
        from the Node's results annotation (latches: same boot only)."""
        self.state.restore(doc, self.cfg.node.remediation_conditions)
        self.validation.restore(doc, self.boot_id, VALIDATED_FIELD)

    # ------------------------------------------------------------------ scheduling (agent.engine.scheduler)

    @property
    def last_run(self) -> dict[str, float]:
        return self.schedule.last_run

    @property
    def next_due(self) -> dict[str, float]:
        return self.schedule.next_due

    def interval(self, tier: str) -> float:
        return self.schedule.interval(tier)

    def reschedule_all(self) -> None:
        """After a config change: a shorter interval takes effect at once."""
        self.schedule.reschedule_all()

    def due_tiers(self, now: float) -> list[str]:
        return self.schedule.due_tiers(now)

    def seconds_to_next(self, now: float) -> float:
        return self.schedule.seconds_to_next(now)

    # ------------------------------------------------------------------ running

    def _read(self, name: Input) -> Any:
        value = self._bounded(name.value, self._readers[name])
        if isinstance(value, ProbeError):
            self.metrics.record_probe_error(name.value, value.kind.value)
        return value

    def _bounded(self, name: str, reader: Callable[[], Any]) -> Any:
        """Read one input within `timeouts.check`: a probe stuck in the kernel (a sysfs read of a dying
        device) costs one parked thread and an `unknown`, never the loop. A read still stuck from
        last time is not started again."""
        limit = self.cfg.timeouts.check

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
        names = TIER_INPUTS[tier]
        keep_previous_reads(self.previous, self.inputs, names)
        for name in names:
            self.inputs[name] = self._read(name)
        record_reads(self.metrics, self.inputs, names)
        facts = self.facts()
        if tier == "gpu":
            was = self.boot_id
            self.state.observe_boot(self.source.boot_id())
            if was and self.boot_id != was:
                self.validate_again(REBOOT)
            # One read per gpu cycle, kept when due: the trend checks below judge the kept reads.
            t = self.cfg.trends
            facts = replace(facts, boot_id=self.boot_id)
            facts = with_read(
                facts, self.state.trends, self.wall(), t.read_spacing_s, t.keep_reads, t.clock_busy_percent
            )
            self.state.trends = facts.trends
            holders = self._holders if self.workloads is not None else None
            self.activity = stalls.observe(self.activity, facts.gpus, self.cfg, holders, int(self.wall()))
            facts = replace(facts, activity=self.activity)
        specs = [s for s in CHECKS if s.tier == tier and self.cfg.enabled(s.name)]
        results = run_checks(specs, facts, self.cfg)  # below: confirmAfter (engine/confirm.py)
        results = self.state.confirm.judge(results, self.cfg.node.confirm_after, RULES)
        stamp = now_iso()
        changed = [
            r.name
            for r in results
            if (old := self.results.get(r.name)) is None or (old.status, old.message) != (r.status, r.message)
        ]
        for res in results:
            self.results[res.name] = res
            self.result_at[res.name] = stamp
            self.state.latch(res, stamp)
            log.debug(res.message, extra={"check": res.name, "status": res.status.value, "tier": tier})
        for spec in CHECKS:  # a check switched off in config no longer counts
            if not self.cfg.enabled(spec.name):
                self.results.pop(spec.name, None)
        self.validation.ran(tier, results, self.inputs, self.cfg.node.validate.diag_level)
        now = self.clock()
        self.schedule.ran(tier, now)
        self.metrics.record_tier_run(tier, now - started)
        # Quiet when nothing changed: an idle agent's log holds what happened, not that it looked.
        log.log(
            logging.INFO if changed else logging.DEBUG,
            f"tier {tier}: {len(results)} check(s) in {(now - started) * 1000:.1f} ms"
            + (f"; changed: {', '.join(changed)}" if changed else ""),
            extra={"tier": tier, "durationMs": round((now - started) * 1000, 1)},
        )
        return results

    def _node(self) -> Probed[NodeObject]:
        """The Node: the writer's watched copy in the agent, the snapshot's node.json otherwise."""
        return self.node_getter() if self.node_getter else self.source.node()

    def facts(self) -> NodeFacts:
        """Each input as its tier last read it; the Node as it is now; the kept trend reads."""
        facts = assemble_facts(
            self.source,
            self.cfg,
            {**self.inputs, Input.NODE: self._node()},
            boot_id=self.boot_id,
            previous=self.previous,
        )
        return replace(facts, trends=self.state.trends, activity=self.activity)

    # ------------------------------------------------------------------ verdict

    def current_results(self) -> list[CheckResult]:
        """Latest results, with latched findings whose evidence is gone kept in their check."""
        return self.state.current_results(self.results, [s.name for s in CHECKS])

    def take_clear_request(self, node: Probed[NodeObject]) -> tuple[tuple[str, ...], NodeEvent | None]:
        """An operator's `<prefix>/clear-latched` annotation (and who asked, `clear-latched-by`): the
        keys to remove and the LatchesCleared Event."""
        keys = Keys(self.cfg.prefix)
        return self.state.take_clear_request(
            node, keys.clear_latched, self.results, keys.clear_latched_by, now_iso()
        )

    def validate_again(self, why: str) -> None:
        """The validating taint's pass starts over (engine/validation.py): every tier runs at once."""
        self.validation.reset(self.wall(), why)
        self.schedule.next_due.update(dict.fromkeys(self.schedule.next_due, 0.0))

    def evaluate(self) -> tuple[Verdict, Marks]:
        node = self._node()
        drop, clear_event = self.take_clear_request(node)
        hold = active.step(self.active, node, self.cfg.prefix, self.cfg.node.mode, self.schedule.next_due)
        if clear_event is not None:
            self.validate_again(CLEAR)
        results = self.current_results()
        after = self.cfg.node.escalate_after_reboots
        gpus_seen = self.inputs.get(Input.GPUS)
        self.state.history = reboot_escalation.record(
            self.state.history, results, self.boot_id, gpus_seen, after + 1
        )
        results = reboot_escalation.escalate(results, self.state.history, gpus_seen, after)
        cleared = clear_event is not None
        results = repair_escalation(results, node, self.cfg, self.boot_id, self.wall(), cleared)
        verdict = decide(results)
        self.metrics.record_verdict(verdict.status, results)
        # Hysteresis: a failing node is untainted only after recoverAfter passing gpu-tier cycles.
        policy = self.cfg.node
        recover_after = policy.recover_after
        wanted = self.state.settle_taint(
            verdict.status,
            verdict.severity,
            self.last_run.get("gpu", -1.0),
            recover_after,
            policy.taint_min_severity,
            policy.remediation_conditions,
            describe(verdict),
        )
        taint = wanted and policy.mode == MODE_TAINT  # observe and label modes never taint
        self.metrics.record_taint_wanted(taint)
        holders = self._holders if self.workloads is not None else None
        gpus = gpu_verdicts(
            results, self.inputs.get(Input.GPUS), verdict.status, holders, self.inputs.get(Input.DRA)
        )
        events = self._events(verdict, gpus) + ((clear_event,) if clear_event else ())
        stalled, self._stalled = stalls.stall_events(results, self._stalled)
        events += stalled + hold.events
        gate = step(self, node, verdict.status, wanted)  # the validating taint (engine/validation.py)
        events += gate.events
        self.state.last_status = verdict.status
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
            taint=self.state.taint_document(),
            stale_after=stale_after_s(self.cfg.intervals.gpu),
            gpus=gpus,
            history=[seen.as_dict() for seen in self.state.history.values()],
            trends=trend_history.to_doc(self.state.trends),
            remediation=self.state.remediation_document(),
            last_clear=self.state.last_clear,
            rollout=rollout_fields(self.cfg, self.state.taint, self.state.remediation),
            validated=self.validation.record,
            validating=self.validation.document(self.boot_id),
        )
        self.metrics.record_validating(self.validation.since, self.validation.waiting)
        worst = verdict.worst
        # The recovery note goes first: a long list of unknown checks must not cut it off.
        note = self.state.recovery_note(recover_after) if verdict.status is not Status.FAIL else ""
        note = "; ".join(n for n in (note, gate.note) if n)  # what the validating taint waits for
        message = verdict.status.value + (f" ({note})" if note else "") + ": "
        message += (
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
            taint=taint,
            condition_message=message[:CONDITION_MESSAGE_MAX],
            events=events,
            drop_annotations=drop + hold.drop,
            taint_severity=self.state.taint_severity if wanted else None,
            taint_effect=policy.effect_for(self.state.taint_severity),
            unhealthy_label=wanted and policy.mode == MODE_LABEL,
            trends_digest=trend_history.counters_digest(self.state.trends),
            remediation=remediation_marks(
                policy.remediation_conditions,
                self.state.remediation,
                verdict,
                mode=policy.mode,
                recover_after=recover_after,
            ),
            worst_key=history_key(verdict),
            boot_id=self.boot_id or "",
            scope=confined_scope(results, gpus_seen, policy.taint_min_severity),
            warn_scope=warn_scope(results, gpus_seen) if policy.mode == MODE_TAINT else None,
            validating=gate.wish,
            testing=hold.testing,
            risk=risk_label(node, self.cfg, verdict.status, self.boot_id, stamp, cleared),
        )
        return verdict, marks

    def _holders(self) -> dict[int, tuple[str, ...]]:
        """GPU index -> the containers holding it, as the kubelet says (asked only when a GPU has
        a finding); {} when it cannot be asked."""
        assert self.workloads is not None
        containers = self._bounded("pod-resources", self.workloads)
        inv = self.inputs.get(Input.GPUS)
        if isinstance(containers, ProbeError) or not isinstance(inv, GpuInventory):
            return {}
        ids = [GpuIdentity(g.index, g.uuid) for g in inv.gpus]
        return gpu_holders(containers, ids)[0]

    def _events(self, verdict: Verdict, gpus: list[dict[str, Any]] | None = None) -> tuple[NodeEvent, ...]:
        events: list[NodeEvent] = []
        last_status = self.state.last_status
        gpus = gpus or []
        if verdict.status is not last_status:
            worst = verdict.worst
            detail = ""
            if worst is not None:
                detail = f": {worst.check}: {worst.message}"
                if worst.severity > Severity.NONE:
                    pods = pods_text(gpus, worst.key, *worst.entities)
                    detail += f" → {worst.recommendation.describe()}{pods}"
            was = last_status.value if last_status else "none"
            kind = WARNING if verdict.status in (Status.FAIL, Status.UNKNOWN) else NORMAL
            events.append(
                NodeEvent(Reason.GPU_HEALTH_CHANGED, f"{was} → {verdict.status.value}{detail}", kind)
            )
        for latch in self.state.take_new_latches():
            then = f" → {latch.next_step.describe()}" if latch.next_step else ""
            pods = pods_text(gpus, latch.key)
            events.append(
                NodeEvent(
                    Reason.LATCHED_FINDING, f"{latch.severity.label}: {latch.message}{then}{pods}", WARNING
                )
            )
        return tuple(events)
