"""The agent's loop: due tiers, the kernel log's wake-ups, config reloads and publishing the Marks.
It never crashes on bad input or an unreachable API server; the writer says how a write went."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from agent.checks.registry import RULE_BOOK
from agent.config import Config
from agent.config.canary import CANARY as FROM_CANARY
from agent.config.canary import MAIN
from agent.config.live_part import LivePart
from agent.config.schema import SCHEMA_VERSION
from agent.config.watch import ConfigWatcher
from agent.core.active_checks import ActiveState
from agent.core.facts import Input
from agent.core.marks import Marks, NodeEvent
from agent.core.metric_labels import ConfigReloadResult
from agent.core.node import NodeObject
from agent.core.node_keys import CANARY, CONDITION_MESSAGE_MAX, WARNING, EventReason, Keys
from agent.core.probed import Probed
from agent.core.results_doc import stale_after_s
from agent.core.telemetry import NoTelemetry, Telemetry
from agent.core.text import shorten
from agent.engine.degraded import amended
from agent.engine.engine import Engine
from agent.engine.write_policy import WriteOutcome, WritePolicy, brake_reask_s, fingerprint
from agent.probes.kernel_follow import KernelFollower
from agent.probes.source import Source

log = logging.getLogger("gpu-healthcheck.agent")


class Writer(Protocol):
    def apply(self, marks: Marks) -> WriteOutcome: ...
    def read_results(self) -> dict[str, Any] | None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


class Agent:
    def __init__(
        self,
        source: Source,
        cfg: Config,
        *,
        config_dir: Path | None,
        writer: Writer | None,
        node_getter: Callable[[], Probed[NodeObject]] | None,
        kernel_path: Path | None,
        kernel_is_device: bool,
        metrics: Telemetry | None = None,
        extra_inputs: dict[Input, Callable[[], Any]] | None = None,
        progress: Callable[[], str] | None = None,
        parts: Sequence[LivePart] = (),
        config_problem: str = "",
        state_dir: Path | None = None,
        workloads: Callable[[], Any] | None = None,
        canary_dir: Path | None = None,
        vet_config: Callable[[Config], str | None] | None = None,
        config_fence_refused: bool = False,
        active: ActiveState | None = None,
    ) -> None:
        """parts: what the wiring built that holds configuration (config/live_part.py); a reload
        reaches the engine, then each of them. active: the state active checks share with the engine.
        canary_dir: the canary ConfigMap's directory, run while the Node asks (config/canary.py);
        vet_config: why the admission fence refuses a reloaded config (ConfigWatcher)."""
        self.cfg = cfg
        self.metrics: Telemetry = metrics or NoTelemetry()
        self.engine = Engine(
            source,
            cfg,
            metrics=self.metrics,
            node_getter=node_getter,
            extra_inputs=extra_inputs,
            progress=progress,
            workloads=workloads,
            active=active,
        )
        self.parts: tuple[LivePart, ...] = (self.engine, *parts)  # a reload reaches each, in order
        self.writer = writer
        self.watcher = (
            ConfigWatcher(
                config_dir,
                cfg,
                RULE_BOOK,
                state_dir,
                canary_dir=canary_dir if node_getter is not None else None,
                wants_canary=self._wants_canary,
                vet=vet_config,
                fence_refused=config_fence_refused,
            )
            if config_dir is not None
            else None
        )
        self.stop_event = threading.Event()
        self.poke = threading.Event()
        self.xid_pending = threading.Event()
        self.pending_events: list[NodeEvent] = []
        self.last_fingerprint = ""
        self.retry_at = 0.0
        self.write_policy = WritePolicy(lambda: brake_reask_s(self.cfg))
        self.config_problem = ""  # why the mounted config is not in force ("" = it is)
        self._config_ignored(cfg)
        if config_problem:
            self._config_rejected(config_problem)
        self.follower: KernelFollower | None = None
        if kernel_path is not None:
            self.follower = KernelFollower(source.kernel_tail, self._xid_seen)  # reads for the xid tier

    # ------------------------------------------------------------------ lifecycle

    def _xid_seen(self) -> None:
        """The follower saw an Xid-like line: run the xid tier now, not at the next tick."""
        self.xid_pending.set()
        self.poke.set()

    def request_stop(self) -> None:
        self.stop_event.set()
        self.poke.set()

    def run(self, once: bool = False) -> None:
        if self.writer is not None:
            self.writer.start()
            results = self.writer.read_results()  # the Node is known from here on (its labels too)
            if self.watcher is not None:
                self._reload()  # a canary node starts on the canary before its first verdict
            self.engine.restore(results)
        if self.follower is not None:
            self.follower.start()
        next_reload = 0.0
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                ran = False
                if self.xid_pending.is_set():
                    self.xid_pending.clear()
                    self.engine.run_tier("xid")
                    ran = True
                for tier in self.engine.schedule.due_tiers(now):
                    if self.stop_event.is_set():
                        break
                    self.engine.run_tier(tier)
                    ran = True
                if self.watcher is not None and now >= next_reload:
                    ran |= self._reload()
                    next_reload = now + self.cfg.config_poll_seconds
                ran |= self._clear_requested()
                due = bool(self.retry_at) and now >= self.retry_at
                if due or ((ran or self.pending_events) and not self._backing_off(now)):
                    self._publish()
                if once:
                    return
                waits = [self.engine.schedule.seconds_to_next(time.monotonic()), 1.0]
                if self.watcher is not None:
                    waits.append(max(0.0, next_reload - time.monotonic()))
                if self.retry_at:
                    waits.append(max(0.0, self.retry_at - time.monotonic()))
                self.poke.wait(min(waits))
                self.poke.clear()
        finally:
            if self.follower is not None:
                self.follower.stop()
            if self.writer is not None:
                self.writer.stop()  # never touches the Node: a shutdown or rollout keeps the taint
            log.info("agent stopped", extra={"event": "stop"})

    # ------------------------------------------------------------------ steps

    def _wants_canary(self) -> bool | None:
        """The Node's `<prefix>/config=canary` label, from the watched copy; None: not seen yet."""
        getter = self.engine.node_getter
        node = getter() if getter else None
        if not isinstance(node, NodeObject):
            return None
        return node.labels.get(Keys(self.cfg.prefix).config_channel) == CANARY

    def _reload(self) -> bool:
        assert self.watcher is not None
        outcome = self.watcher.poll()
        if outcome is None:
            return False
        if outcome.config is None:
            ours = self.cfg.source in (MAIN, FROM_CANARY)
            kept = outcome.previous.describe() if ours else f"the {self.cfg.source} configuration"
            self._config_rejected(
                f"the {outcome.source.source} ConfigMap: {outcome.error}; keeping the configuration "
                f"in force ({kept}, digest {self.cfg.digest or '-'})"
            )
            return True
        if self.config_problem:
            self.config_problem = ""
            self.metrics.record_config_rejected(False)
        self.take_config(outcome.config)
        self.metrics.record_config_reload(ConfigReloadResult.APPLIED)
        self._config_ignored(outcome.config)
        applied = ", ".join(outcome.changed) or "no key changed"
        if outcome.config.ignored:
            applied += f"; ignored (a newer release's keys): {', '.join(outcome.config.ignored)}"
        where = f"{outcome.source.describe()}, digest {outcome.config.digest}"
        if outcome.switched and outcome.previous != outcome.source:
            where += f"; was {outcome.previous.describe()}"
        log.info(f"config reloaded from {where}, applied: {applied}", extra={"event": "config"})
        self.pending_events.append(
            NodeEvent(EventReason.CONFIG_RELOADED, f"configuration reloaded and applied ({where}): {applied}")
        )
        if outcome.needs_restart:
            kept = "; ".join(outcome.needs_restart)
            self.metrics.record_config_reload(ConfigReloadResult.RESTART_REQUIRED)
            log.warning(f"config not applied until the agent restarts: {kept}", extra={"event": "config"})
            self.pending_events.append(
                NodeEvent(
                    EventReason.CONFIG_RESTART_REQUIRED,
                    f"not applied until the agent restarts (old value kept): {kept}",
                    WARNING,
                )
            )
        return True

    def take_config(self, new: Config) -> None:
        """Put a reloaded config in force: the loop's own reads, then the engine and each part, in
        order (config/live_part.py)."""
        old, self.cfg = self.cfg, new
        for part in self.parts:
            try:
                part.apply_config(old, new)
            except Exception as exc:  # a wiring bug must not stop the loop; say what did not apply
                log.exception("applying the reloaded config failed", extra={"event": "config"})
                self.pending_events.append(
                    NodeEvent(
                        EventReason.CONFIG_REJECTED, f"applying the reloaded config failed: {exc}", WARNING
                    )
                )

    def _config_ignored(self, cfg: Config) -> None:
        """A config written for a newer release is taken without the keys this agent does not know:
        a warning naming them and a gauge (config/__init__.py parse_config), never ConfigRejected."""
        self.metrics.record_config_ignored(len(cfg.ignored))
        if cfg.ignored:
            log.warning(
                f"config written for schemaVersion {cfg.schema_version} (this agent: {SCHEMA_VERSION}): "
                f"ignoring the keys it does not know: {', '.join(cfg.ignored)}",
                extra={"event": "config"},
            )

    def _config_rejected(self, problem: str) -> None:
        """The mounted config is invalid (at start or on an edit): say so in an Event, the log, the
        metrics and the condition until a valid one is mounted."""
        self.config_problem = problem
        self.metrics.record_config_reload(ConfigReloadResult.REJECTED)
        self.metrics.record_config_rejected(True)
        log.error(f"config rejected: {problem}", extra={"event": "config"})
        self.pending_events.append(NodeEvent(EventReason.CONFIG_REJECTED, problem, WARNING))

    def _backing_off(self, now: float) -> bool:
        """A write failed and its retry is not due: the tiers' results wait for it (write_policy)."""
        return self.write_policy.failing and now < self.retry_at

    def _publish(self) -> None:
        _, marks = self.engine.evaluate()
        if self.config_problem:
            note = f" (config rejected: {shorten(self.config_problem, CONDITION_MESSAGE_MAX // 3)})"
            marks = amended(
                marks,
                lambda m: replace(
                    m,
                    config_rejected=True,
                    condition_message=m.condition_message[: CONDITION_MESSAGE_MAX - len(note)] + note,
                ),
            )
        if self.pending_events:
            pending = tuple(self.pending_events)
            marks = amended(marks, lambda m: replace(m, events=(*pending, *m.events)))
        fp = fingerprint(marks)
        if fp == self.last_fingerprint and not (marks.events or marks.clear_kept) and not self.retry_at:
            return
        if self.writer is None:
            log.info(
                f"marks: status={marks.status.value} severity={marks.severity.label} taint={marks.taint}",
                extra={"status": marks.status.value, "event": "marks"},
            )
            self.last_fingerprint, self.pending_events = fp, []
            return
        result = self.writer.apply(marks)
        self.pending_events = []  # the writer keeps unsent Events and posts them with its next success
        wait = self.write_policy.next_try(result)
        self.retry_at = time.monotonic() + wait if wait is not None else 0.0
        if result.ok:
            self.last_fingerprint = fp
            shown = getattr(result, "shown", None)
            if shown is not None:
                self.engine.state.last_status = shown  # degraded: the next health Event says from it
            self.metrics.record_brake_open(result.brake_open)
            self.metrics.record_remediation_held(result.remediation_held, result.held_key)
        else:
            log.warning(
                f"Node write failed, retrying in {wait:.0f} s: {result.error or ''}",
                extra={"event": "write"},
            )

    def _clear_requested(self) -> bool:
        """An operator annotated the Node to clear latched findings: act now, not at the next tick."""
        getter = self.engine.node_getter
        node = getter() if getter else None
        key = Keys(self.cfg.prefix).clear_latched
        return isinstance(node, NodeObject) and key in node.annotations

    def healthy(self) -> bool:
        """The loop checked within stale_after_s (liveness)."""
        return time.monotonic() - self.engine.heartbeat < stale_after_s(self.cfg.intervals.gpu)

    def ready(self) -> bool:
        """A verdict exists and is fresh: `status` reads a Ready agent as "checked within
        stale_after_s" (the results annotation carries that bound), without any heartbeat write."""
        return self.engine.evaluations > 0 and self.healthy()
