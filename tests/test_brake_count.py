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


def test_status_names_the_sets_the_brake_counts() -> None:
    """The review's state: gpu-1, gpu-2 tainted by an older version (no slot); gpu-4 holds slot 0 and
    claims it; gpu-6 holds slot 1 by a stolen token and claims none; gpu-3 is held back; gpu-6 also
    carries our taint though its agent says pass."""
    from agent.cli.status_brake import brake_lines
    from agent.cli.status_node import NodeStatus
    from agent.cli.status_rollout import Rollout
    from agent.core.node_keys import Keys

    k = Keys()

    def node(name: str, **labels: str) -> dict[str, object]:
        return {"metadata": {"name": name, "labels": labels}}

    def st(name: str, status: str, taint: str | None, would: str | None) -> NodeStatus:
        return NodeStatus(
            node=name, status=status, severity="-", worstFinding="-", nextStep="-", lastCheck="-",
            lastCheckMaxSeconds=None, agent="ready", agentPod=None, changedAt=None, taint=taint,
            instanceType=None, agentVersion=None, rollout=Rollout("main", "d", "taint", would),
        )  # fmt: skip

    tainted = {k.tainted: "true"}
    nodes = [
        node("gpu-1", **tainted), node("gpu-2", **tainted), node("gpu-3"),
        node("gpu-4", **tainted, **{k.brake_slot: "fleet-0"}), node("gpu-6", **tainted),
    ]  # fmt: skip
    would = "reboot:NoSchedule"
    statuses = [
        st("gpu-1", "fail", "reboot", would),
        st("gpu-2", "fail", "reboot", would),
        st("gpu-3", "fail", None, would),
        st("gpu-4", "fail", "reboot", would),
        st("gpu-6", "pass", "reboot", None),
    ]
    tickets = [
        t("gpu-healthcheck-taint-fleet-0", "gpu-4", rv=1),
        t("gpu-healthcheck-taint-fleet-1", "gpu-6", rv=2),
    ]
    kw = {"cap": 2, "total": 6, "prefix": "gpu-healthcheck", "now": NOW}
    lines = brake_lines(nodes, statuses, tickets, limit="maxTaintedFraction 0.2", **kw)  # type: ignore[arg-type]
    text = "\n".join(lines)
    assert lines[0] == "BRAKE (cap 2 of 6 GPU nodes, maxTaintedFraction 0.2; 4 count: OVER THE CAP)"
    assert (
        "holding a slot: gpu-4 (gpu-healthcheck-taint-fleet-0), gpu-6 (gpu-healthcheck-taint-fleet-1)" in text
    )
    assert "tainted without a slot (they count: an older version's, or by hand): gpu-1, gpu-2" in text
    assert "held back by the brake (would be tainted): gpu-3" in text
    assert "WARNING our taint on a node whose agent does not want it: gpu-6" in text
    assert brake_lines(nodes[2:3], [], [], limit="", **kw) == []  # type: ignore[arg-type]


def test_an_overflow_slot_reads_as_a_number_above_any_cap_to_an_older_agent() -> None:
    """Rolled back, an agent that knows only numbered slots parses a slot's last part as its number
    (int(name.rsplit("-", 1)[1])): an overflow slot must parse, and sit above every cap, so that
    the old agent frees it instead of failing its look."""
    from agent.reporters.brake_slots import Slots

    slots = Slots(None, "gpu-healthcheck", "gpu-healthcheck")  # type: ignore[arg-type]  # no request made
    name = slots.overflow_name("ip-10-0-0-1.ec2.internal")
    assert slots.is_overflow(name) and int(name.rsplit("-", 1)[1]) >= 10**15
    assert slots.index(name) > 10**9 and slots.index(slots.name(3)) == 3
    assert len(slots.claim(name)) <= 63  # a label value
    assert slots.overflow_name("a") != slots.overflow_name("b")


def test_racing_counters_holding_numbers_count_each_other_once_in_order() -> None:
    """Two nodes each hold a number (kept when granted: an older agent sees only numbers) and an
    overflow slot that orders their counts: the earlier does not count the later, the later counts
    the earlier. Neither refuses for the other's sake alone, and both never pass the cap together."""
    seen = [
        t("0", "a"),
        t("1", "p", at=NOW, rv=48),
        t("x-p", "p", at=NOW, rv=50, overflow=True),
        t("2", "q", at=NOW, rv=49),
        t("x-q", "q", at=NOW, rv=51, overflow=True),
    ]
    assert occupants(seen, {"a"}, set(), asker="p", now=NOW, own_rv=50) == {"a"}
    assert occupants(seen, {"a"}, set(), asker="q", now=NOW, own_rv=51) == {"a", "p"}


def test_status_counts_an_older_agents_isolated_node_by_its_slot() -> None:
    """A node an older agent isolated by device taints: it holds a slot, carries no taint, claims
    none, and fails. Its slot counts (it is not void), once."""
    from agent.cli.status_brake import brake_lines
    from agent.core.node_keys import Keys

    k = Keys()
    nodes = [{"metadata": {"name": "iso", "labels": {k.status: "fail"}}}]
    tickets = [t("gpu-healthcheck-taint-fleet-0", "iso")]
    kw = {"cap": 1, "total": 6, "prefix": "gpu-healthcheck", "now": NOW, "limit": "x"}
    lines = brake_lines(nodes, [], tickets, **kw)  # type: ignore[arg-type]
    assert lines[0].endswith("; 1 count)") and "count for nothing" not in "\n".join(lines)
