"""The Node writer: keeps this agent's keys on its own Node equal to the engine's Marks (DESIGN.md §4).

Why it is built this way:
- Only our keys are touched. Labels and annotations go in a JSON merge patch that names only our keys
  (null deletes one), so another component's keys are never in the request. Taints are an atomic list
  in the API, so the patch carries the whole list, rebuilt from the Node we just read with only the
  taints of our key changed (any effect is ours, so a changed effect moves it), and
  `metadata.resourceVersion` as precondition: if anyone wrote the Node meanwhile the API server
  answers 409, and we re-read and retry (tenacity, bounded).
- The conditions go through `nodes/status` as ONE strategic-merge patch of just ours (the
  conditions list merges by `type`): our condition, the remediation conditions (node_patch says what
  each shows once the taint is decided: a node the brake holds back is not marked for the engines)
  and the removal of ours no longer configured. Kubelet's and others' conditions are untouched.
- Nothing is written unless one of our keys differs from the last seen Node; one watch of the own
  Node keeps that copy current, so the steady state costs the API server nothing but that watch.
- A taint removed by someone while the node still fails is put back (Event TaintRestored); the way to
  keep the agent from tainting a node is the label `<prefix>/taint=disabled`.
- API errors never escape apply(): it says so in the ApplyResult and the engine tries again.
- There is no shutdown hook touching the Node: stopping or rolling out the agent never removes a taint.

apply() orchestrates; the parts live beside it: node_patch (what differs, pure), taint_gate (whether
our taint goes on: the brake and its post-taint yield), events (the Events' words and their POST),
node_watch (the watch of the own Node and the latest copy of it).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity

from agent.core.contract import (
    COMPONENT,
    DEFAULT_CONDITION_TYPE,
    DEFAULT_PREFIX,
    EVENT_NAMESPACE,
    Keys,
    Marks,
    NodeEvent,
    Reason,
    decode_results,
    now_iso,
)
from agent.core.repair_budget import Hold
from agent.reporters.brake import Brake
from agent.reporters.events import EventPoster, transition_events
from agent.reporters.kube_rest import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    KubeRest,
    api_status,
    describe_error,
    node_path,
)
from agent.reporters.node_patch import (
    annotations_of,
    find_condition,
    find_our_taint,
    plan_conditions,
    plan_node_patch,
    rv_text,
    taint_disabled,
)
from agent.reporters.node_watch import NodeWatch
from agent.reporters.repair_budget import RepairBudget
from agent.reporters.taint_gate import TaintDecision, TaintGate

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (5, 10)
CONFLICT_ATTEMPTS = 12  # a busy controller on the same Node; each try re-reads the watched copy
PENDING_EVENTS_MAX = 64
WATCH_TIMEOUT_SECONDS = 300

OnWrite = Callable[[str, str], None]


@dataclass(frozen=True)
class ApplyResult:
    """What one apply() did. ok=False: nothing is known to be written; the engine applies again later."""

    ok: bool
    node_writes: int = 0  # metadata/taint patches that succeeded
    status_writes: int = 0  # condition patches that succeeded
    conflicts: int = 0  # 409s retried
    tainted: bool = False  # our taint is on the Node after this apply
    brake_open: bool = False  # marks.taint, but the brake refused the taint
    taint_disabled: bool = False  # marks.taint, but `<prefix>/taint=disabled` is set
    events: tuple[str, ...] = ()  # reasons of the Events posted (or, dry run, that would be)
    remediation_held: str = ""  # a new remediation mark held back: "budget" or "wave" (repair_budget)
    held_key: str = ""  # the finding key of that hold
    error: str | None = None
    dry_run: bool = False

    @property
    def wrote(self) -> bool:
        return bool(self.node_writes or self.status_writes)


class _Conflict(Exception):
    pass


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, _Conflict)


class NodeWriter:
    """Writes Marks to one Node; see the module docstring for the rules it keeps."""

    def __init__(
        self,
        core: KubeRest,
        node_name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        condition_type: str = DEFAULT_CONDITION_TYPE,
        brake: Brake | None = None,
        dry_run: bool = False,
        on_write: OnWrite | None = None,
        event_namespace: str = EVENT_NAMESPACE,
        component: str = COMPONENT,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        repair: RepairBudget | None = None,
    ) -> None:
        self.rest = KubeRest.of(core)  # also takes a CoreV1Api or an ApiClient (tools, bench/fleet.py)
        self.node_name = node_name
        self.prefix = prefix
        self.condition_type = condition_type
        self.brake = brake
        self.dry_run = dry_run
        self._on_write = on_write
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
        )
        self.poster = EventPoster(
            self.rest,
            node_name,
            namespace=event_namespace,
            component=component,
            request_timeout=REQUEST_TIMEOUT,
            note=self._note,
        )
        self.gate = TaintGate(
            node_name,
            brake,
            prefix=prefix,
            reapply=self._reapply_last,
            stopped=lambda: self.watch.stopped,
        )
        self.restores = 0

    # -- public --------------------------------------------------------------------------------------
    def apply(self, marks: Marks) -> ApplyResult:
        """Make the Node show *marks*. Never raises for API trouble; returns ok=False instead.

        `marks.events` are posted once, after the Node writes succeed; if they fail the events are
        kept and posted with the next successful apply (the engine should not resend them).
        """
        return self._apply(marks, marks.events)

    def _apply(self, marks: Marks, new_events: Sequence[NodeEvent]) -> ApplyResult:
        with self._apply_lock:
            self._last_marks = marks
            self._pending_events = [*self._pending_events, *new_events][-PENDING_EVENTS_MAX:]
            try:
                return self._apply_locked(marks)
            except Exception as exc:
                msg = describe_error(exc)
                log.warning("node %s: writing health marks failed: %s", self.node_name, msg)
                return ApplyResult(
                    ok=False, error=msg, dry_run=self.dry_run, brake_open=self.gate.state.brake_open
                )

    def set_condition_type(self, condition_type: str) -> None:
        """A reloaded `node.conditionType`: the next apply writes the new condition and removes ours
        of the old type (it was ours; left behind, a remediation controller would act on it)."""
        with self._apply_lock:
            if condition_type != self.condition_type:
                self._retired_conditions.add(self.condition_type)
                self._retired_conditions.discard(condition_type)
                self.condition_type = condition_type

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

    @property
    def verify_delay_s(self) -> float:
        """Racing agents' writes land within this; then the post-taint count is settled."""
        return self.gate.verify_delay_s

    @verify_delay_s.setter
    def verify_delay_s(self, seconds: float) -> None:
        self.gate.verify_delay_s = seconds

    # -- API helpers ---------------------------------------------------------------------------------
    def _note(self, kind: str, outcome: str) -> None:
        if self._on_write is not None:
            try:
                self._on_write(kind, outcome)
            except Exception:  # a metrics hook must not break writing
                log.exception("on_write hook failed")

    def _patch(self, subresource: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
        """Patch the Node (or its status) and remember the answer as the latest Node."""
        node = self.rest.json(
            "PATCH",
            node_path(self.node_name, subresource),
            body=body,
            content_type=content_type,
            query={"fieldManager": self.component},
            timeout=REQUEST_TIMEOUT,
        )
        self.watch.observe(node)
        return node

    def _patch_node(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._patch("", body, MERGE_PATCH)

    # -- the write -----------------------------------------------------------------------------------
    def _apply_locked(self, marks: Marks) -> ApplyResult:
        conflicts = 0
        node_writes = 0
        fresh = not self.watch.synced.is_set()
        decided = TaintDecision()
        had_taint = False

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(CONFLICT_ATTEMPTS),
            wait=tenacity.wait_random_exponential(multiplier=0.02, max=1.0),
            retry=tenacity.retry_if_exception(_is_conflict),
            reraise=True,
        )

        def write(node: Mapping[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
            """One optimistic-concurrency patch; a 409 goes back to the retry loop."""
            nonlocal conflicts, node_writes
            patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
            try:
                written = self._patch_node(patch)
            except Exception as exc:
                if api_status(exc) == 409:
                    conflicts += 1
                    self._note("node", "conflict")
                    raise _Conflict(
                        f"409 Conflict: the Node kept changing ({CONFLICT_ATTEMPTS} attempts)"
                    ) from exc
                self._note("node", "error")
                raise
            node_writes += 1
            self._note("node", "ok")
            return written

        for attempt in retrying:
            with attempt:
                node = self.watch.current(fresh=fresh or attempt.retry_state.attempt_number > 1)
                if self.gate.asks_brake(node, marks) and not self.dry_run:
                    # Our failing labels first, without the taint: agents racing for the brake's free
                    # slots then see this node among the contenders (Brake: taking turns).
                    first = plan_node_patch(node, marks, prefix=self.prefix, taint_on=False)
                    if first is not None:
                        node = write(node, first)
                decided = self.gate.decide(node, marks)
                taint_on = decided.taint_on
                had_taint = find_our_taint(node, self.prefix) is not None
                label_on = marks.unhealthy_label and not taint_disabled(node, self.prefix)
                patch = plan_node_patch(node, marks, prefix=self.prefix, taint_on=taint_on, label_on=label_on)
                if patch is not None:
                    if self.dry_run:
                        log.info("node %s: dry run, would patch: %s", self.node_name, json.dumps(patch))
                        self._note("node", "skipped")
                    else:
                        adding = taint_on and not had_taint
                        if adding:
                            self.gate.sending_taint()  # stays set if the answer never comes
                        written = write(node, patch)
                        if adding:
                            self.gate.taint_landed(rv_text(written))
        node = self.watch.current(fresh=False)
        # The repair budget and the wave hold: asked only before a new remediation mark.
        repair = self.repair if not self.dry_run else None
        hold = repair.ask(node, marks, decided.taint_on) if repair is not None else None
        status_writes = self._write_conditions(node, marks, decided, hold)

        events = transition_events(marks, decided, self.gate.state, had_taint=had_taint, prefix=self.prefix)
        events += repair.events(hold) if repair is not None else []
        self.restores += sum(ev.reason == Reason.TAINT_RESTORED for ev in events)
        self.gate.settle(decided, dry_run=self.dry_run)
        to_post = [*self._pending_events, *events]
        self._pending_events = []
        posted = self.poster.post(to_post, node, dry_run=self.dry_run)
        return ApplyResult(
            ok=True,
            node_writes=node_writes,
            status_writes=status_writes,
            conflicts=conflicts,
            tainted=decided.taint_on and not self.dry_run,
            brake_open=decided.brake_open,
            taint_disabled=decided.disabled,
            events=posted,
            remediation_held=hold.why if hold is not None else "",
            held_key=hold.key if hold is not None else "",
            dry_run=self.dry_run,
        )

    def _write_conditions(
        self, node: Mapping[str, Any], marks: Marks, decided: TaintDecision, hold: Hold | None = None
    ) -> int:
        """Our condition, the remediation conditions and the removal of ours no longer configured, in
        one status PATCH when any differs; the number of writes (0 or 1)."""
        retired = sorted(self._retired_conditions)
        conds = plan_conditions(
            node,
            marks,
            condition_type=self.condition_type,
            retired=retired,
            taint_on=decided.taint_on,
            brake_open=decided.brake_open,
            disabled=decided.disabled,
            prefix=self.prefix,
            now=now_iso(),
            hold=hold,
        )
        self._retired_conditions -= {t for t in retired if find_condition(node, t) is None}
        if not conds:
            return 0
        if self.dry_run:
            log.info("node %s: dry run, would set conditions: %s", self.node_name, json.dumps(conds))
            self._note("status", "skipped")
            return 0
        try:
            self._patch("status", {"status": {"conditions": conds}}, STRATEGIC_MERGE_PATCH)
        except Exception:
            self._note("status", "error")
            raise
        self._retired_conditions -= {c["type"] for c in conds if c.get("$patch") == "delete"}
        self._note("status", "ok")
        self._log_remediation(node, marks, conds)
        return 1

    def _log_remediation(
        self, node: Mapping[str, Any], marks: Marks, conds: Sequence[Mapping[str, Any]]
    ) -> None:
        """Say in the log when a remediation condition changes status: an engine may act on it."""
        types = {m.type for m in marks.remediation}
        for c in conds:
            if c.get("type") in types and "status" in c:
                before = (find_condition(node, str(c["type"])) or {}).get("status")
                if before != c["status"]:
                    log.info(
                        "node %s: condition %s=%s (%s): %s",
                        self.node_name,
                        c["type"],
                        c["status"],
                        c["reason"],
                        c["message"],
                    )

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

    def _reapply_last(self) -> None:
        """The gate yields: apply the last Marks again (no new Events)."""
        marks = self._last_marks
        if marks is not None:
            self._apply(marks, ())

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


__all__ = ["ApplyResult", "NodeWriter"]
