"""The repair budget and the wave hold: the pure decisions (core/repair_budget.py), the writer's
question (newly_marking), the config keys and the condition a held node shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import parse_config
from agent.config.schema import ConfigError
from agent.core.findings import Finding
from agent.core.marks import Marks
from agent.core.record_kind import RecordKind
from agent.core.remediation_types import OUR_CONDITION_REASONS, RemediationMark, RemediationReason
from agent.core.repair_budget import (
    BudgetPolicy,
    Hold,
    HoldReason,
    Record,
    WavePolicy,
    budget_count,
    budget_hold,
    budget_limit,
    budget_spent,
    finding_key,
    key_slug,
    markers_holding,
    newly_marking,
    quorum_met,
    wave_decision,
    wave_threshold,
)
from agent.core.severity import Severity, Status
from agent.engine.remediation import remediation_condition
from agent.reporters.budget_records import record_of

FAIL, MARK, RELEASE = RecordKind.FAIL, RecordKind.MARK, RecordKind.RELEASE
R = RemediationReason
AHR = "AcceleratedHardwareReady"


def fail(node: str, key: str, at: float, rv: int = 0) -> Record:
    return Record(name=f"f-{node}", kind=FAIL, node=node, key=key, at=at, rv=rv or int(at) + 1)


def mark(node: str, at: float, rv: int, pool: str = "") -> Record:
    return Record(name=f"m-{node}-{rv}", kind=MARK, node=node, pool=pool, at=at, rv=rv)


def test_finding_key_is_check_plus_the_rest_of_the_rule() -> None:
    xid = Finding("xid", "xid.79", Severity.REBOOT, "Xid 79", key="xid/79/0000:53:00.0")
    hung = Finding("gpu.responsive", "gpu.responsive.timeout", Severity.REBOOT, "hung")
    other = Finding("pci", "gpu.pcie-width", Severity.RESET, "x16 → x8")
    assert finding_key(xid) == "xid/79"  # the same on every GPU and node: one wave
    assert finding_key(hung) == "gpu.responsive/timeout"
    assert finding_key(other) == "pci/gpu.pcie-width"
    assert finding_key(None) == "unknown"
    assert key_slug("xid/79") == "xid_79" and key_slug("///") == "unknown"


@pytest.mark.parametrize(
    ("policy", "total", "limit"),
    [
        (BudgetPolicy(10, 0.05), 2000, 10),  # the default on a big fleet: 10 per hour
        (BudgetPolicy(10, 0.05), 100, 5),  # 5 % of 100
        (BudgetPolicy(10, 0.05), 4, 1),  # a small pool can always have one node repaired
        (BudgetPolicy(0, 0.05), 2000, 100),  # no absolute cap
        (BudgetPolicy(3, 1.0), 2000, 3),  # no fraction cap
        (BudgetPolicy(0, 1.0), 2000, 10**9),  # off
    ],
)
def test_budget_limit_is_the_smaller_cap(policy: BudgetPolicy, total: int, limit: int) -> None:
    assert budget_limit(policy, total) == limit
    assert policy.on is (limit != 10**9)


def test_wave_threshold_is_min_nodes_and_the_fraction() -> None:
    assert wave_threshold(WavePolicy(5, 0.02), 100) == 5
    assert wave_threshold(WavePolicy(5, 0.02), 2000) == 40
    assert not WavePolicy(0, 0.02).on


def test_the_budget_counts_marks_written_before_ours_within_the_window() -> None:
    policy = BudgetPolicy(2, 1.0, window_s=3600)
    records = [mark("a", 1000, 1), mark("b", 2000, 2), mark("c", 2001, 3), mark("d", 2002, 4)]
    # c is third by resourceVersion: over a limit of 2; b second: within it
    assert budget_hold(budget_count(records, records[1], 3600, None), 2, policy, "xid/79", None) is None
    held = budget_hold(budget_count(records, records[2], 3600, None), 2, policy, "xid/79", None)
    assert held is not None and held.why == HoldReason.BUDGET and "limit is 2" in held.message
    # a is more than a window older than d: it no longer counts against d
    late = mark("e", 1000 + 3601, 5)
    assert budget_count([*records, late], late, 3600, None) == 4  # b, c, d and e
    # the cheap look before writing our own
    assert budget_spent(records, now=2003, window_s=3600, pool=None) == 4
    assert budget_spent(records, now=1000 + 3600 + 5, window_s=3600, pool=None) == 3


def test_the_budget_counts_distinct_nodes_not_records() -> None:
    """One node's token can write any number of marks of its own node (production review 3, C2): they
    count as one node, so 3 marks of x spend one share of a budget, not three."""
    forged = [mark("x", 1000, 1), mark("x", 1000, 2), mark("x", 1001, 3)]
    own = mark("y", 1002, 4)
    assert budget_count([*forged, own], own, 3600, None) == 2  # x once, and y
    assert (
        budget_hold(budget_count([*forged, own], own, 3600, None), 2, BudgetPolicy(2, 1.0), "k", None) is None
    )
    # the resourceVersion order still decides who is first: x's marks after y's do not count against y
    later = [mark("y", 1000, 1), mark("x", 1001, 5), mark("x", 1001, 6)]
    assert budget_count(later, later[0], 3600, None) == 1
    # the cheap look before writing: the other nodes marked (x once), this node's own earlier one not
    assert budget_spent(forged, now=1003, window_s=3600, pool=None) == 1
    assert budget_spent([*forged, mark("y", 900, 0)], 1003, 3600, None, node="y") == 1
    assert budget_spent(forged, 1003, 3600, None, node="x") == 0


def test_a_wave_marker_holds_other_nodes_only_on_its_quorum() -> None:
    """A marker is anyone's to write for its own node (C2): it holds the rest of the fleet only while
    minNodes distinct nodes have a fail record of its key written after the key's last release."""
    forged = [fail("x", "xid/79", 10, rv=1), Record("f2", FAIL, "x", "xid/79", at=11, rv=2)]
    assert quorum_met(forged, "xid/79", 0, 3, complete=True) is False  # one node, twice
    assert quorum_met(forged, "xid/79", 0, 3, complete=False) is None  # cut at its bound: not known
    wave = [fail(n, "xid/79", 10 + i, rv=10 + i) for i, n in enumerate("abc")]
    assert quorum_met(wave, "xid/79", 0, 3, complete=False) is True
    assert quorum_met(wave, "xid/79", 11, 3, complete=True) is False  # a and b came before the release
    assert quorum_met(wave, "gpu.responsive/timeout", 0, 3, complete=True) is False  # another key
    markers = [Record("w-x", "wave", "x", "xid/79", rv=20), Record("w-y", "wave", "y", "xid/79", rv=21)]
    assert markers_holding(markers, "y", quorum=True) == markers
    assert markers_holding(markers, "z", quorum=False) == []  # x's marker holds back only x
    assert markers_holding(markers, "x", quorum=False) == markers[:1]


