"""The Node writer's requests (DESIGN.md §4): the Node PATCH with its optimistic concurrency, the status
PATCH, putting conditions back, and how each outcome is counted.

The Node PATCH carries `metadata.resourceVersion` as its precondition: a 409 means someone wrote the
Node meanwhile, and the write is planned again on a fresh copy (tenacity, bounded). A 4xx the server
meant (refusals) raises WriteRefused; anything else propagates as it is. Every answer is kept as the
latest copy of the Node (NodeWatch.observe).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity

from agent.core.marks import Marks
from agent.reporters.history_entry import History
from agent.reporters.kube_rest import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    KubeRest,
    api_status,
    describe_error,
    node_path,
)
from agent.reporters.node_patch import (
    find_condition,
    find_our_taint,
    plan_node_patch,
    taint_disabled,
)
from agent.reporters.node_story import revert_conditions
from agent.reporters.node_watch import NodeWatch
from agent.reporters.refusals import WriteRefused, refusal_of
from agent.reporters.taint_gate import TaintDecision, TaintGate

log = logging.getLogger("agent.reporters.node_writer")  # the writer's log, as before the split

REQUEST_TIMEOUT = (5, 10)  # not kube_rest's (5, 30): a stuck Node write must not hold the loop
CONFLICT_ATTEMPTS = 12  # a busy controller on the same Node; each try re-reads the watched copy

Note = Callable[[str, str], None]  # (kind, outcome): the writer's on_write hook


class Conflict(Exception):
    """The Node changed under a write (409); the retry loop plans it again."""


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, Conflict)


@dataclass
class Counts:
    """What one apply sent."""

    node_writes: int = 0
    status_writes: int = 0
    conflicts: int = 0


class NodeRequests:
    """The PATCHes of one writer (see the module docstring)."""

    def __init__(
        self,
        rest: KubeRest,
        node_name: str,
        watch: NodeWatch,
        gate: TaintGate,
        *,
        prefix: str,
        component: str,
        dry_run: bool,
        note: Note,
        history: History | None = None,
    ) -> None:
        self.rest = rest
        self.node_name = node_name
        self.watch = watch
        self.gate = gate
        self.prefix = prefix
        self.component = component
        self.dry_run = dry_run
        self.note = note
        self.history = history  # the Node's history annotation, sent with the change it records

    def patch(self, subresource: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
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

    def send(self, kind: str, subresource: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
        """One PATCH, counted; a refusal raises WriteRefused (caused by the API's exception), a 409
        of the Node PATCH a Conflict."""
        try:
            written = self.patch(subresource, body, content_type)
        except Exception as exc:
            if kind == "node" and api_status(exc) == 409:
                self.note(kind, "conflict")
                raise Conflict(
                    f"409 Conflict: the Node kept changing ({CONFLICT_ATTEMPTS} attempts)"
                ) from exc
            self.note(kind, "error")
            refusal = refusal_of(exc, kind)
            if refusal is not None:
                raise WriteRefused(refusal) from exc
            raise
        self.note(kind, "ok")
        return written

    def node(self, marks: Marks, n: Counts, *, fresh: bool) -> tuple[TaintDecision, bool]:
        """The Node PATCH (the brake's contender labels first when it is asked): labels, annotation
        and taint, retried on 409. Returns the taint decision and whether our taint was on before."""
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
            patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
            try:
                written = self.send("node", "", patch, MERGE_PATCH)
            except Conflict:
                n.conflicts += 1
                raise
            n.node_writes += 1
            return written

        for attempt in retrying:
            with attempt:
                node = self.watch.current(fresh=fresh or attempt.retry_state.attempt_number > 1)
                if self.gate.asks_brake(node, marks) and not self.dry_run:
                    # Our failing labels first, without the taint: the Node says it fails (and the
                    # repair budget counts it) whatever the brake answers.
                    first = plan_node_patch(
                        node, marks, prefix=self.prefix, taint_on=False, slot=self.gate.claim()
                    )
                    if first is not None:
                        node = write(node, first)
                decided = self.gate.decide(node, marks)
                taint_on = decided.taint_on
                had_taint = find_our_taint(node, self.prefix) is not None
                label_on = marks.unhealthy_label and not taint_disabled(node, self.prefix)
                patch = plan_node_patch(
                    node,
                    marks,
                    prefix=self.prefix,
                    taint_on=taint_on,
                    label_on=label_on,
                    slot=self.gate.claim(),
                )
                keep = self.history if not self.dry_run else None
                entry = keep.annotation(node, marks, decided) if keep is not None else {}
                if entry:  # in the PATCH of the change it records
                    patch = patch or {}
                    patch.setdefault("metadata", {}).setdefault("annotations", {}).update(entry)
                if patch is not None:
                    if self.dry_run:
                        log.info("node %s: dry run, would patch: %s", self.node_name, json.dumps(patch))
                        self.note("node", "skipped")
                    else:
                        write(node, patch)
        return decided, had_taint

    def settle_history(self, marks: Marks) -> int:
        """The history's correction after a repair hold began or ended (History.settle): 0 or 1
        writes. A failure is logged and tried again at the next apply (the Node still differs)."""
        if self.history is None or self.dry_run:
            return 0
        patch = self.history.settle(self.watch.current(fresh=False), marks)
        if patch is None:
            return 0
        try:
            self.send("node", "", patch, MERGE_PATCH)
        except Exception as exc:
            log.warning("node %s: recording a repair hold in the history failed: %s", self.node_name, exc)
            return 0
        return 1

    def status(self, node: Mapping[str, Any], marks: Marks, conds: list[dict[str, Any]]) -> int:
        """*conds* in one status PATCH when there are any; the number of writes (0 or 1)."""
        if not conds:
            return 0
        if self.dry_run:
            log.info("node %s: dry run, would set conditions: %s", self.node_name, json.dumps(conds))
            self.note("status", "skipped")
            return 0
        self.send("status", "status", {"status": {"conditions": conds}}, STRATEGIC_MERGE_PATCH)
        self._log_remediation(node, marks, conds)
        return 1

    def revert(self, before: Mapping[str, Any], lead: list[dict[str, Any]]) -> bool:
        """The Node PATCH did not go through after the leading conditions landed: put them back as
        they were, so that the Node tells its old story whole. False when that failed (logged)."""
        back = revert_conditions(before, lead)
        try:
            if back:
                self.patch("status", {"status": {"conditions": back}}, STRATEGIC_MERGE_PATCH)
        except Exception as exc:
            self.note("status", "error")
            log.error(
                "node %s: putting our conditions back failed (%s): they may contradict the labels "
                "until the next write goes through",
                self.node_name,
                describe_error(exc),
            )
            return False
        self.note("status", "ok")
        log.warning(
            "node %s: the Node write did not go through; our conditions are back as they were", self.node_name
        )
        return True

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


__all__ = ["CONFLICT_ATTEMPTS", "REQUEST_TIMEOUT", "Conflict", "Counts", "NodeRequests"]
