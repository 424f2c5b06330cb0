"""The brake's count of nodes (core/brake_count.py): one share per node, whatever a token writes."""

from __future__ import annotations

from agent.core.brake_count import Ticket, counts, occupants, void

NOW = 10_000.0
OLD = NOW - 600  # past any grace


def t(name: str, holder: str, at: float = OLD, rv: int = 1, overflow: bool = False) -> Ticket:
    return Ticket(name=name, holder=holder, at=at, rv=rv, overflow=overflow)


def test_a_slot_counts_when_its_holder_claims_it_or_while_it_is_young() -> None:
    assert counts(t("0", "a"), {"a"}, NOW)
    assert not counts(t("0", "a"), set(), NOW)  # old, unclaimed: void
    assert counts(t("0", "a", at=NOW - 5), set(), NOW)  # young: its holder is writing its Node
    assert not counts(t("0", "", at=NOW - 5), set(), NOW)  # names no node


def test_one_token_filling_every_number_counts_as_its_one_node_at_most() -> None:
    forged = [t(str(i), "x", rv=i + 1) for i in range(5)]
    assert occupants(forged, set(), set(), asker="a", now=NOW) == set()  # unclaimed: nothing
    assert occupants(forged, {"x"}, set(), asker="a", now=NOW) == {"x"}  # claimed: one share
    assert {v.name for v in void(forged, {"x"}, set(), NOW)} == {"1", "2", "3", "4"}


def test_a_node_tainted_without_a_slot_counts() -> None:
    held = [t("0", "a")]
    assert occupants(held, {"a"}, {"a", "old-1", "old-2"}, asker="me", now=NOW) == {"a", "old-1", "old-2"}


def test_the_asker_is_never_among_those_it_counts() -> None:
    assert occupants([t("0", "me")], {"me"}, {"me"}, asker="me", now=NOW) == set()


def test_overflow_slots_count_only_when_written_before_the_askers_own() -> None:
    slots = [t("x-a", "a", rv=10, overflow=True), t("x-b", "b", rv=20, overflow=True)]
    assert occupants(slots, {"a", "b"}, set(), asker="me", now=NOW, own_rv=15) == {"a"}
    assert occupants(slots, {"a", "b"}, set(), asker="me", now=NOW, own_rv=25) == {"a", "b"}
    # a numbered slot counts whatever its order: it was granted by its number, not by a count
    assert occupants([t("3", "c", rv=99)], {"c"}, set(), asker="me", now=NOW, own_rv=15) == {"c"}


def test_racing_overflow_askers_never_pass_the_cap_together() -> None:
    """Cap 2, one node counted: two askers take overflow slots; each counts the slots before its
    own, so the first is granted (1 < 2) and the second is not (2 >= 2)."""
    base = [t("0", "a")]
    first, second = t("x-p", "p", at=NOW, rv=50, overflow=True), t("x-q", "q", at=NOW, rv=51, overflow=True)
    seen = [*base, first, second]
    assert len(occupants(seen, {"a"}, set(), asker="p", now=NOW, own_rv=50)) < 2
    assert len(occupants(seen, {"a"}, set(), asker="q", now=NOW, own_rv=51)) >= 2
