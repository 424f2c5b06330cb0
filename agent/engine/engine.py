"""The agent's engine: tiers on their intervals (scheduler), each input read within its bound
(input_reads), latched findings per boot and hysteresis before an untaint (state), and the verdict
over them, which marks_builder writes down as Marks for the Node.

Each tier refreshes only its own inputs; a check reads the freshest value of every input it needs
(the xid check maps PCI ids to GPUs with the gpu tier's last inventory, not a new nvidia-smi run)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agent.checks.registry import CHECK_EVENTS, CHECKS, RULES, after_checks, run_checks
from agent.config import Config
from agent.core.active_checks import ActiveState
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Verdict
from agent.core.gpu_stall import GpuActivity
from agent.core.marks import Marks
from agent.core.node import NodeObject
from agent.core.node_keys import MODE_TAINT, Keys
from agent.core.probed import Probed
from agent.core.results_doc import VALIDATED_FIELD, now_iso
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.engine import active, reboot_escalation, series
from agent.engine.gpu_verdicts import gpu_verdicts
from agent.engine.history_annotation_reads import repair_escalation
from agent.engine.input_reads import InputReads
from agent.engine.marks_builder import Decided, build
from agent.engine.remediation import describe
from agent.engine.scheduler import TIER_INPUTS, Scheduler
from agent.engine.side_step import SideStep, finding_events
from agent.engine.state import EngineState, Latch
from agent.engine.validation import CLEAR, REBOOT, Validation, step
from agent.engine.verdict import decide
from agent.probes.inputs import keep_previous_reads, record_reads
from agent.probes.source import Source, assemble_facts, resolve_instance_type

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
        active: ActiveState | None = None,
    ) -> None:
        """extra_inputs override how an input is read (the live DCGM poller and diag runner); progress()
        adds to the condition message (a diag in progress); wall() stamps the trend reads (epoch s)."""
        self.source = source
        self.metrics: Telemetry = metrics or NoTelemetry()
        self.schedule = Scheduler(cfg, rng or random.Random())
        self.state = EngineState(source.boot_id(), self.metrics)
        self.cfg, self.node_getter = cfg, node_getter
        self.clock, self.wall = clock, wall
        self.inputs: dict[Input, Any] = {}
        self.results: dict[str, CheckResult] = {}
        self.result_at: dict[str, str] = {}
        self.previous: dict[Input, Any] = {}  # the last read that worked of each input whose spec keeps one
        self.heartbeat, self.evaluations = clock(), 0
        self.reads = InputReads(self.metrics, lambda: self.cfg.timeouts.check)  # engine/input_reads.py
        # who holds each GPU, as the kubelet says (probes/pod_resources.list_devices); None: no kubelet
        self.holders = self.reads.holders(workloads, lambda: self.inputs.get(Input.GPUS))
        self.validation = Validation(reset_at=wall())  # the validating taint (engine/validation.py)
        self.active = active  # active checks (engine/active.py): the testing taint, `gpu-healthcheck diag`
        self.last_diag: dict[str, Any] | None = None  # the last `diag` request's record (lastDiag)
        self.activity = GpuActivity()  # recent samples per GPU for gpu.stalled (engine/stalls.py)
        self._announced: set[str] = set()  # the findings of the last verdict whose check posts Events
        self.set_inputs(extra_inputs or {}, progress)

    def set_inputs(
        self, extra_inputs: dict[Input, Callable[[], Any]], progress: Callable[[], str] | None
    ) -> None:
        """How inputs are read beyond the source; a reload that rebuilt the DCGM client calls it again."""
        self.extra_inputs, self.progress = extra_inputs, progress
        self.reads.set_readers(self.source, extra_inputs)

    @property
    def cfg(self) -> Config:
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: Config) -> None:
        """A reloaded config: the scheduler reads its intervals from it too (then reschedule_all())."""
        self._cfg = cfg
        self.schedule.cfg = cfg

    @property
    def latches(self) -> dict[str, Latch]:
        return self.state.latches

    @property
    def boot_id(self) -> str | None:
        return self.state.boot_id

    def restore(self, doc: dict[str, Any] | None) -> None:
        """Latches (same boot), hysteresis, the last clear and diag back from the results annotation."""
        self.state.restore(doc, self.cfg.node.remediation_conditions)
        self.validation.restore(doc, self.boot_id, VALIDATED_FIELD)
        self.last_diag = active.restored(doc)

    def apply_config(self, old: Config, new: Config) -> None:  # a reload (config/live_part.py)
        self.cfg = new  # every check, threshold and interval reads it from here on
        self.schedule.reschedule_all()

    def run_tier(self, tier: str) -> list[CheckResult]:
        started = self.clock()
        names = TIER_INPUTS[tier]
        keep_previous_reads(self.previous, self.inputs, names)
        for name in names:
            self.inputs[name] = self.reads.read(name)
        facts = self.facts()
        record_reads(self.metrics, facts, names)
        if tier == "gpu":
            was = self.boot_id
            self.state.observe_boot(self.source.boot_id())
            if was and self.boot_id != was:
                self.validate_again(REBOOT)
            # the trend reads and the GPUs' activity: the checks below judge the kept series
            kept = series.keep(facts, self.state, self.activity, self.cfg, self.wall, self.holders)
            facts, self.activity = kept
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
        self.validation.ran(tier, self.state.visible(results), self.inputs, self.cfg.node.validate.diag_level)
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

    def validate_again(self, why: str) -> None:
        """The validating taint's pass starts over (engine/validation.py): every tier runs at once."""
        self.validation.reset(self.wall(), why)
        self.schedule.next_due.update(dict.fromkeys(self.schedule.next_due, 0.0))

    def evaluate(self) -> tuple[Verdict, Marks]:
        """The verdict over the current results, settled, written down as Marks (marks_builder)."""
        node = self._node()
        keys = Keys(self.cfg.prefix)  # an operator's clear request: the keys it consumes, its Event
        drop, clear_event = self.state.take_clear_request(
            node, keys.clear_latched, self.results, keys.clear_latched_by, now_iso()
        )
        hold = active.step(self.active, node, self.cfg.prefix, self.cfg.node.mode, self.schedule.next_due)
        self.last_diag = hold.record or self.last_diag
        if clear_event is not None:
            self.validate_again(CLEAR)
        results = self.state.current_results(self.results, [s.name for s in CHECKS])  # latches kept
        after = self.cfg.node.escalate_after_reboots
        gpus_seen = self.inputs.get(Input.GPUS)
        self.state.history = reboot_escalation.record(
            self.state.history, results, self.boot_id, gpus_seen, after + 1
        )
        results = reboot_escalation.escalate(results, self.state.history, gpus_seen, after)
        cleared = clear_event is not None
        results = after_checks(repair_escalation(results, node, self.cfg, self.boot_id, self.wall(), cleared))
        verdict = decide(results)
        self.metrics.record_verdict(self.state.showing(verdict.status), results)
        # Hysteresis: a failing node is untainted only after recoverAfter passing gpu-tier cycles.
        policy = self.cfg.node
        wanted = self.state.settle_taint(
            verdict.status,
            verdict.severity,
            self.schedule.last_run.get("gpu", -1.0),
            policy.recover_after,
            policy.taint_min_severity,
            policy.remediation_conditions,
            describe(verdict),
        )
        self.metrics.record_taint_wanted(wanted and policy.mode == MODE_TAINT)
        gpus = gpu_verdicts(results, gpus_seen, verdict.status, self.holders, self.inputs.get(Input.DRA))
        new_latches = self.state.take_new_latches()
        announced, self._announced = finding_events(results, CHECK_EVENTS, self._announced)
        gate = step(self, node, verdict.status, wanted)  # the validating taint (engine/validation.py)
        last_status = self.state.shown(verdict.status)
        self.evaluations += 1
        self.heartbeat = self.clock()
        decided = Decided(
            verdict=verdict,
            results=results,
            wanted=wanted,
            node=node,
            gpus=gpus,
            inventory=gpus_seen,
            steps=(SideStep(drop=drop, events=(clear_event,) if clear_event else ()), announced, hold, gate),
            last_status=last_status,
            new_latches=new_latches,
            instance_type=resolve_instance_type(self.source, self.cfg, node, None)[0],
            check_times=self.result_at,
            checked_at=now_iso(),
            doing=self.progress() if self.progress else "",
            cleared=cleared,
            kept=self.state.take_kept(),
            last_diag=self.last_diag,
        )
        marks = build(decided, self.state, self.validation, self.cfg)
        self.metrics.record_validating(self.validation.since, self.validation.waiting)
        return verdict, marks
