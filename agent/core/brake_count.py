"""Who counts against the brake's cap (DESIGN.md §6.1): one share per node, whatever a token writes.

The brake's slots are Leases any agent token may create for its own node (the admission policy
checks only that a slot names its writer's node), so a slot alone proves nothing: one stolen token
could create every numbered slot for its one node, and a node tainted by an older version, or by
hand, holds none. The count therefore is of *nodes*, never of slots:

- a node counts when it carries our taint (the `<prefix>/tainted` label), slot or not;
- a node counts when it holds a slot it claims on its own Node (the `<prefix>/brake-slot` label the
  writer sets in the PATCH that adds the taint), or a slot younger than `grace_s` (its holder is
  between taking the slot and writing its Node), or a slot while its Node fails or is degraded (a
  node isolated by device taints holds a slot, carries no taint and claims none: the caller passes
  the failing and degraded nodes among the claimers; a token can make its own node fail, and it
  counts once);
- a node counts once, however many slots it holds;
- a slot of a Node that neither carries our taint nor claims a slot, once older than `grace_s`, is
  void: it counts for nothing (the stolen token's extra slots, a slot an older agent never freed).

Overflow slots (one per node, taken for this count) are ordered by resourceVersion as the repair
budget's marks are: an asker counts the nodes whose overflow slots were written before its own, and
not those written after (which count it), so that racing askers agree without a lock and never pass
the cap together. A counter granted while it holds a number keeps the number and frees its overflow
slot: an older agent in a mixed fleet sees only numbers, and must find that one held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GRACE_S = 120.0  # a slot this young counts whatever its Node says: the holder is writing its taint


@dataclass(frozen=True)
class Ticket:
    """One brake slot as listed: its name, holder node, creation (epoch s), resourceVersion, and
    whether it is an overflow slot (taken by a count, not by a number below the cap)."""

    name: str
    holder: str
    at: float = 0.0
    rv: int = 0
    overflow: bool = False


def counts(ticket: Ticket, claimers: set[str], now: float, grace_s: float = GRACE_S) -> bool:
    """Does *ticket* make its holder count? Claimed on its Node, or young."""
    return bool(ticket.holder) and (ticket.holder in claimers or now - ticket.at < grace_s)


def occupants(
    tickets: Iterable[Ticket],
    claimers: set[str],
    tainted: set[str],
    *,
    asker: str,
    now: float,
    own_rv: int | None = None,
    grace_s: float = GRACE_S,
) -> set[str]:
    """The nodes that count against the cap, the asker left out: tainted nodes, and holders of a
    slot that counts, except a node counting after the asker (its overflow slot written after the
    asker's own, *own_rv*): that one counts the asker, not the asker it. A counter may hold a number
    as well (it keeps the number when granted, so that an older agent, which sees only numbers,
    never takes it); its overflow slot orders it all the same."""
    tickets = list(tickets)
    late = {t.holder for t in tickets if t.overflow and own_rv is not None and t.rv >= own_rv}
    out = set(tainted)
    for t in tickets:
        if t.holder not in late and counts(t, claimers, now, grace_s):
            out.add(t.holder)
    out.discard(asker)
    return out


def void(
    tickets: Iterable[Ticket], claimers: set[str], tainted: set[str], now: float, grace_s: float = GRACE_S
) -> list[Ticket]:
    """The slots that count for nothing: their holder neither claims a slot nor carries our taint,
    and they are older than the grace; or their holder holds a lower one already (extra slots of one
    node). What `status` and the brake's log name."""
    seen: set[str] = set()
    out = []
    for t in sorted(tickets, key=lambda t: (t.overflow, t.rv)):
        live = t.holder in tainted or counts(t, claimers, now, grace_s)
        if not live or t.holder in seen:
            out.append(t)
        seen.add(t.holder)
    return out


__all__ = ["GRACE_S", "Ticket", "counts", "occupants", "void"]
