"""Whether our taint goes on (DESIGN.md §4, §6.1): the writer's taint decision and its brake slot.

The rules:
- A taint we do not hold yet asks the brake, which grants it with a slot of its own (reporters/
  brake.py); keeping (or restoring) one we hold never does, and `<prefix>/taint=disabled` on the Node
  means no taint whatever the Marks say.
- The slot is freed once an apply that leaves our taint off has landed and the node wants no taint
  (it recovered, or the label disables it): never before the taint is off, so at most the brake's cap
  of nodes carry it at any time. A node that still fails keeps its slot while the taint is off for
  another reason (its GPUs isolated one by one: reporters/device_isolation.py asks the same brake).
- A taint found on the Node at the first apply (a restarted agent, or one of an older version) is
  kept, and the brake is asked to find its slot, or to give it one if one is free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.marks import Marks
from agent.core.severity import Status
from agent.reporters.brake import Brake
from agent.reporters.node_patch import find_our_taint, rv_text, taint_disabled


@dataclass(frozen=True)
class TaintDecision:
    """What one apply does with our taint, for one Node and one Marks."""

    taint_on: bool = False  # our taint is (to be) on
    brake_open: bool = False  # the Marks want a taint, but the brake refused it (or we yield)
    disabled: bool = False  # the Marks want a taint, but `<prefix>/taint=disabled` is set
    brake_reason: str = ""  # the brake's words when it refused


@dataclass(frozen=True)
class TaintState:
    """What the last successful (not dry-run) apply left on the Node, as the writer knows it."""

    taint_on: bool = False
    brake_open: bool = False
    disabled: bool = False


class TaintGate:
    """The taint decision of one writer and its brake slot (see the module docstring); decide() and
    settle() run under the writer's apply lock."""

    def __init__(self, node_name: str, brake: Brake | None, *, prefix: str) -> None:
        self.node_name = node_name
        self.brake = brake
        self.prefix = prefix
        self.state = TaintState()
        self._adopted = False  # the brake was asked about a taint found on the Node (once)
        self._wants_none = False  # the Marks of the last decide want no taint, and the node is not failing

    def claim(self, decision: TaintDecision | None = None) -> str | None:
        """The brake slot this node holds, as its Node claims it (`<prefix>/brake-slot`; None:
        absent), in every PATCH: on with the taint that took the slot, off with the taint of a node
        that wants none (its slot is freed after that PATCH; a slot nobody claims counts for nothing)."""
        if self.brake is None or (decision is not None and not decision.taint_on and self._wants_none):
            return None
        return self.brake.claim(self.node_name)

    # -- the decision --------------------------------------------------------------------------------
    def asks_brake(self, node: Mapping[str, Any], marks: Marks) -> bool:
        """Would decide() ask the brake (a new taint) rather than answer by itself?"""
        return (
            marks.taint
            and self.brake is not None
            and not taint_disabled(node, self.prefix)
            and find_our_taint(node, self.prefix) is None
            and not self.state.taint_on
        )

    def decide(self, node: Mapping[str, Any], marks: Marks) -> TaintDecision:
        # a failing or degraded node without our taint holds its slot for its isolated GPUs' rules
        self._wants_none = not marks.taint and marks.status not in (Status.FAIL, Status.DEGRADED)
        if not marks.taint:
            return TaintDecision()
        if taint_disabled(node, self.prefix):
            self._wants_none = True
            return TaintDecision(disabled=True)
        if not self.asks_brake(node, marks) or self.brake is None:
            if self.brake is not None and not self._adopted and find_our_taint(node, self.prefix) is not None:
                self._adopted = True
                self.brake.adopt(self.node_name, node)
            return TaintDecision(taint_on=True)  # keeping (or restoring) a taint we hold needs no brake
        ok, reason = self.brake.allows_new_taint(self.node_name, rv_text(node), node)
        return TaintDecision(taint_on=ok, brake_open=not ok, brake_reason=reason)

    # -- what the writer did with it -----------------------------------------------------------------
    def settle(self, decision: TaintDecision, *, dry_run: bool) -> None:
        """After a successful apply: keep its outcome; free the brake slot once the taint is off and
        wanted no more."""
        if not decision.brake_open and self.brake is not None and self.state.brake_open:
            self.brake.forget(self.node_name)
        if dry_run:
            return
        self.state = TaintState(decision.taint_on, decision.brake_open, decision.disabled)
        self._adopted = self._adopted or decision.taint_on
        if self.brake is not None and not decision.taint_on and self._wants_none:
            self.brake.release(self.node_name)


__all__ = ["TaintDecision", "TaintGate", "TaintState"]
