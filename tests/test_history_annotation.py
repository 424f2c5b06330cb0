"""The Node's own history (`<prefix>/history`, core/history_annotation.py) and the repair history's
replace escalation (core/repair_escalation.py, node.repairHistory), issue 31 item 2.

Pure: what an entry records, when one is added, its bounds, what counts as a repair, the `status
--history` table. On the real API server (tests/kubeenv): the entries ride in the Node PATCH of
the change (the steady state writes nothing), are bounded to 20 and in bytes, survive a new agent
on the same Node; an engine on a snapshot with an Xid 79 that comes back after reboots (a new boot
id and a new agent each time) gets the replace escalation after 2 repairs within 7 days, not after
1, nor when the repairs are older.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.cli.main import main as cli
from agent.cli.status_history import HISTORY_HEADER, history_of, render_history
from agent.config import load_config_dir
from agent.core.active_checks import DiagRequest
from agent.core.findings import CheckResult, Finding, Verdict
from agent.core.history_annotation import (
    MAX_BYTES,
    MAX_ENTRIES,
    Entry,
    HistoryTaint,
    encode,
    parse,
    transition,
)
from agent.core.marks import Marks
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.core.remediation_types import RemediationMark, RemediationReason
from agent.core.repair_escalation import FAILED_AGAIN, RepairPolicy, escalate, repairs
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.write_policy import fingerprint
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import SnapshotSource
from agent.reporters.history_entry import History
from agent.reporters.node_writer import NodeWriter
from agent.reporters.taint_gate import TaintDecision
from tests.conftest import brake_cfg, node_cfg, shipped

ROOT = Path(__file__).parent.parent
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
K = Keys(DEFAULT_PREFIX)
DAY = 86400.0
KEY = "xid/79/0000:53:00.0"


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def marks(status: Status, key: str = "", boot: str = "boot-a-1234", **kw: Any) -> Marks:
    sev = Severity.REBOOT if status is Status.FAIL else Severity.NONE
    doc = {"version": 1, "status": status.value, "checks": [], "latched": [], "bootId": boot}
    return Marks(
        status=status,
        severity=sev,
        results_json=json.dumps(doc),
        taint=status is Status.FAIL,
        condition_message=f"{status.value}: {key or 'all checks passed'}",
        worst_key=key,
        boot_id=boot,
        **kw,
    )


# ------------------------------------------------------------------------------------------ pure


def test_an_entry_is_added_only_when_what_it_records_changes() -> None:
    first = transition(
        None, at="t1", status="fail", key=KEY, boot="boot-a-1234", taint=HistoryTaint.ON, mark=""
    )
    assert first == Entry("t1", "fail", KEY, "boot-a-1", HistoryTaint.ON, "", "taint", "agent")
    same = dict(status="fail", key=KEY, boot="boot-a-1234", taint=HistoryTaint.ON, mark="")
    assert transition(first, at="t2", **same) is None  # the steady state adds nothing
    cleared = transition(first, at="t2", **same, cleared_by="alice@example.com")
    assert cleared is not None and (cleared.did, cleared.by) == ("clear", "alice@example.com")
    reboot = transition(first, at="t3", status="pass", key="", boot="boot-b-5678", taint="", mark="")
    assert reboot is not None and (reboot.did, reboot.by) == ("reboot+untaint", "agent")
    held = transition(None, at="t4", status="fail", key=KEY, boot="b", taint=HistoryTaint.HELD, mark="")
    assert held is not None and (held.did, held.by) == ("brake-held", "brake")


def test_an_operators_diag_is_recorded_with_its_requester_when_it_starts() -> None:
    first = transition(None, at="t1", status="pass", key="", boot="boot-a-1234", taint="", mark="")
    same = dict(status="pass", key="", boot="boot-a-1234", taint="", mark="")
    diag = transition(first, at="t2", **same, diag_by="alice@example.com")
    assert diag is not None and (diag.did, diag.by) == ("diag", "alice@example.com") and diag.diagnosed
    unnamed = transition(first, at="t2", **same, diag_by="")
    assert unnamed is not None and unnamed.by == "unnamed (kubectl annotate)"
    both = transition(first, at="t2", **same, cleared_by="bob", diag_by="alice")
    assert both is not None and (both.did, both.by) == ("clear+diag", "bob")
    # The writer's side: the entry rides in the Node PATCH that removes the started request.
    request = DiagRequest("alice@example.com", "INC-7", "2026-11-28T10:00:00Z", 3)
    node: dict[str, Any] = {"metadata": {"annotations": {K.diag_requested: request.encode()}}}
    h = History(DEFAULT_PREFIX)
    waiting = h.annotation(node, marks(Status.PASS), TaintDecision())  # pending: nothing dropped
    [entry] = parse(waiting[K.history])
    assert entry.did == "" and not entry.diagnosed
    node["metadata"]["annotations"][K.history] = waiting[K.history]
    started = marks(Status.PASS, drop_annotations=(K.diag_requested,))
    ann = h.annotation(node, started, TaintDecision())
    [_, entry] = parse(ann[K.history])
    assert (entry.status, entry.did, entry.by) == ("pass", "diag", "alice@example.com")
    node["metadata"]["annotations"] = {K.history: ann[K.history]}  # the request removed
    assert h.annotation(node, marks(Status.PASS), TaintDecision()) == {}  # steady: nothing added


def test_the_annotation_keeps_the_last_20_under_its_byte_bound() -> None:
    long = "x" * 500
    big = dict(status="fail", key=long, boot=long, taint=HistoryTaint.ON, mark="on", cleared_by=long)
    entries = [transition(None, at=stamp(i), **big) for i in range(25)]
    text = encode([e for e in entries if e is not None])
    kept = parse(text)
    assert len(kept) == MAX_ENTRIES and kept[0].at == stamp(5) and kept[-1].at == stamp(24)
    assert len(text.encode()) <= MAX_BYTES == 8000
    assert parse("not json") == [] and parse('[{"status": 1}]') == []


def fail_entry(t: float, boot: str, *, marked: bool = True, did: str = "") -> Entry:
    return Entry(stamp(t), "fail", KEY, boot, HistoryTaint.ON if marked else "", "", did, "agent")


NOW = 1_800_000_000.0


def test_what_counts_as_a_repair() -> None:
    rebooted = Entry(stamp(NOW - 2 * DAY), "pass", "", "b", "", "", "reboot", "-")
    hist = [fail_entry(NOW - 3 * DAY, "a"), rebooted, fail_entry(NOW - DAY, "b", did="reboot")]

    def count(entries: list[Entry], boot: str, cleared: bool = False) -> int:
        return repairs(entries, KEY, boot=boot, now_s=NOW, window_s=7 * DAY, cleared_now=cleared)

    assert count(hist, "b") == 1  # the reboot to b, then failing again on the same key
    assert count(hist, "c") == 2  # ... and failing now on boot c
    assert count(hist, "b", cleared=True) == 2  # an operator's clear now is a repair too
    assert count(hist[:1], "a") == 0  # an agent restart (same boot, no clear) is no repair
    unmarked = [fail_entry(NOW - 3 * DAY, "a", marked=False)]
    assert count(unmarked, "c") == 0  # a fail nobody was told to repair: its reboot is no repair
    other = [Entry(stamp(NOW - 3 * DAY), "fail", "xid/48/x", "a", HistoryTaint.ON, "", "taint", "agent")]
    assert count(other, "c") == 0  # another key
    old = [fail_entry(NOW - 10 * DAY, "a"), fail_entry(NOW - 9 * DAY, "b", did="reboot")]
    assert count(old, "c") == 1  # the repair to b is older than 7 days; the one to c is now


def test_the_escalation_changes_only_the_recommendation_and_message() -> None:
    f = Finding("xid", "xid.79", Severity.REBOOT, "GPU 3: Xid 79", key=KEY, latched=True)
    results = [CheckResult("xid", (f,)), CheckResult("gpu.ecc")]
    hist = encode([fail_entry(NOW - 3 * DAY, "a"), fail_entry(NOW - DAY, "b", did="reboot")])
    policy = RepairPolicy(2, 7 * DAY)
    out = escalate(results, hist, policy, boot="c", now_s=NOW)
    got = out[0].findings[0]
    assert got.recommendation.action.value == "service" and got.severity is Severity.REBOOT
    assert got.message == f"GPU 3: Xid 79 ({FAILED_AGAIN}: 2 repair(s) within 7 d)"
    assert out[1] is results[1]
    assert escalate(results, hist, policy, boot="b", now_s=NOW)[0] is results[0]  # 1 repair
    assert escalate(results, hist, RepairPolicy(0, 7 * DAY), boot="c", now_s=NOW)[0] is results[0]  # off
    assert escalate(results, hist, policy, boot="c", now_s=NOW + 6.5 * DAY)[0] is results[0]  # aged out


def test_a_held_mark_is_recorded_as_held_and_corrected_when_unforeseen() -> None:
    mark = RemediationMark("AcceleratedHardwareReady", "False", True, RemediationReason.FAILED, "m", KEY)
    m = marks(Status.FAIL, KEY, remediation=(mark,))
    h = History(DEFAULT_PREFIX)
    node: dict[str, Any] = {"metadata": {"annotations": {}}, "status": {"conditions": []}}
    ann = h.annotation(node, m, TaintDecision(taint_on=True))
    [entry] = parse(ann[K.history])
    assert (entry.taint, entry.mark, entry.did) == ("on", "on", "taint+mark")
    # The repair budget held it: the status PATCH left it healthy, with the budget's reason.
    held = {"type": mark.type, "status": "True", "reason": RemediationReason.BUDGET_HELD}
    node = {"metadata": {"annotations": ann}, "status": {"conditions": [held]}}
    patch = h.settle(node, m)
    assert patch is not None
    [fixed] = parse(patch["metadata"]["annotations"][K.history])  # corrected in place
    assert (fixed.mark, fixed.did, fixed.by) == ("budget", "taint+budget-held", "repair budget")
    node["metadata"]["annotations"] = patch["metadata"]["annotations"]
    assert h.annotation(node, m, TaintDecision(taint_on=True)) == {}  # held, as the entry says
    assert h.settle(node, m) is None


def test_the_history_table() -> None:
    at = "2026-11-20T10:00:00Z"
    entries = [
        Entry(at, "fail", KEY, "a", HistoryTaint.ON, "on", "taint+mark", "agent"),
        Entry(at, "fail", KEY, "a", HistoryTaint.ON, "on", "clear", "alice@example.com"),
    ]
    node = {"metadata": {"name": "n1", "annotations": {K.history: encode(entries)}}}
    assert history_of(node) == entries
    out = render_history(node, now=datetime(2026, 11, 26, 10, 0, tzinfo=timezone.utc))
    lines = out.splitlines()
    assert lines[0].split() == list(HISTORY_HEADER)
    assert lines[1].split() == [at, "(6d", "ago)", "fail", KEY, "taint,", "mark", "agent"]
    assert lines[2].split()[-2:] == ["clear", "alice@example.com"]
    assert lines[-1] == "n1: the last 2 of at most 20 transitions, oldest first"
    assert json.loads(render_history(node, fmt="json"))[1]["by"] == "alice@example.com"
    assert "no history yet" in render_history({"metadata": {"name": "n2"}})


def test_history_needs_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["status", "--history"]) == 64
    assert "name the node" in capsys.readouterr().err


# ------------------------------------------------------------------------------- real API server


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


class Writes:
    def __init__(self) -> None:
        self.c: Counter[str] = Counter()

    def __call__(self, kind: str, outcome: str) -> None:
        if outcome == "ok":
            self.c[kind] += 1


def annotations(core: k8s.CoreV1Api, name: str) -> dict[str, str]:
    return dict(core.read_node(name).metadata.annotations or {})


@pytest.mark.kube
def test_transitions_ride_in_the_change_and_are_bounded(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str
) -> None:
    gpu_node()
    writes = Writes()
    w = NodeWriter(core, kube_node_name, on_write=writes, cfg=shipped())
    for i in range(25):
        m = marks(Status.FAIL, f"xid/79/gpu{i}") if i % 2 == 0 else marks(Status.PASS)
        before = Counter(writes.c)
        res = w.apply(m)
        assert res.ok and res.node_writes == 1  # the entry went in the Node PATCH of the change
        delta = writes.c - before
        assert (delta["node"], delta["status"]) == (1, 1)  # and the taint's Event
        for _ in range(3):  # steady state: nothing added, nothing written
            assert not w.apply(m).wrote
    ann = annotations(core, kube_node_name)
    kept = parse(ann[K.history])
    assert len(kept) == MAX_ENTRIES
    assert [e.status for e in kept[-2:]] == ["pass", "fail"] and kept[-1].key == "xid/79/gpu24"
    assert (kept[-1].did, kept[-2].did) == ("taint", "untaint")
    assert len(ann[K.history].encode()) <= MAX_BYTES
    assert json.loads(ann[K.results]) == json.loads(marks(Status.FAIL, "xid/79/gpu24").results_json)


@pytest.mark.kube
def test_a_new_agent_on_the_node_keeps_the_history(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str
) -> None:
    gpu_node()
    first = NodeWriter(core, kube_node_name, cfg=shipped())
    assert first.apply(marks(Status.FAIL, KEY)).ok
    written = annotations(core, kube_node_name)[K.history]
    again = NodeWriter(core, kube_node_name, cfg=shipped())  # a restarted agent: nothing kept in memory
    assert not again.apply(marks(Status.FAIL, KEY)).wrote
    assert annotations(core, kube_node_name)[K.history] == written
    assert again.apply(marks(Status.PASS)).ok
    kept = parse(annotations(core, kube_node_name)[K.history])
    assert [(e.status, e.did) for e in kept] == [("fail", "taint"), ("pass", "untaint")]


def config_dir(tmp_path: Path) -> Path:
    """The shipped config with node.escalateAfterReboots off: the per-GPU reboot history
    (engine/reboot_escalation.py) would escalate the same Xid after 2 reboots on its own."""
    out = tmp_path / "config"
    shutil.copytree(ROOT / "config", out)
    text = (out / "config.yaml").read_text()
    (out / "config.yaml").write_text(text.replace("escalateAfterReboots: 2 ", "escalateAfterReboots: 0 "))
    assert load_config_dir(out).node.escalate_after_reboots == 0
    return out


def boot_engine(snap: Path, boot: str, writer: NodeWriter) -> Engine:
    """A new agent after a reboot: a new boot id, a fresh engine restored from the Node."""
    (snap / "boot_id").write_text(boot + "\n")
    eng = Engine(
        SnapshotSource(snap),
        load_config_dir(snap.parent / "config"),
        node_getter=lambda: node_from_dict(writer.watch.current(fresh=True)),
    )
    eng.restore(writer.read_results())
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    return eng


def worst_step(verdict: Verdict, marks_: Marks) -> tuple[str, str]:
    """The worst finding's next step and message (here the lost GPU of the Xid 79, which the
    history records), as the results annotation and the condition carry them."""
    worst = verdict.worst
    assert worst is not None
    doc = json.loads(marks_.results_json)
    check = next(c for c in doc["checks"] if c["name"] == worst.check)
    assert check["action"] == worst.recommendation.action.value and worst.message in marks_.condition_message
    return check["action"], worst.message


@pytest.mark.kube
def test_failing_again_after_two_repairs_within_7_days_escalates_to_replace(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, tmp_path: Path
) -> None:
    gpu_node()
    snap = tmp_path / "snap"
    shutil.copytree(XID79, snap, symlinks=True)
    config_dir(tmp_path)
    writer = NodeWriter(core, kube_node_name, cfg=shipped())
    steps = []
    for boot in ("0a0a0a0a-boot-1", "1b1b1b1b-boot-2", "2c2c2c2c-boot-3"):
        verdict, m = boot_engine(snap, boot, writer).evaluate()
        assert verdict.status is Status.FAIL and m.taint
        steps.append(worst_step(verdict, m))
        assert writer.apply(m).ok
    assert steps[0][0] == steps[1][0] == "reboot"  # the first failure, and after 1 repair
    assert FAILED_AGAIN not in steps[1][1]
    assert steps[2][0] == "service" and f"{FAILED_AGAIN}: 2 repair(s) within 7 d" in steps[2][1]
    kept = parse(annotations(core, kube_node_name)[K.history])
    assert [(e.status, e.boot, e.did) for e in kept] == [
        ("fail", "0a0a0a0a", "taint"),
        ("fail", "1b1b1b1b", "reboot"),  # by "-": who rebooted is not known
        ("fail", "2c2c2c2c", "reboot"),
    ]
    assert len({e.key for e in kept}) == 1 and kept[0].key == "gpu.responsive.lost/00000000:97:00.0"
    # The next cycle: the escalation holds, the agent's write gate sees no change (fingerprint:
    # timestamps aside), and the history adds nothing.
    verdict, again = boot_engine(snap, "2c2c2c2c-boot-3", writer).evaluate()
    assert worst_step(verdict, again)[0] == "service" and fingerprint(again) == fingerprint(m)
    assert writer.apply(again).ok and parse(annotations(core, kube_node_name)[K.history]) == kept


@pytest.mark.kube
def test_repairs_older_than_the_window_do_not_escalate(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, tmp_path: Path
) -> None:
    gpu_node()
    snap = tmp_path / "snap"
    shutil.copytree(XID79, snap, symlinks=True)
    config_dir(tmp_path)
    writer = NodeWriter(core, kube_node_name, cfg=shipped())
    verdict, m = boot_engine(snap, "0a0a0a0a-boot-1", writer).evaluate()
    assert writer.apply(m).ok
    [first] = parse(annotations(core, kube_node_name)[K.history])
    # Backdate that failure and add a repair 8.5 days ago, as an agent then would have written them.
    now = time.time()
    old = [
        Entry(stamp(now - 9 * DAY), "fail", first.key, "0a0a0a0a", HistoryTaint.ON, "", "taint", "agent"),
        Entry(stamp(now - 8.5 * DAY), "fail", first.key, "1b1b1b1b", HistoryTaint.ON, "", "reboot", "agent"),
    ]
    core.patch_node(kube_node_name, {"metadata": {"annotations": {K.history: encode(old)}}})
    verdict, m = boot_engine(snap, "2c2c2c2c-boot-3", writer).evaluate()
    action, message = worst_step(verdict, m)
    assert action == "reboot" and FAILED_AGAIN not in message  # 1 repair within 7 days: now's
    stamps = [datetime.fromisoformat(e.at.replace("Z", "+00:00")) for e in old]
    assert all(datetime.now(timezone.utc) - s > timedelta(days=7) for s in stamps)


@pytest.mark.kube
def test_status_history_prints_the_nodes_table(
    kube: Any, core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu_node()
    w = NodeWriter(core, kube_node_name, cfg=shipped())
    for m in (marks(Status.FAIL, KEY), marks(Status.PASS, boot="boot-b-5678")):
        assert w.apply(m).ok
    assert cli(["status", kube_node_name, "--history", "--kubeconfig", str(kube.kubeconfig)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == list(HISTORY_HEADER)
    assert lines[1].split()[3:] == ["fail", KEY, "taint", "agent"]
    assert lines[2].split()[3:] == ["pass", "-", "reboot,", "untaint", "agent"]
    gpu_node()  # another GPU node, left out
    kcfg = ["--kubeconfig", str(kube.kubeconfig), "--selector", "nvidia.com/gpu.present=true"]
    cli(["status", kube_node_name, "-o", "json", *kcfg])  # NODE alone: that node's row only
    assert [s["node"] for s in json.loads(capsys.readouterr().out)] == [kube_node_name]


@pytest.mark.kube
def test_a_clear_is_recorded_with_its_requester(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str
) -> None:
    gpu_node()
    w = NodeWriter(core, kube_node_name, cfg=shipped())
    assert w.apply(marks(Status.FAIL, KEY)).ok
    request = '{"by":"alice@example.com","reason":"GPU 3 reseated","at":"2026-11-26T10:00:00Z"}'
    core.patch_node(
        kube_node_name, {"metadata": {"annotations": {K.clear_latched: "all", K.clear_latched_by: request}}}
    )
    consumed = marks(Status.FAIL, KEY, drop_annotations=(K.clear_latched, K.clear_latched_by))
    res = w.apply(consumed)
    assert res.ok and res.node_writes == 1  # with the removal of the request
    ann = annotations(core, kube_node_name)
    assert K.clear_latched not in ann
    assert [(e.did, e.by) for e in parse(ann[K.history])] == [
        ("taint", "agent"),
        ("clear", "alice@example.com"),
    ]


@pytest.mark.kube
def test_a_repair_budget_hold_is_recorded_and_its_end_too(
    core: k8s.CoreV1Api, gpu_node: Any, kube_namespace: str
) -> None:
    """Budget 1: the second node's mark is held (its entry corrected in place, once); raised to 2,
    the held node is marked in a status PATCH alone, and its history says so."""
    from agent.core.repair_budget import BudgetPolicy
    from tests.test_repair_budget_kube import NO_WAVE, Fleet
    from tests.test_repair_budget_kube import marks as budget_marks

    fleet = Fleet(core, gpu_node, kube_namespace, 2, BudgetPolicy(1, 1.0, 3600), NO_WAVE)
    a, b = fleet.names
    for n in fleet.names:
        assert fleet.writers[n].apply(budget_marks()).ok
    assert [(e.mark, e.did) for e in parse(annotations(core, a)[K.history])] == [("on", "taint+mark")]
    [held] = parse(annotations(core, b)[K.history])
    assert (held.taint, held.mark, held.did, held.by) == (
        "on",
        "budget",
        "taint+budget-held",
        "repair budget",
    )
    assert not fleet.writers[b].apply(budget_marks()).wrote  # still held: the entry says so already
    repair = fleet.writers[b].repair
    assert repair is not None
    repair.apply_config(repair.cfg, node_cfg(BudgetPolicy(2, 1.0, 3600), NO_WAVE))
    assert fleet.writers[b].apply(budget_marks()).ok
    kept = parse(annotations(core, b)[K.history])
    assert [(e.mark, e.did, e.by) for e in kept] == [
        ("budget", "taint+budget-held", "repair budget"),
        ("on", "mark", "agent"),
    ]


@pytest.mark.kube
def test_the_agent_process_writes_it_and_a_restarted_one_keeps_it(
    kube: Any, gpu_node: Any, tmp_path: Path
) -> None:
    """The real agent: pass, then an Xid 79 appended to the kernel log (fail, taint); SIGTERM and a
    new agent process on the same boot: the history is read back from the Node, nothing is added,
    and the same failure keeps its entries."""
    from tests.test_agent_kube import XID_LINE, AgentProcess, start_agent, wait_for

    world = start_agent(kube, gpu_node, tmp_path, "intervals:\n  gpu: 2\n")
    name = world["node"]
    with kube.api_client() as api:
        v1 = k8s.CoreV1Api(api)

        def history() -> list[Entry]:
            return parse(annotations(v1, name).get(K.history))

        try:
            wait_for(lambda: [e.status for e in history()] == ["pass"], what="the first entry")
            with (world["snap"] / "kmsg.log").open("a") as fh:
                fh.write(XID_LINE)
            wait_for(lambda: len(history()) == 2, what="the failure's entry")
            before = history()
            assert (before[1].status, before[1].did, before[1].key.startswith("xid/79/")) == (
                "fail",
                "taint",
                True,
            )
            world["agent"].stop()
            again = AgentProcess(kube, name, world["snap"], world["cfg"], tmp_path / "again.log")
            try:
                wait_for(
                    lambda: (tmp_path / "again.log").read_text().count("tier gpu:") >= 3,
                    what="three gpu cycles of the new agent",
                )
                assert history() == before
                assert "fail" in annotations(v1, name)[K.results]
            finally:
                again.stop()
        finally:
            world["agent"].stop()


@pytest.mark.kube
def test_the_brake_holding_is_recorded_once(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, kube_namespace: str
) -> None:
    """Two nodes of a pool, the brake at 1 tainted node: the second is held, its entry says so (by
    the brake), the held steady state adds nothing, and the taint granted later is a new entry."""
    from agent.reporters.brake import Brake

    pool = f"test.example/pool={kube_node_name[:40]}"
    a = gpu_node(labels={"test.example/pool": kube_node_name[:40]}).metadata.name
    b = gpu_node(labels={"test.example/pool": kube_node_name[:40]}).metadata.name

    def writer(name: str) -> NodeWriter:
        brake = Brake(
            core,
            scope=f"nvidia.com/gpu.present=true,{pool}",
            node_name=name,
            cache_seconds=0,
            namespace=kube_namespace,
            cfg=brake_cfg(max_nodes=1),
        )
        return NodeWriter(core, name, brake=brake, cfg=shipped())

    wa, wb = writer(a), writer(b)
    assert wa.apply(marks(Status.FAIL, KEY)).tainted
    res = wb.apply(marks(Status.FAIL, KEY))
    assert res.ok and res.brake_open and not res.tainted
    [held] = parse(annotations(core, b)[K.history])
    assert (held.status, held.taint, held.did, held.by) == ("fail", "held", "brake-held", "brake")
    assert not wb.apply(marks(Status.FAIL, KEY)).wrote  # still held: nothing added, nothing written
    assert wa.apply(marks(Status.PASS)).ok  # a recovers: its taint comes off, a slot frees
    assert wb.apply(marks(Status.FAIL, KEY)).tainted
    assert [(e.taint, e.did) for e in parse(annotations(core, b)[K.history])] == [
        ("held", "brake-held"),
        ("on", "taint"),
    ]


def test_node_repair_history_is_validated_and_live(tmp_path: Path) -> None:
    """node.repairHistory on a reload: the engine judges the next evaluation by the new count (the
    Node's history here: one marked failure on the lost GPU in an earlier boot)."""
    from agent.config.schema import ConfigError
    from agent.core.node import NodeObject

    snap = tmp_path / "snap"
    shutil.copytree(XID79, snap, symlinks=True)
    (snap / "boot_id").write_text("1b1b1b1b-boot-2\n")
    key = "gpu.responsive.lost/00000000:97:00.0"
    hist = encode(
        [Entry(stamp(time.time() - DAY), "fail", key, "0a0a0a0a", HistoryTaint.ON, "", "taint", "agent")]
    )
    node = NodeObject("n1", {}, 8, 8, annotations={K.history: hist})
    cfg_dir = config_dir(tmp_path)
    eng = Engine(SnapshotSource(snap), load_config_dir(cfg_dir), node_getter=lambda: node)
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    verdict, m = eng.evaluate()
    assert worst_step(verdict, m)[0] == "reboot"  # 1 repair, count 2
    text = (cfg_dir / "config.yaml").read_text()
    (cfg_dir / "config.yaml").write_text(text.replace("    count: 2 ", "    count: 1 "))
    eng.cfg = load_config_dir(cfg_dir)  # what the agent's reload does
    verdict, m = eng.evaluate()
    action, message = worst_step(verdict, m)
    assert action == "service" and f"{FAILED_AGAIN}: 1 repair(s) within 7 d" in message
    (cfg_dir / "config.yaml").write_text(text.replace("    count: 2 ", "    count: 9 "))
    with pytest.raises(ConfigError, match=r"node.repairHistory.count: 9 is above the maximum 5"):
        load_config_dir(cfg_dir)
