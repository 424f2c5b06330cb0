"""The Node writer: keeps this agent's keys on its own Node equal to the engine's Marks (DESIGN.md §4).

Why it is built this way:
- Only our keys are touched. Labels and annotations go in a JSON merge patch that names only our keys
  (null deletes one), so another component's keys are never in the request. Taints are an atomic list
  in the API, so the patch carries the whole list, rebuilt from the Node we just read with only the
  exact (key, effect) we own changed, and `metadata.resourceVersion` as precondition: if anyone wrote
  the Node meanwhile the API server answers 409, and we re-read and retry (tenacity, bounded).
- The condition goes through `nodes/status` as a strategic-merge patch of just our condition (the
  conditions list merges by `type`), so kubelet's and others' conditions are untouched.
- Nothing is written unless one of our keys differs from the last seen Node; one watch of the own
  Node keeps that copy current, so the steady state costs the API server nothing but that watch.
- A taint removed by someone while the node still fails is put back (Event TaintRestored); the way to
  keep the agent from tainting a node is the label `<prefix>/taint=disabled`.
- API errors never escape apply(): it says so in the ApplyResult and the engine tries again.
- There is no shutdown hook touching the Node: stopping or rolling out the agent never removes a taint.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity

from agent.core.contract import (
    COMPONENT,
    DEFAULT_CONDITION_TYPE,
    DEFAULT_PREFIX,
    DEFAULT_TAINT_EFFECT,
    DISABLED,
    EVENT_MESSAGE_MAX,
    EVENT_NAMESPACE,
    WARNING,
    Keys,
    Marks,
    NodeEvent,
    Reason,
    decode_results,
    now_iso,
)
from agent.reporters.brake import Brake
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
    find_our_taint,
    plan_condition,
    plan_node_patch,
    rv_text,
    taint_disabled,
)
from agent.reporters.node_watch import NodeWatch

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (5, 10)
CONFLICT_ATTEMPTS = 8
PENDING_EVENTS_MAX = 64
WATCH_TIMEOUT_SECONDS = 300

OnWrite = Callable[[str, str], None]


VERIFY_ROUNDS = (1.0, 3.0, 8.0, 15.0)  # post-taint re-counts, in units of verify_delay_s


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
        core: Any,
        node_name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        condition_type: str = DEFAULT_CONDITION_TYPE,
        taint_effect: str = DEFAULT_TAINT_EFFECT,
        brake: Brake | None = None,
        dry_run: bool = False,
        on_write: OnWrite | None = None,
        event_namespace: str = EVENT_NAMESPACE,
        component: str = COMPONENT,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self.rest = KubeRest.of(core)
        self.node_name = node_name
        self.prefix = prefix
        self.condition_type = condition_type
        self.taint_effect = taint_effect
        self.brake = brake
        self.dry_run = dry_run
        self._on_write = on_write
        self.event_namespace = event_namespace
        self.component = component
        self.watch_timeout_seconds = watch_timeout_seconds

        self._apply_lock = threading.RLock()
        self._last_marks: Marks | None = None
        self._taint_on = False  # after the last successful apply our taint was (to be) on
        self._brake_open = False
        self._disabled_noted = False
        self._pending_events: list[NodeEvent] = []
        self._yield_reason = ""  # set when a post-taint check found a race over the brake limit
        self._taint_rv: str | None = None  # resourceVersion of the write that added our taint
        self._verify_scheduled = False  # the post-taint re-count runs for the current taint
        self._taint_attempted = False  # this writer sent a write adding our taint (answer or not)
        self.verify_delay_s = 2.0  # racing agents' writes land within this; then the count is settled

        self.watch = NodeWatch(
            self.rest,
            node_name,
            on_node=self._on_node,
            timeout_seconds=watch_timeout_seconds,
            request_timeout=REQUEST_TIMEOUT,
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
                return ApplyResult(ok=False, error=msg, dry_run=self.dry_run, brake_open=self._brake_open)

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
    def brake_open(self) -> bool:
        return self._brake_open

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

    def _patch_status(self, cond: dict[str, Any]) -> dict[str, Any]:
        return self._patch("status", {"status": {"conditions": [cond]}}, STRATEGIC_MERGE_PATCH)

    # -- the write -----------------------------------------------------------------------------------
    def _asks_brake(self, node: Mapping[str, Any], marks: Marks) -> bool:
        """Would _decide_taint ask the brake (a new taint) rather than answer by itself?"""
        return (
            marks.taint
            and self.brake is not None
            and not taint_disabled(node, self.prefix)
            and not self._yield_reason
            and find_our_taint(node, self.prefix, self.taint_effect) is None
            and not self._taint_on
        )

    def _decide_taint(self, node: Mapping[str, Any], marks: Marks) -> tuple[bool, bool, bool, str]:
        """(taint_on, brake_open, disabled, brake_reason) for this Node and Marks."""
        if not marks.taint:
            return False, False, False, ""
        if taint_disabled(node, self.prefix):
            return False, False, True, ""
        if self._yield_reason:
            return False, True, False, self._yield_reason
        if not self._asks_brake(node, marks) or self.brake is None:
            return True, False, False, ""  # keeping (or restoring) a taint we hold needs no brake
        ok, reason = self.brake.allows_new_taint(self.node_name, rv_text(node))
        return ok, not ok, False, reason

    def _apply_locked(self, marks: Marks) -> ApplyResult:
        conflicts = 0
        node_writes = status_writes = 0
        fresh = not self.watch.synced.is_set()
        decided: tuple[bool, bool, bool, str] = (False, False, False, "")
        had_taint = False

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(CONFLICT_ATTEMPTS),
            wait=tenacity.wait_random_exponential(multiplier=0.02, max=0.5),
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
                if self._asks_brake(node, marks) and not self.dry_run:
                    # Our failing labels first, without the taint: agents racing for the brake's free
                    # slots then see this node among the contenders (Brake: taking turns).
                    first = plan_node_patch(
                        node, marks, prefix=self.prefix, effect=self.taint_effect, taint_on=False
                    )
                    if first is not None:
                        node = write(node, first)
                decided = self._decide_taint(node, marks)
                taint_on = decided[0]
                had_taint = find_our_taint(node, self.prefix, self.taint_effect) is not None
                patch = plan_node_patch(
                    node, marks, prefix=self.prefix, effect=self.taint_effect, taint_on=taint_on
                )
                if patch is not None:
                    if self.dry_run:
                        log.info("node %s: dry run, would patch: %s", self.node_name, json.dumps(patch))
                        self._note("node", "skipped")
                    else:
                        adding = taint_on and not had_taint
                        self._taint_attempted |= adding  # stays set if the answer never comes
                        written = write(node, patch)
                        if adding:
                            self._taint_rv = rv_text(written)
        taint_on, brake_open, disabled, _ = decided
        node = self.watch.current(fresh=False)
        cond = plan_condition(node, marks, condition_type=self.condition_type, now=now_iso())
        if cond is not None:
            if self.dry_run:
                log.info("node %s: dry run, would set condition: %s", self.node_name, json.dumps(cond))
                self._note("status", "skipped")
            else:
                try:
                    self._patch_status(cond)
                except Exception:
                    self._note("status", "error")
                    raise
                status_writes += 1
                self._note("status", "ok")

        events = self._transition_events(marks, decided, had_taint)
        if not brake_open and self.brake is not None and self._brake_open:
            self.brake.forget()

        if not self.dry_run:
            self._taint_on = taint_on
            self._brake_open = brake_open
            self._disabled_noted = disabled
        if not taint_on:
            self._verify_scheduled = self._taint_attempted = False
        elif (
            self._taint_attempted
            and not self._verify_scheduled
            and not self.dry_run
            and self.brake is not None
        ):
            # Once per taint this writer added, also when a retry finds it already on: a write
            # whose answer timed out may have landed. A taint held from before (a restart) is kept
            # without a re-count: the brake never takes a taint away that it did not just grant.
            self._verify_scheduled = True
            self._schedule_verify()
        if self._yield_reason and brake_open:
            self._yield_reason = ""  # yielded; from now on the brake is asked again as usual
        to_post = [*self._pending_events, *events]
        self._pending_events = []
        posted = self._post_events(to_post, node)
        return ApplyResult(
            ok=True,
            node_writes=node_writes,
            status_writes=status_writes,
            conflicts=conflicts,
            tainted=taint_on and not self.dry_run,
            brake_open=brake_open,
            taint_disabled=disabled,
            events=posted,
            dry_run=self.dry_run,
        )

    def _schedule_verify(self, round_: int = 0) -> None:
        """Re-count, once racing agents' writes have landed, that our new taint did not break the
        limit. Several rounds (about 1×, 3×, 8× and 15× verify_delay_s after the taint): under a
        fleet-wide burst some racers' writes land after an early re-count."""
        if round_ >= len(VERIFY_ROUNDS):
            return
        delay = self.verify_delay_s * VERIFY_ROUNDS[round_] * (1 + 0.5 * random.random())
        timer = threading.Timer(delay, self._verify, args=(round_,))
        timer.daemon = True
        timer.start()

    def _verify(self, round_: int = 0) -> None:
        if self.brake is None or self.watch.stopped or not self._taint_on:
            return  # stopped, or the taint is already gone: nothing to yield
        try:
            last = round_ == len(VERIFY_ROUNDS) - 1
            yield_now, reason = self.brake.overshoot(self.node_name, self._taint_rv, last=last)
        except Exception as exc:  # API trouble: keep the taint; try the next round
            log.warning("node %s: brake re-count failed: %s", self.node_name, describe_error(exc))
            yield_now, reason = False, ""
        if yield_now and self._last_marks is not None:
            log.warning("node %s: %s", self.node_name, reason)
            self._yield_reason = reason
            self._apply(self._last_marks, ())
            return
        self._schedule_verify(round_ + 1)

    def _transition_events(
        self, marks: Marks, decided: tuple[bool, bool, bool, str], had_taint: bool
    ) -> list[NodeEvent]:
        """The Events our own decisions deserve (taint added/removed/restored, brake, disabled)."""
        taint_on, brake_open, disabled, brake_reason = decided
        keys = Keys(self.prefix)
        taint = f"{keys.taint}={marks.severity.label}:{self.taint_effect}"
        disable_label = f"{keys.taint_opt_out}={DISABLED}"
        out: list[NodeEvent] = []
        if taint_on and not had_taint:
            if self._taint_on:
                self.restores += 1
                out.append(
                    NodeEvent(
                        Reason.TAINT_RESTORED,
                        f"Taint {taint} was removed while the node fails; "
                        f"put it back (to stop tainting this node, label it {disable_label})",
                        WARNING,
                    )
                )
            else:
                if self._brake_open:
                    out.append(
                        NodeEvent(
                            Reason.BRAKE_CLOSED,
                            "Tainted GPU nodes are below the brake limit again; tainting this node",
                        )
                    )
                out.append(
                    NodeEvent(Reason.TAINT_ADDED, f"Tainted {taint}: {marks.condition_message}", WARNING)
                )
        elif not taint_on and had_taint:
            if disabled:
                out.append(
                    NodeEvent(
                        Reason.TAINT_DISABLED,
                        f"Removed taint {keys.taint}: label {disable_label} is set",
                    )
                )
            else:
                out.append(
                    NodeEvent(Reason.TAINT_REMOVED, f"Removed taint {keys.taint}: {marks.condition_message}")
                )
        elif disabled and not self._disabled_noted:
            out.append(
                NodeEvent(
                    Reason.TAINT_DISABLED,
                    f"Not tainting although the node fails: label {disable_label} is set",
                )
            )
        if brake_open and not self._brake_open:
            out.append(
                NodeEvent(Reason.BRAKE_OPEN, f"Not tainting although the node fails: {brake_reason}", WARNING)
            )
        elif self._brake_open and not brake_open and not taint_on:
            out.append(NodeEvent(Reason.BRAKE_CLOSED, "The node no longer needs a taint"))
        return out

    def _post_events(self, events: Sequence[NodeEvent], node: Mapping[str, Any]) -> tuple[str, ...]:
        posted: list[str] = []
        uid = (node.get("metadata") or {}).get("uid")
        for ev in events:
            if self.dry_run:
                log.info(
                    "node %s: dry run, would post Event %s (%s): %s",
                    self.node_name,
                    ev.reason,
                    ev.type,
                    ev.message,
                )
                self._note("event", "skipped")
                posted.append(ev.reason)
                continue
            now = now_iso()
            body = {
                "metadata": {"generateName": f"{self.node_name}.", "namespace": self.event_namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node_name,
                    **({"uid": uid} if uid else {}),
                },
                "reason": ev.reason,
                "message": ev.message[:EVENT_MESSAGE_MAX],
                "type": ev.type,
                "source": {"component": self.component, "host": self.node_name},
                "reportingComponent": self.component,
                "reportingInstance": self.node_name,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            try:
                self.rest.json(
                    "POST",
                    f"/api/v1/namespaces/{self.event_namespace}/events",
                    body=body,
                    timeout=REQUEST_TIMEOUT,
                )
            except Exception as exc:
                log.warning(
                    "node %s: posting Event %s failed: %s", self.node_name, ev.reason, describe_error(exc)
                )
                self._note("event", "error")
                continue
            log.info("node %s: Event %s (%s): %s", self.node_name, ev.reason, ev.type, ev.message)
            self._note("event", "ok")
            posted.append(ev.reason)
        return tuple(posted)

    # -- the watch -----------------------------------------------------------------------------------
    def _needs_restore(self, node: Mapping[str, Any]) -> bool:
        marks = self._last_marks
        return (
            marks is not None
            and marks.taint
            and self._taint_on
            and not self.dry_run
            and not taint_disabled(node, self.prefix)
            and find_our_taint(node, self.prefix, self.taint_effect) is None
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


__all__ = ["ApplyResult", "NodeWriter"]