def test_the_budget_per_label_counts_only_the_same_pool() -> None:
    records = [mark("a", 10, 1, "zone-a"), mark("b", 11, 2, "zone-b"), mark("c", 12, 3, "zone-a")]
    assert budget_count(records, records[2], 3600, "zone-a") == 2
    assert budget_count(records, records[2], 3600, None) == 3


def test_a_release_without_a_key_restarts_the_budget_window() -> None:
    records = [mark("a", 10, 1), mark("b", 11, 2), Record("r", RELEASE, at=20, rv=3, by="sre", reason="x")]
    own = mark("c", 30, 4)
    assert budget_count([*records, own], own, 3600, None) == 1
    # after the release by the API server's write order, not by the second it was written in
    same_second = mark("d", 20, 5)
    assert budget_count([*records, own, same_second], same_second, 3600, None) == 2
    keyed = [*records[:2], Record("r", RELEASE, key="xid/79", at=20, rv=3)]
    assert budget_count([*keyed, own], own, 3600, None) == 3  # a keyed release is about the wave only


def test_the_wave_holds_at_n_nodes_on_one_key_within_the_window_and_not_for_another() -> None:
    policy = WavePolicy(min_nodes=3, min_fraction=0.0, window_s=900)
    failing = {"a", "b", "c", "d"}
    two = [fail("a", "xid/79", 0), fail("b", "xid/79", 100)]
    assert wave_decision(two, "xid/79", failing, 100, policy) is None
    three = [*two, fail("c", "xid/79", 800)]
    held = wave_decision(three, "xid/79", failing, 100, policy)
    assert held is not None and held.why == HoldReason.WAVE and held.key == "xid/79"
    assert "3 GPU nodes fail on xid/79" in held.message
    assert (
        wave_decision(
            [*three, fail("d", "gpu.responsive/timeout", 801)], "gpu.responsive/timeout", failing, 100, policy
        )
        is None
    )
    # a trickle is no wave: three failures, never three within 15 min
    trickle = [fail("a", "xid/79", 0), fail("b", "xid/79", 1000), fail("c", "xid/79", 2000)]
    assert wave_decision(trickle, "xid/79", failing, 100, policy) is None


