"""The Node writer: keeps this agent's keys on its own Node equal to the engine's Marks (DESIGN.md §4).

Why it is built this way:
- Only our keys are touched. Labels and annotations go in a JSON merge patch that names only our keys
  (null deletes one), so another component's keys are never in the request. Taints are an atomic list
  in the API, so the patch carries the whole list, rebuilt from the Node we just read with only the
  taints of our key changed (any effect is ours, so a changed effect moves it), and
  `metadata.resourceVersion` as precondition: if anyone wrote the Node meanwhile the API server
  answers 409, and we re-read and retry (tenacity, bounded).
- The conditions go through `nodes/status` as a strategic-merge patch of just ours (the
  conditions list merges by `type`): our condition, the remediation conditions (engine/remediation
  decides what each shows once the taint is decided: a node the brake holds back is not marked)
  and the removal of ours no longer configured. Kubelet's and others' conditions are untouched.
- One story on the Node (node_story): a new fault's Node PATCH with our taint goes first, its
  conditions after it; any other change's status PATCH goes first, the Node PATCH only once it
  landed, and a Node PATCH refused before any Node write of the apply landed puts the conditions
  back. A remediation condition turns unhealthy only once our taint is on.
- A refused write (refusals) is loud: the server's message in the log, a metric by code, a
  `NodeWriteRefused` Event once per refusal (with the engine's pending Events: they do not wait
  for the refused write), and the agent retries.
- Nothing is written unless one of our keys differs from the last seen Node; one watch of the own
  Node keeps that copy current, so the steady state costs the API server nothing but that watch.
- A taint removed by someone while the node still fails is put back (Event TaintRestored); the way to
  keep the agent from tainting a node is the label `<prefix>/taint=disabled`.
- API errors never escape apply(): it says so in the ApplyResult and the engine tries again.
  Events wait for a write that goes through only when the server did not answer.
- There is no shutdown hook touching the Node: stopping or rolling out the agent never removes a taint.

apply() orchestrates; the parts live beside it: node_patch (what differs, pure), node_story (the
order of the two PATCHes, pure), write_order (that order sent, and the conditions' plan),
node_requests (the PATCHes, 409 retries), refusals (a refused write and its Event), taint_gate
(whether our taint goes on: the brake and its post-taint yield), events (the Events' words and their
POST), node_watch (the watch of the own Node and the latest copy of it), apply_result (what one
apply did), hooks (the metrics hooks). What a remediation condition says is decided in
engine/remediation.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.config import Config
from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import (
    COMPONENT,
    EVENT_NAMESPACE,
    EventReason,
    Keys,
)
from agent.core.results_doc import decode_results
from agent.reporters.apply_result import ApplyResult
from agent.reporters.brake import Brake
from agent.reporters.events import EventPoster, transition_events
from agent.reporters.history_entry import History
from agent.reporters.hooks import OnRefused, OnState, OnWrite, guarded
from agent.reporters.kube_rest import KubeRest, describe_error
from agent.reporters.node_patch import (
    annotations_of,
    find_our_taint,
    taint_disabled,
)
from agent.reporters.node_requests import REQUEST_TIMEOUT, Counts, NodeRequests
from agent.reporters.node_story import adds_taint, node_state
from agent.reporters.node_watch import NodeWatch
from agent.reporters.refusals import WHAT, Refusal, RefusalNotices, WriteRefused
from agent.reporters.repair_budget import RepairBudget
from agent.reporters.taint_gate import TaintGate
from agent.reporters.write_order import KEPT_WAITING, NOTHING, WriteOrder

log = logging.getLogger(__name__)

PENDING_EVENTS_MAX = 64
WATCH_TIMEOUT_SECONDS = 300


class NodeWriter(WriteOrder):
    """Writes Marks to one Node; see the module docstring for the rules it keeps."""

    def __init__(
        self,
        core: KubeRest,
        node_name: str,
        *,
        cfg: Config,
        brake: Brake | None = None,
        dry_run: bool = False,
        on_write: OnWrite | None = None,
        on_refused: OnRefused | None = None,
        on_state: OnState | None = None,
        event_namespace: str = EVENT_NAMESPACE,
        component: str = COMPONENT,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        repair: RepairBudget | None = None,
    ) -> None:
        self.rest = KubeRest.of(core)  # also takes a CoreV1Api or an ApiClient (tools, bench/fleet.py)
        self.node_name = node_name
        self.cfg = cfg  # node.conditionType is read from it, never copied
        self.prefix = prefix = cfg.prefix  # restart-only (config/schema.py RESTART_ONLY)
        self.brake = brake
        self.dry_run = dry_run
        self._on_write = on_write
        self._on_refused = on_refused
        self._on_state = on_state
        self.notices = RefusalNotices()
        self.event_namespace = event_namespace
        self.component = component
        self.watch_timeout_seconds = watch_timeout_seconds
        self.repair = repair  # the repair budget and wave hold, asked before a new remediation mark

        self._apply_lock = threading.RLock()
        self._retired_conditions: set[str] = set()  # our old condition types, removed at the next apply
        self._last_marks: Marks | None = None
        self._pending_events: list[NodeEvent] = []

        self.watch = NodeWatch(
            self.rest,
            node_name,
            on_node=self._on_node,
            timeout_seconds=watch_timeout_seconds,
            request_timeout=REQUEST_TIMEOUT,
            on_copy=self._state_changed,
        )
        self.poster = EventPoster(
            self.rest,
            node_name,
            namespace=event_namespace,
            component=component,
            request_timeout=REQUEST_TIMEOUT,
            note=self._note,
        )
        self.gate = TaintGate(node_name, brake, prefix=prefix)
        self.requests = NodeRequests(
            self.rest,
            node_name,
            self.watch,
            self.gate,
            prefix=prefix,
            component=component,
            dry_run=dry_run,
            note=self._note,
            history=History(prefix),
        )
        self.restores = 0

    # -- public --------------------------------------------------------------------------------------
    def apply(self, marks: Marks) -> ApplyResult:
        """Make the Node show *marks*. Never raises for API trouble; returns ok=False instead.

        `marks.events` are posted once, after the Node writes succeed or beside the Event of a
        refused one; if the server did not answer they are kept and posted with the next apply that
        reaches it (the engine should not resend them).
        """
        return self._apply(marks, marks.events)

    def _apply(self, marks: Marks, new_events: Sequence[NodeEvent]) -> ApplyResult:
        with self._apply_lock:
            self._last_marks = marks
            self._pending_events = [*self._pending_events, *new_events][-PENDING_EVENTS_MAX:]
            try:
                return self._apply_locked(marks)
            except WriteRefused as exc:
                posted = self._say_refused(marks, exc.refusal, exc.kept or NOTHING, ())
                return ApplyResult(
                    ok=False,
                    error=describe_error(exc.__cause__ or exc),
                    dry_run=self.dry_run,
                    brake_open=self.gate.state.brake_open,
                    events=posted,
                    refused=exc.refusal,
                )
            except Exception as exc:
                msg = describe_error(exc)
                log.warning("node %s: writing health marks failed: %s", self.node_name, msg)
                return ApplyResult(
                    ok=False, error=msg, dry_run=self.dry_run, brake_open=self.gate.state.brake_open
                )
            finally:
                self._state_changed()

    @property
    def condition_type(self) -> str:  # node.conditionType
        return self.cfg.node.condition_type

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py; the brake and the budget are parts too). A new
        `node.conditionType`: the next apply writes the new condition and removes ours of the old
        type (it was ours; left behind, a remediation controller would act on it)."""
        with self._apply_lock:
            if new.node.condition_type != self.condition_type:
                self._retired_conditions.add(self.condition_type)
                self._retired_conditions.discard(new.node.condition_type)
            self.cfg = new

    def read_results(self) -> dict[str, Any] | None:
        """The parsed `<prefix>/results` annotation of the current Node (None if absent or unreadable)."""
        try:
            node = self.watch.current(fresh=not self.watch.synced.is_set())
        except Exception as exc:
            log.warning(
                "node %s: reading the results annotation failed: %s", self.node_name, describe_error(exc)
            )
            return None
        return decode_results(annotations_of(node).get(Keys(self.prefix).results))

    def start(self) -> None:
        """Start the watch of the own Node (daemon thread)."""
        self.watch.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the watch; returns within *timeout* seconds. Touches nothing on the Node."""
        self.watch.stop(timeout)

    @property
    def node(self) -> dict[str, Any] | None:
        """A copy of the last seen Node (API JSON)."""
        return self.watch.node

    @property
    def node_version(self) -> int:
        """Changes whenever the last seen Node does (NodeWatch.version)."""
        return self.watch.version

    @property
    def brake_open(self) -> bool:
        return self.gate.state.brake_open

    # -- helpers -------------------------------------------------------------------------------------
    def _note(self, kind: str, outcome: str) -> None:
        guarded("on_write", self._on_write, kind, outcome)

    def _say_refused(
        self, marks: Marks, refusal: Refusal, kept: str, also: Sequence[NodeEvent]
    ) -> tuple[EventReason, ...]:
        """A refused write, out loud: the log line with the server's words, the metric by code, the
        `NodeWriteRefused` Event once per refusal, posted with the pending Events and *also*."""
        line = "node %s: the API server refused the %s: %s. %s; retrying"
        log.warning(line, self.node_name, WHAT.get(refusal.kind, refusal.kind), refusal.summary, kept)
        guarded("on_refused", self._on_refused, refusal.kind, refusal.code)
        event = self.notices.refused(refusal, kept=kept, marks=marks)
        to_post = [*self._pending_events, *also, *((event,) if event is not None else ())]
        self._pending_events = []
        return self.poster.post(to_post, self.watch.latest or {}, dry_run=self.dry_run)

    def _state_changed(self) -> None:
        """Tell on_state what the Node shows now (the taint on it, held, the remediation marks)."""
        if self._on_state is not None:
            marks = self._last_marks
            remediation = marks.remediation if marks is not None else ()
            state = node_state(self.watch.latest, self.prefix, remediation, self.gate.state.brake_open)
            guarded("on_state", self._on_state, state)

    # -- the write -----------------------------------------------------------------------------------
    def _apply_locked(self, marks: Marks) -> ApplyResult:
        n = Counts()
        node = self.watch.current(fresh=not self.watch.synced.is_set())
        first = not self.dry_run and adds_taint(node, marks, self.prefix)  # a new fault: out of service first
        decided, had_taint = self._taint_first(marks, n) if first else self._conditions_first(node, marks, n)
        node = self.watch.current(fresh=False)
        # The repair budget and the wave hold: asked only before a new remediation mark.
        repair = self.repair if not self.dry_run else None
        hold = repair.ask(node, marks, decided.taint_on) if repair is not None else None
        refused, kept = None, KEPT_WAITING
        try:
            conds = self._plan_conditions(node, marks, decided, hold)
            n.status_writes += self._write_status(node, marks, conds)
        except WriteRefused as exc:  # the Node writes landed; what waited for the taint keeps its value
            refused = exc.refusal
            kept = self._without_waiting(node, marks, conds, n) if first else kept
        if refused is None:  # a repair hold the history's entry did not foresee (reporters/history_entry.py)
            n.node_writes += self.requests.settle_history(marks)

        events = transition_events(marks, decided, self.gate.state, had_taint=had_taint, prefix=self.prefix)
        events += repair.events(hold) if repair is not None else []
        self.restores += sum(ev.reason == EventReason.TAINT_RESTORED for ev in events)
        self.gate.settle(decided, dry_run=self.dry_run)
        result = ApplyResult(
            ok=refused is None,
            node_writes=n.node_writes,
            status_writes=n.status_writes,
            conflicts=n.conflicts,
            tainted=decided.taint_on and not self.dry_run,
            brake_open=decided.brake_open,
            taint_disabled=decided.disabled,
            remediation_held=hold.why if hold is not None else "",
            held_key=hold.key if hold is not None else "",
            dry_run=self.dry_run,
        )
        if refused is not None:
            posted = self._say_refused(marks, refused, kept, events)
            return replace(result, events=posted, refused=refused, error=f"API error {refused.summary}")
        if self.notices.accepted():
            log.info("node %s: the API server accepts our writes again", self.node_name)
        to_post = [*self._pending_events, *events]
        self._pending_events = []
        return replace(result, events=self.poster.post(to_post, node, dry_run=self.dry_run))

    # -- the watch -----------------------------------------------------------------------------------
    def _needs_restore(self, node: Mapping[str, Any]) -> bool:
        marks = self._last_marks
        return (
            marks is not None
            and marks.taint
            and self.gate.state.taint_on
            and not self.dry_run
            and not taint_disabled(node, self.prefix)
            and find_our_taint(node, self.prefix) is None
        )

    def _on_node(self, node: dict[str, Any]) -> None:
        """Each Node the watch sees: put our taint back if someone removed it while the node fails."""
        if self._needs_restore(node):
            with self._apply_lock:
                marks = self._last_marks
                current = self.node
                if marks is not None and current is not None and self._needs_restore(current):
                    log.warning(
                        "node %s: our taint was removed while the node fails; restoring it", self.node_name
                    )
                    self._apply(marks, ())


__all__ = ["NodeWriter"]
