"""The brake's count of nodes (the rule: core/brake_count.py) against the API server.

A number below the cap settles an ask by itself in a fleet where every tainted node holds the slot
it claims: that is the fast road (brake.py), a few creates whatever the fleet. Two states need a
count of nodes instead, and this module makes it:

- nodes count that no number shows: a node carrying our taint without claiming a slot (tainted by
  an older version, or by hand), or an overflow slot. A node granted a number asks two small lists
  (usually empty) before it takes the taint; when either finds one, it counts instead.
- a number is held by a slot that counts for nothing (one token's extra slots, a slot an older agent
  never freed). A refused node asks whether one slot it tried is claimed by its holder (a GET of the
  slot and a names-only list of one Node) at its first refusal, then at most every `period_s`; when
  it is not, it counts. A victim finds a forged slot at its first refusal; a held fleet pays two
  small requests per node every 5 minutes.

The count lists every slot of the brake, the Nodes that claim one and the Nodes that carry our taint
(names only, from the watch cache), after taking this node's overflow slot: racing counters are
ordered by their overflow slots' resourceVersions, so they never pass the cap together. It is
asked only in those two states, so the fleet's steady wave costs what it cost before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.brake_count import GRACE_S, occupants, void
from agent.core.node_keys import TRUE, Keys
from agent.reporters.brake_slots import Slots
from agent.reporters.node_names import list_names_doc, names_in_list

log = logging.getLogger(__name__)

# A refused node asks whether a slot it tried counts at its first refusal, then at most this often
# (as often as it looks for a slot whose Node is gone). Every minute cost a 4,000-node wave on one
# 2-core API server a third more CPU than it had: 504s (bench/README.md, "One share per node").
AUDIT_PERIOD_S = 300.0


@dataclass(frozen=True)
class Count:
    """What the last count found: the nodes counted (the asker among them when granted), the cap,
    and when (epoch s)."""

    counted: int
    cap: int
    at: float = 0.0


class Audit:
    """The count of one brake's nodes (see the module docstring)."""

    def __init__(
        self,
        slots: Slots,
        selected: Callable[[str], set[str]],
        *,
        clock: Callable[[], float] = time.time,
        period_s: float = AUDIT_PERIOD_S,
        grace_s: float = GRACE_S,
        on_count: Callable[[Count], None] | None = None,
    ) -> None:
        self.slots = slots
        self.selected = selected  # GPU nodes (within the brake's scope) matching one more selector
        self.keys = Keys(slots.prefix)
        self._clock = clock
        self.period_s = period_s
        self.grace_s = grace_s  # a slot this young counts whatever its holder's Node says
        self._asked: dict[str, float] = {}  # node -> when its tried slots were last checked
        self._on_count = on_count
        self.last: Count | None = None

    def outside_numbers(self, asker: str) -> bool:
        """Do nodes count that no number below the cap shows? Overflow slots of other nodes, or
        tainted GPU nodes that claim no slot. Two small lists, usually empty."""
        if any(t.holder != asker for t in self.slots.tickets(overflow_only=True)):
            return True
        return bool(self.selected(f"{self.keys.tainted}={TRUE},!{self.keys.brake_slot}") - {asker})

    def due(self, asker: str) -> bool:
        """May *asker* check the slots it tried now (at most every period_s)?"""
        now = self._clock()
        if now - self._asked.get(asker, float("-inf")) < self.period_s:
            return False
        self._asked[asker] = now
        return True

    def suspect(self, tried: Iterable[int]) -> bool:
        """Does one of the numbers *tried* count for nothing: freed since, or held by a slot past its
        grace whose holder does not claim it on its Node?"""
        now = self._clock()
        for i in tried:
            t = self.slots.get(i)
            if t is None:
                return True
            if now - t.at >= self.grace_s and not (t.holder and self._stands(t.holder, t.name)):
                log.info("brake: slot %s is not claimed by its holder %r: counting nodes", t.name, t.holder)
                return True
        return False

    def _stands(self, holder: str, name: str) -> bool:
        """Does *holder* stand behind its slot *name*: it claims it, or its Node fails or is degraded
        (a node isolated by device taints holds a slot, carries no taint and claims none)?"""
        if self.slots.claimed(holder, name):
            return True
        failing = self.keys.holding_status
        return holder in names_in_list(
            list_names_doc(
                self.slots.rest, "/api/v1/nodes", failing, field_selector=f"metadata.name={holder}"
            )
        )

    def take(self, asker: str, cap: int, node: Mapping[str, Any] | None) -> str | None:
        """Count the nodes after taking *asker*'s overflow slot: the slot's name when fewer than
        *cap* others count (it keeps the slot), else None (it frees it). API errors propagate."""
        own = self.slots.take_overflow(asker, node)
        try:
            tickets = self.slots.tickets(min_rv=own.rv)
            # a failing or degraded Node stands behind its slot too (an isolated node claims none)
            claimers = self.selected(self.keys.brake_slot) | self.selected(self.keys.holding_status)
            tainted = self.selected(f"{self.keys.tainted}={TRUE}")
        except Exception:
            self.slots.free(own.name)
            raise
        now = self._clock()
        others = occupants(
            tickets, claimers, tainted, asker=asker, now=now, own_rv=own.rv, grace_s=self.grace_s
        )
        count = Count(counted=len(others) + (1 if len(others) < cap else 0), cap=cap, at=now)
        self.last = count
        if self._on_count is not None:
            self._on_count(count)
        nothing = [t.name for t in void(tickets, claimers, tainted, now, self.grace_s)]
        if nothing:
            log.warning("brake: %d slots count for nothing (no holder claims them): %s", len(nothing),
                        ", ".join(nothing[:5]))  # fmt: skip
        if len(others) < cap:
            return own.name
        self.slots.free(own.name)
        return None


__all__ = ["AUDIT_PERIOD_S", "Audit", "Count"]
