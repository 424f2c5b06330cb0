"""Whether our taint goes on, and the brake's yield (DESIGN.md §4, §6.1): the writer's concurrency state.

The rules:
- A taint we do not hold yet asks the brake; keeping (or restoring) one we hold never does, and
  `<prefix>/taint=disabled` on the Node means no taint whatever the Marks say.
- After this writer sent a write adding our taint, the brake re-counts a few times (about 1×, 3×,
  8× and 15× `verify_delay_s` later, on timer threads): racing agents may have tainted past the limit
  in the same instant, and under a fleet-wide burst some of their writes land late. When the brake
  says this node is one too many, it yields: the writer applies its last Marks again, the decision
  is "brake open" once, the taint comes off, and from then on the brake is asked as usual.
- The re-count runs once per taint this writer added, also when a retry found it already on (the
  write whose answer timed out may have landed). A taint held from before (a restart) is kept
  without one: the brake never takes away a taint it did not just grant.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.marks import Marks
from agent.reporters.brake import Brake
from agent.reporters.kube_rest import describe_error
from agent.reporters.node_patch import find_our_taint, rv_text, taint_disabled

log = logging.getLogger(__name__)

VERIFY_ROUNDS = (1.0, 3.0, 8.0, 15.0)  # post-taint re-counts, in units of verify_delay_s


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
    """The taint decision of one writer and its brake's yield state (see the module docstring).

    decide() runs under the writer's apply lock; the re-count timers read `state` and set the yield
    reason from their own threads, then apply again through *reapply* (which takes that lock).
    """

    def __init__(
        self,
        node_name: str,
        brake: Brake | None,
        *,
        prefix: str,
        reapply: Callable[[], None],
        stopped: Callable[[], bool],
    ) -> None:
        self.node_name = node_name
        self.brake = brake
        self.prefix = prefix
        self._reapply = reapply
        self._stopped = stopped
        self.state = TaintState()
        self.verify_delay_s = 2.0  # racing agents' writes land within this; then the count is settled
        self._yield_reason = ""  # set when a post-taint check found a race over the brake limit
        self._taint_rv: str | None = None  # resourceVersion of the write that added our taint
        self._verify_scheduled = False  # the post-taint re-count runs for the current taint
        self._taint_attempted = False  # this writer sent a write adding our taint (answer or not)

    # -- the decision --------------------------------------------------------------------------------
    def asks_brake(self, node: Mapping[str, Any], marks: Marks) -> bool:
        """Would decide() ask the brake (a new taint) rather than answer by itself?"""
        return (
            marks.taint
            and self.brake is not None
            and not taint_disabled(node, self.prefix)
            and not self._yield_reason
            and find_our_taint(node, self.prefix) is None
            and not self.state.taint_on
        )

    def decide(self, node: Mapping[str, Any], marks: Marks) -> TaintDecision:
        if not marks.taint:
            return TaintDecision()
        if taint_disabled(node, self.prefix):
            return TaintDecision(disabled=True)
        if self._yield_reason:
            return TaintDecision(brake_open=True, brake_reason=self._yield_reason)
        if not self.asks_brake(node, marks) or self.brake is None:
            return TaintDecision(taint_on=True)  # keeping (or restoring) a taint we hold needs no brake
        ok, reason = self.brake.allows_new_taint(self.node_name, rv_text(node))
        return TaintDecision(taint_on=ok, brake_open=not ok, brake_reason=reason)

    # -- what the writer did with it -----------------------------------------------------------------
    def sending_taint(self) -> None:
        """A write adding our taint goes out; it counts as attempted even if its answer never comes."""
        self._taint_attempted = True

    def taint_landed(self, resource_version: str | None) -> None:
        """The write adding our taint was answered with this resourceVersion."""
        self._taint_rv = resource_version

    def settle(self, decision: TaintDecision, *, dry_run: bool) -> None:
        """After a successful apply: keep its outcome, schedule the re-counts, end a yield."""
        if not decision.brake_open and self.brake is not None and self.state.brake_open:
            self.brake.forget()
        if not dry_run:
            self.state = TaintState(decision.taint_on, decision.brake_open, decision.disabled)
        if not decision.taint_on:
            self._verify_scheduled = self._taint_attempted = False
        elif self._taint_attempted and not self._verify_scheduled and not dry_run and self.brake is not None:
            self._verify_scheduled = True
            self._schedule_verify()
        if self._yield_reason and decision.brake_open:
            self._yield_reason = ""  # yielded; from now on the brake is asked again as usual

    # -- the post-taint re-counts --------------------------------------------------------------------
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
        if self.brake is None or self._stopped() or not self.state.taint_on:
            return  # stopped, or the taint is already gone: nothing to yield
        try:
            last = round_ == len(VERIFY_ROUNDS) - 1
            yield_now, reason = self.brake.overshoot(self.node_name, self._taint_rv, last=last)
        except Exception as exc:  # API trouble: keep the taint; try the next round
            log.warning("node %s: brake re-count failed: %s", self.node_name, describe_error(exc))
            yield_now, reason = False, ""
        if yield_now:
            log.warning("node %s: %s", self.node_name, reason)
            self._yield_reason = reason
            self._reapply()
            return
        self._schedule_verify(round_ + 1)


__all__ = ["VERIFY_ROUNDS", "TaintDecision", "TaintGate", "TaintState"]