def test_the_wave_lasts_while_its_nodes_still_fail_and_ends_when_they_recover_or_are_released() -> None:
    policy = WavePolicy(min_nodes=3, min_fraction=0.0, window_s=900)
    records = [fail(n, "xid/79", i) for i, n in enumerate("abcd")]
    assert wave_decision(records, "xid/79", {"a", "b", "c", "d"}, 100, policy) is not None
    # hours later, still failing: still held (a persistent false positive is not repaired in a roll)
    assert wave_decision(records, "xid/79", {"a", "b", "c"}, 100, policy) is not None
    # two recovered (or their Nodes are gone): the wave has ended
    assert wave_decision(records, "xid/79", {"a", "b"}, 100, policy) is None
    # an operator released it: the records before the release no longer count, later ones do
    released = [*records, Record("r", RELEASE, key="xid/79", at=10, rv=15)]  # after them (rv 1-4)
    assert wave_decision(released, "xid/79", {"a", "b", "c", "d"}, 100, policy) is None
    again = [*released, *(fail(n, "xid/79", 20 + i) for i, n in enumerate("efg"))]
    assert wave_decision(again, "xid/79", set("abcdefg"), 100, policy) is not None
    # a release of another key does not lift it
    other = [*records, Record("r", RELEASE, key="xid/48", at=10, rv=15)]
    assert wave_decision(other, "xid/79", {"a", "b", "c", "d"}, 100, policy) is not None


def test_the_wave_needs_its_fraction_of_the_fleet() -> None:
    policy = WavePolicy(min_nodes=5, min_fraction=0.02, window_s=900)
    records = [fail(f"n{i}", "xid/79", i) for i in range(39)]
    names = {r.node for r in records}
    assert wave_decision(records, "xid/79", names, 2000, policy) is None  # 39 < 2 % of 2000
    records.append(fail("n39", "xid/79", 39))
    assert wave_decision(records, "xid/79", names | {"n39"}, 2000, policy) is not None


def _marks(key: str, *, unhealthy: bool = True) -> Marks:
    doc = {"version": 1, "status": "fail", "severity": "reboot", "checks": [], "latched": []}
    return Marks(
        status=Status.FAIL,
        severity=Severity.REBOOT,
        results_json=json.dumps(doc),
        taint=True,
        condition_message="fail",
        remediation=(RemediationMark(AHR, "False", unhealthy, R.FAILED, "fail (reboot): xid: Xid 79", key),),
    )


def _node(status: str | None, reason: str = R.FAILED) -> dict[str, object]:
    conds = [{"type": AHR, "status": status, "reason": reason}] if status else []
    return {"metadata": {"name": "n"}, "status": {"conditions": conds}}


def test_only_a_new_mark_asks_the_budget() -> None:
    assert newly_marking(_node(None), _marks("xid/79"), taint_on=True) == "xid/79"
    assert newly_marking(_node("True", R.PASSED), _marks("xid/79"), taint_on=True) == "xid/79"
    assert newly_marking(_node("True", R.WAVE_HELD), _marks("xid/79"), taint_on=True) == "xid/79"
    # marked already: stays marked, whatever the budget says now
    assert newly_marking(_node("False", R.FAILED), _marks("xid/79"), taint_on=True) is None
    assert newly_marking(_node("False", R.RECOVERING), _marks("xid/79"), taint_on=True) is None
    # a renamed entry on a marked node is no new mark: the old type still shows ours unhealthy
    renamed = {
        "metadata": {"name": "n"},
        "status": {"conditions": [{"type": "Old", "status": "False", "reason": R.FAILED}]},
    }
    assert newly_marking(renamed, _marks("xid/79"), taint_on=True) is None
    # another component's False is not our mark
    assert newly_marking(_node("False", "KubeletNotReady"), _marks("xid/79"), taint_on=True) == "xid/79"
    # no wish, or no taint (the brake decides first): nothing to ask
    assert newly_marking(_node(None), _marks("xid/79", unhealthy=False), taint_on=True) is None
    assert newly_marking(_node(None), _marks("xid/79"), taint_on=False) is None


