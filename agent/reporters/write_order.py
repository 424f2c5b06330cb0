"""The order of the Node writer's two requests, with the requests themselves (node_story decides,
pure; this sends): a new fault's Node PATCH with our taint leads and its conditions follow; any
other change's conditions lead and the Node PATCH follows, refused after they landed they are put
back (DESIGN.md §4). A part of NodeWriter (reporters/node_writer.py), which holds the state it uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from agent.config import Config
from agent.core.marks import Marks
from agent.core.repair_budget import Hold
from agent.core.results_doc import now_iso
from agent.reporters.node_patch import find_condition, plan_conditions
from agent.reporters.node_requests import Conflict, Counts, NodeRequests
from agent.reporters.node_story import lead_conditions
from agent.reporters.refusals import WriteRefused
from agent.reporters.taint_gate import TaintDecision, TaintGate

NOTHING = "Nothing of this change was written: the Node keeps its labels, taint and conditions"
KEPT_WAITING = (
    "The labels, taint and our condition are written; "
    "the remediation conditions that wait for the taint keep their value"
)


class WriteOrder:
    """The conditions' plan and the two orders of the writes; NodeWriter sets these attributes."""

    requests: NodeRequests
    gate: TaintGate
    dry_run: bool
    prefix: str
    cfg: Config  # node.conditionType is read from it
    _retired_conditions: set[str]  # our old condition types, removed at the next apply

    def _plan_conditions(
        self, node: Mapping[str, Any], marks: Marks, decided: TaintDecision, hold: Hold | None = None
    ) -> list[dict[str, Any]]:
        """Our condition, the remediation conditions and the removal of ours no longer configured;
        *hold*: the repair budget's or a wave's answer for a new remediation mark."""
        self._retired_conditions -= {t for t in self._retired_conditions if find_condition(node, t) is None}
        return plan_conditions(
            node,
            marks,
            condition_type=self.cfg.node.condition_type,
            retired=sorted(self._retired_conditions),
            taint_on=decided.taint_on,
            brake_open=decided.brake_open,
            disabled=decided.disabled,
            prefix=self.prefix,
            now=now_iso(),
            hold=hold,
        )

    def _write_status(self, node: Mapping[str, Any], marks: Marks, conds: list[dict[str, Any]]) -> int:
        wrote = self.requests.status(node, marks, conds)
        if wrote:
            self._retired_conditions -= {c["type"] for c in conds if c.get("$patch") == "delete"}
        return wrote

    def _without_waiting(
        self, node: dict[str, Any], marks: Marks, conds: list[dict[str, Any]], n: Counts
    ) -> str:
        """A new fault's status PATCH refused after the taint: once more without the remediation
        entries that would turn unhealthy (a type the fence disputes), so our condition tells it."""
        rest = lead_conditions(node, marks, conds)
        if rest != conds:
            with contextlib.suppress(WriteRefused):
                n.status_writes += self._write_status(node, marks, rest)
                return KEPT_WAITING
        return "The labels and taint are written; our conditions keep their value until a write goes through"

    def _taint_first(self, marks: Marks, n: Counts) -> tuple[TaintDecision, bool]:
        """A new fault (node_story): the Node PATCH with our taint leads, the conditions follow."""
        try:
            return self.requests.node(marks, n, fresh=False)  # the copy has the answer
        except WriteRefused as exc:
            if n.node_writes:  # the brake's contender labels landed
                exc.kept = "The status labels are written, the taint and our conditions are not"
            raise

    def _conditions_first(self, node: dict[str, Any], marks: Marks, n: Counts) -> tuple[TaintDecision, bool]:
        """Any other change (node_story): the conditions lead, the Node PATCH follows; refused after
        they landed, they are put back."""
        before = node
        # While the brake is still to be asked, plan as if the taint went on: a remediation
        # condition that would turn unhealthy waits for it either way.
        asks = self.gate.asks_brake(node, marks)
        pre = TaintDecision(taint_on=True) if asks else self.gate.decide(node, marks)
        lead = [] if self.dry_run else lead_conditions(node, marks, self._plan_conditions(node, marks, pre))
        n.status_writes += self._write_status(node, marks, lead)
        try:
            return self.requests.node(marks, n, fresh=False)  # the copy has the answer
        except (WriteRefused, Conflict) as exc:
            kept = ""
            if n.node_writes:  # the brake's contender labels landed; they match the leading conditions
                kept = "The status labels and our condition are written, the taint is not"
            elif n.status_writes:
                if self.requests.revert(before, lead):
                    self._retired_conditions |= {str(c["type"]) for c in lead if c.get("$patch") == "delete"}
                    kept = f"{NOTHING}: our conditions were put back"
                else:
                    kept = "Our conditions were written, the labels were not, and putting them back failed"
            if isinstance(exc, WriteRefused) and kept:
                exc.kept = kept
            raise


__all__ = ["KEPT_WAITING", "NOTHING", "WriteOrder"]
