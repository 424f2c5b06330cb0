"""A clear sticks (issue 44 item 3, production review 3 U3): what an operator's clear covered of this
boot's kernel log is kept on the Node (the results annotation's clearCover, core/clear_cover.py), so
that an agent restarted in the same boot, which reads the log from its start, does not fail the node
again on the cleared lines; a new line does, and a clear of an earlier boot covers nothing.

Pure: the rule, its codec, where the kernel tail says each line stands, the adoption of an older
agent's `lastClear`, the history's `clear-kept` entry. On a snapshot: the engine cleared, then a new
engine restored from the first one's results annotation (what a restart, an upgrade or a rollback to
a version with this fix does), the Xid line still in kmsg.log; the validating taint after a clear. On
the real API server: tests/test_clear_sticks_kube.py, tests/test_clear_upgrade_kube.py."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from agent.config import Config, load_config_dir, parse_config
from agent.core import clear_cover
from agent.core.clear_cover import CLEAR_COVER_FIELD, ClearCover, covers, extend
from agent.core.findings import Finding
from agent.core.history_annotation import transition
from agent.core.kernel import LinePos
from agent.core.node import NodeObject
from agent.core.node_keys import EventReason, Keys
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.scheduler import TIER_INPUTS
from agent.probes.kernel_tail import KernelTail
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
K = Keys()
XID = "xid/79/0000:97:00.0"
OTHER = "xid/79/0000:53:00.0"
STAMP = "2025-01-21T03:12:44,118231+00:00"
LATER = "2025-01-21T04:00:01,000001+00:00"


def xid_line(pci: str = "97", stamp: str = STAMP) -> str:
    return (
        f"kern  :err   : {stamp} NVRM: Xid (PCI:0000:{pci}:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n"
    )


SEQ_10 = LinePos("seq", 10)


def finding(key: str = XID, last: LinePos | None = SEQ_10) -> Finding:
    return Finding("xid", "xid.79", Severity.REBOOT, "Xid 79", key=key, latched=True, last_line=last)


# ------------------------------------------------------------------------------------------- the rule


def test_a_clear_covers_its_keys_lines_up_to_the_newest_it_saw_in_its_own_boot() -> None:
    cover = extend(None, "boot-1", [finding(last=LinePos("seq", 10))])
    assert cover == ClearCover("boot-1", {XID: LinePos("seq", 10)})
    assert covers(cover, "boot-1", finding(last=LinePos("seq", 10)))  # the same line, read again
    assert covers(cover, "boot-1", finding(last=LinePos("seq", 7)))  # older (the ring lost some)
    assert not covers(cover, "boot-1", finding(last=LinePos("seq", 11)))  # a new line: new evidence
    assert not covers(cover, "boot-1", finding(OTHER, LinePos("seq", 3)))  # a key it did not clear
    assert not covers(cover, "boot-2", finding(last=LinePos("seq", 1)))  # another boot: nothing
    assert not covers(cover, None, finding())  # boot unknown: cannot tell, so it fails
    assert not covers(cover, "boot-1", finding(last=LinePos("line", 1)))  # read another way: fails
    assert not covers(cover, "boot-1", finding(last=None))  # no kernel-log evidence


def test_clears_of_one_boot_add_up_and_a_new_boot_starts_afresh() -> None:
    first = extend(None, "boot-1", [finding(last=LinePos("seq", 10))])
    both = extend(first, "boot-1", [finding(OTHER, LinePos("seq", 20)), finding(last=LinePos("seq", 15))])
    assert both is not None and dict(both.lines) == {OTHER: LinePos("seq", 20), XID: LinePos("seq", 15)}
    fresh = extend(both, "boot-2", [finding(OTHER, LinePos("seq", 2))])
    assert fresh == ClearCover("boot-2", {OTHER: LinePos("seq", 2)})
    assert extend(both, None, [finding()]) is None  # without a boot id nothing is kept
    assert extend(None, "boot-1", [finding(last=None)]) is None  # nothing of the kernel log cleared
    assert clear_cover.for_boot(both, "boot-2") is None and clear_cover.for_boot(both, "boot-1") == both
    many = extend(None, "b", [finding(f"xid/{i}/x", LinePos("seq", i)) for i in range(100)])
    assert many is not None and len(many.lines) == clear_cover.MAX_KEYS and "xid/99/x" in many.lines


def test_the_cover_round_trips_and_a_damaged_field_covers_nothing() -> None:
    cover = ClearCover("boot-1", {XID: LinePos("seq", 10), OTHER: LinePos("line", 4)})
    doc = clear_cover.to_doc(cover)
    lines = {XID: {"kind": "seq", "n": 10}, OTHER: {"kind": "line", "n": 4}}
    assert doc == {"bootId": "boot-1", "lines": lines}
    assert clear_cover.parse(json.loads(json.dumps(doc))) == cover
    for bad in (None, "x", {}, {"bootId": ""}, {"bootId": "b", "lines": {XID: {"kind": "time", "n": 1}}}):
        assert clear_cover.parse(bad) is None
    assert clear_cover.parse({"bootId": "b", "lines": {XID: {"kind": "seq", "n": True}}}) is None


# ------------------------------------------------------------------------- where a line stands


def test_each_xid_line_stands_at_its_kmsg_sequence_number_even_a_repeated_text(tmp_path: Path) -> None:
    """The tail parses a text seen before only once (its memo keeps the first line's sequence number):
    the position comes from each record, so a repeated identical Xid line is a newer line."""
    line = "NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    log = tmp_path / "kmsg"
    log.write_text(f"6,100,5000000,-;some driver line\n3,101,5000100,-;{line}\n")
    tail = KernelTail(str(log), device=False)
    tail.poll()
    (tally,) = tail.view().tallies
    assert tally.last == LinePos("seq", 101, "mono", 5.0001)  # and its stamp, seconds since boot
    with log.open("a") as fh:
        fh.write(f"6,102,6000000,-;other\n3,103,6000100,-;{line}\n")
    tail.poll()
    (tally,) = tail.view().tallies
    assert tally.count == 2 and tally.last == LinePos("seq", 103, "mono", 6.0001)


def test_without_sequence_numbers_a_line_stands_at_its_ordinal_in_the_boot(tmp_path: Path) -> None:
    log = tmp_path / "dmesg"
    log.write_text("kern  :info  : 2025-01-21T03:12:40,000001+00:00 hello\n" + xid_line())
    tail = KernelTail(str(log), device=False)
    tail.poll()
    stamp = datetime(2025, 1, 21, 3, 12, 44).timestamp()  # its second, as the ledger reads stamps
    assert [t.last for t in tail.view().tallies] == [LinePos("line", 2, "wall", stamp)]
    again = KernelTail(str(log), device=False)  # a restart reads it from its start: the same place
    again.poll()
    assert again.view().tallies == tail.view().tallies


# ------------------------------------------------------------------------------- engine, restart


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    return dest


class Agent:
    """An engine on the snapshot and a Node whose annotations it reads (the clear request)."""

    def __init__(self, snap: Path, saved: dict[str, Any] | None = None, cfg: Config | None = None) -> None:
        self.annotations: dict[str, str] = {}
        self.engine = Engine(
            SnapshotSource(snap),
            cfg or load_config_dir(ROOT / "config"),
            node_getter=lambda: NodeObject("n1", {}, 8, 8, annotations=dict(self.annotations)),
        )
        self.engine.restore(saved)  # what the agent's loop does first, from the Node's annotation
        self.cycle()

    def cycle(self, *tiers: str) -> tuple[Status, Any]:
        for tier in tiers or TIER_INPUTS:
            self.engine.run_tier(tier)
        verdict, marks = self.engine.evaluate()
        self.saved = json.loads(marks.results_json)
        self.marks = marks
        return verdict.status, marks

    def clear(self) -> None:
        self.annotations[K.clear_latched] = "all"
        self.cycle("xid")
        self.annotations.clear()  # consumed by that write


def append(snap: Path, *lines: str) -> None:
    with (snap / "kmsg.log").open("a") as fh:
        fh.writelines(lines)


def test_a_cleared_xid_stays_cleared_after_a_restart_and_a_new_xid_fails(snap: Path) -> None:
    append(snap, xid_line())
    agent = Agent(snap)
    assert agent.marks.status is Status.FAIL and XID in agent.engine.latches
    agent.clear()
    assert agent.marks.status is Status.PASS and not agent.marks.taint
    cover = agent.saved[CLEAR_COVER_FIELD]  # the boot, and the last record of the log (its ordinal)
    assert cover["bootId"] == (snap / "boot_id").read_text().strip()
    assert cover["lines"] == {XID: {"kind": "line", "n": agent.engine.source.kernel_tail.records}}

    # A restart in the same boot (same code, an upgrade or a rollback alike): the log is read from
    # its start, the cleared line is still in it, and the node stays pass.
    restarted = Agent(snap, agent.saved)
    status, marks = restarted.cycle()
    assert status is Status.PASS and not marks.taint and restarted.engine.latches == {}
    assert EventReason.LATCHED_FINDING not in [e.reason for e in marks.events]
    assert restarted.saved[CLEAR_COVER_FIELD] == agent.saved[CLEAR_COVER_FIELD]  # kept for the next one
    again = Agent(snap, restarted.saved)  # and a second restart
    assert again.marks.status is Status.PASS

    # A new Xid on another GPU after the clear fails the node; the cleared one stays hidden.
    append(snap, xid_line("53", LATER))
    status, marks = again.cycle("xid")
    assert status is Status.FAIL and marks.taint and list(again.engine.latches) == [OTHER]
    assert [e.reason for e in marks.events].count(EventReason.LATCHED_FINDING) == 1


def test_a_new_line_of_the_cleared_key_fails_after_a_restart(snap: Path) -> None:
    append(snap, xid_line())
    agent = Agent(snap)
    agent.clear()
    append(snap, xid_line(stamp=LATER))  # the same GPU and code, a new line: new evidence
    restarted = Agent(snap, agent.saved)
    assert restarted.marks.status is Status.FAIL and list(restarted.engine.latches) == [XID]
    assert "×2" in restarted.engine.latches[XID].message


def test_a_clear_of_an_earlier_boot_hides_nothing_of_a_new_boot(snap: Path) -> None:
    append(snap, xid_line())
    agent = Agent(snap)
    agent.clear()
    assert agent.marks.status is Status.PASS
    # A reboot: a new boot id, and the new boot's log has an Xid at the same place (same ordinal).
    (snap / "boot_id").write_text("another-boot\n")
    rebooted = Agent(snap, agent.saved)
    assert rebooted.marks.status is Status.FAIL and list(rebooted.engine.latches) == [XID]
    assert CLEAR_COVER_FIELD not in rebooted.saved  # the old boot's cover is not carried on


def test_a_reboot_seen_while_running_drops_the_cover(snap: Path) -> None:
    append(snap, xid_line())
    agent = Agent(snap)
    agent.clear()
    (snap / "boot_id").write_text("another-boot\n")
    status, _ = agent.cycle("gpu", "xid")  # the gpu tier reads the new boot id
    assert status is Status.FAIL and agent.engine.state.cover is None


# ---------------------------------------------------------- a clear an older agent acted on


def at_iso(stamp: str, minutes: float) -> str:
    """RFC 3339 UTC of a kernel-log stamp's second (as the ledger reads it) plus some minutes."""
    t = datetime.fromisoformat(stamp[:19]).timestamp() + minutes * 60
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def test_an_older_agents_clear_covers_the_lines_stamped_before_it() -> None:
    wall, mono = LinePos("line", 5, "wall", 1000.0), LinePos("seq", 9, "mono", 100.0)
    last_clear = {"at": datetime.fromtimestamp(1060, tz=timezone.utc).isoformat(), "latches": [XID, OTHER]}
    got = clear_cover.adopt(last_clear, "b", [finding(last=wall), finding(OTHER, mono)], boot_wall=900.0)
    assert got == ClearCover("b", {XID: wall, OTHER: mono})  # 1000 and 900 + 100 are before 1060
    assert clear_cover.adopt(last_clear, "b", [finding(last=wall)], 5000.0) == ClearCover("b", {XID: wall})
    assert clear_cover.adopt(last_clear, "b", [finding(OTHER, mono)], boot_wall=961.0) is None  # after
    unstamped = finding(last=LinePos("line", 5))  # no stamp: cannot tell, so it fails
    assert clear_cover.adopt(last_clear, "b", [unstamped], boot_wall=0.0) is None
    assert clear_cover.adopt({**last_clear, "latches": [OTHER]}, "b", [finding(last=wall)], 0.0) is None
    for bad in (None, {"at": "yesterday", "latches": [XID]}, {"latches": [XID]}):
        assert clear_cover.adopt(bad, "b", [finding(last=wall)], 0.0) is None
    assert clear_cover.adopt(last_clear, None, [finding(last=wall)], 0.0) is None


def older_agents(saved: dict[str, Any], at: str) -> dict[str, Any]:
    """The results annotation as an agent without clearCover left it after the same clear."""
    doc = {k: v for k, v in saved.items() if k != CLEAR_COVER_FIELD}
    return {**doc, "lastClear": {**doc["lastClear"], "at": at}}


def test_an_upgrade_keeps_a_clear_an_older_agent_made_and_a_line_after_it_fails(snap: Path) -> None:
    append(snap, xid_line())
    agent = Agent(snap)
    agent.clear()
    old = older_agents(agent.saved, at_iso(STAMP, 20))  # cleared 20 min after the Xid
    upgraded = Agent(snap, old)
    assert upgraded.marks.status is Status.PASS and upgraded.engine.latches == {}
    assert list(upgraded.saved[CLEAR_COVER_FIELD]["lines"]) == [XID]  # from now on, as its own
    assert Agent(snap, upgraded.saved).marks.status is Status.PASS  # and the next restart keeps it

    append(snap, xid_line(stamp=LATER))  # a line after the clear
    assert Agent(snap, old).marks.status is Status.FAIL
    before = older_agents(agent.saved, at_iso(STAMP, -1))  # a clear stamped before the line: none
    assert Agent(snap, before).marks.status is Status.FAIL
    other_boot = {**old, "bootId": "an-earlier-boot"}  # its lastClear is not of this boot
    assert Agent(snap, other_boot).marks.status is Status.FAIL


# ------------------------------------------------------------------------------------- history


def test_the_history_says_when_a_restart_met_cleared_lines(snap: Path) -> None:
    """One `clear-kept` entry (by the agent) for the restart's first verdict, none after; the
    steady state adds nothing (core/history_annotation.py transition)."""
    same = dict(status="pass", key="", boot="boot-a-1234", taint="", mark="")
    first = transition(None, at="t1", **same)
    kept = transition(first, at="t2", **same, clear_kept=True)
    assert kept is not None and (kept.status, kept.did, kept.by) == ("pass", "clear-kept", "agent")
    assert transition(kept, at="t3", **same) is None

    append(snap, xid_line())
    agent = Agent(snap)
    agent.clear()
    assert agent.marks.clear_kept == ()  # this process cleared it: nothing to say
    restarted = Agent(snap, agent.saved)
    assert restarted.marks.clear_kept == (XID,)
    assert restarted.cycle()[1].clear_kept == ()  # said once per process


def test_a_cleared_xid_still_in_the_log_does_not_hold_the_validating_taint(snap: Path) -> None:
    """node.validate.addTaint: a clear puts the validating taint on until every tier passes; the xid
    tier passes without the lines the clear covered (it never did while they stayed in the log)."""
    shipped = load_config_dir(ROOT / "config")
    raw = json.loads(json.dumps(shipped.raw))
    raw["node"]["validate"]["addTaint"] = True
    cfg = type(shipped)(raw=parse_config(raw).raw, profiles=shipped.profiles, xid_catalog=shipped.xid_catalog)
    append(snap, xid_line())
    agent = Agent(snap, cfg=cfg)
    agent.clear()
    assert agent.marks.validating is True  # the clear asks for a pass first
    status, marks = agent.cycle()  # every tier once more, the Xid line still in kmsg.log
    assert status is Status.PASS and marks.validating is False and agent.engine.validation.complete