def test_a_held_node_keeps_its_taint_but_its_condition_stays_healthy_and_says_why() -> None:
    m = _marks("xid/79").remediation[0]
    hold = Hold(HoldReason.WAVE, "xid/79", "40 GPU nodes fail on xid/79")
    status, reason, message = remediation_condition(
        m, taint_on=True, brake_open=False, disabled=False, prefix="gpu-healthcheck", hold=hold
    )
    assert (status, reason) == ("True", R.WAVE_HELD)
    assert message.startswith("not marked for remediation: 40 GPU nodes fail on xid/79")
    budget = Hold(HoldReason.BUDGET, "xid/79", "the repair budget is spent")
    assert remediation_condition(
        m, taint_on=True, brake_open=False, disabled=False, prefix="gpu-healthcheck", hold=budget
    )[:2] == ("True", R.BUDGET_HELD)
    # without a hold: the mark
    assert remediation_condition(
        m, taint_on=True, brake_open=False, disabled=False, prefix="gpu-healthcheck"
    )[:2] == ("False", R.FAILED)
    assert R.BUDGET_HELD in OUR_CONDITION_REASONS and R.WAVE_HELD in OUR_CONDITION_REASONS


def test_config_keys_defaults_and_validation() -> None:
    cfg = parse_config({})
    assert cfg.node.repair_budget == BudgetPolicy(10, 0.05, 3600.0, "")
    assert cfg.node.wave_hold == WavePolicy(5, 0.02, 900.0)
    cfg = parse_config(
        {"node": {"repairBudget": {"perLabel": "topology.kubernetes.io/zone", "windowMinutes": 0.5}}}
    )
    assert cfg.node.repair_budget.per_label == "topology.kubernetes.io/zone"
    assert cfg.node.repair_budget.window_s == 30.0
    with pytest.raises(ConfigError, match="perLabel"):
        parse_config({"node": {"repairBudget": {"perLabel": "not a label"}}})
    with pytest.raises(ConfigError, match="maxFraction"):
        parse_config({"node": {"repairBudget": {"maxFraction": 2}}})
    with pytest.raises(ConfigError, match="waveHold"):
        parse_config({"node": {"waveHold": {"minNodes": 5, "typo": 1}}})


def test_a_listed_lease_is_read_as_a_record() -> None:
    item = {
        "metadata": {
            "name": "gpu-healthcheck-mark-abc",
            "resourceVersion": "42",
            "creationTimestamp": "2026-11-26T08:00:00Z",
            "labels": {"gpu-healthcheck/record": "mark"},
            "annotations": {"gpu-healthcheck/node": "n1", "gpu-healthcheck/pool": "zone-a"},
        }
    }
    rec = record_of(item, "gpu-healthcheck")
    assert rec is not None and (rec.kind, rec.node, rec.pool, rec.rv) == (MARK, "n1", "zone-a", 42)
    assert rec.at == 1795680000.0
    assert record_of({"metadata": {"labels": {"gpu-healthcheck/record": "other"}}}, "gpu-healthcheck") is None


def test_brake_release_wants_a_reason_and_says_so_when_the_cluster_is_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.cli.main import main

    assert main(["brake", "release", "--key", "xid/79", "--reason", "  "]) == 64
    assert "--reason" in capsys.readouterr().err
    kubeconfig = f"{tmp_path}/none.yaml"
    with open(kubeconfig, "w") as fh:  # a cluster nobody listens on
        fh.write(
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "current-context: x\n"
        )
    assert main(["brake", "release", "--reason", "test", "--kubeconfig", kubeconfig]) == 69
    assert "cannot release" in capsys.readouterr().err
