"""The risk label (`<prefix>/risk=high|normal`, core/node_risk.py): failure episodes and repairs per
day in the Node's history annotation, beside its last 20 transitions.

Pure: what a transition counts, the window and its decay, counts that outlive the 20 entries, an
older agent's reader. On the real API server: an engine per boot on recorded snapshots (a healthy
p5.48xlarge, the same after an Xid 79) and the Node writer: the third episode turns the label high in
the PATCH that records it, the steady state and a restarted agent write nothing, and counts moved
past the window bring it back to normal with one write.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from agent.config import load_config_dir, yaml_safe
from agent.core.history_annotation import MAX_ENTRIES, Entry, HistoryTaint, encode, parse, parse_counts
from agent.core.marks import Marks
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.core.node_risk import HIGH, NORMAL, RiskPolicy, add, risk, risk_now, tally
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.write_policy import fingerprint
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import SnapshotSource
from agent.reporters.history_entry import History
from agent.reporters.node_writer import NodeWriter
from agent.reporters.taint_gate import TaintDecision
from tests.conftest import shipped

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
K = Keys(DEFAULT_PREFIX)
KEY = "xid/79/0000:53:00.0"


def e(status: str, boot: str = "a", taint: str = "", did: str = "") -> Entry:
    return Entry("2026-11-20T10:00:00Z", status, KEY if status == "fail" else "", boot, taint, "", did)


def test_what_a_transition_counts() -> None:
    marked = e("fail", taint=HistoryTaint.ON)
    assert tally([], e("fail")) == (1, 0)  # the first failure of a new Node
    assert tally([e("pass")], e("fail")) == (1, 0)
    assert tally([marked], e("fail", boot="b", taint=HistoryTaint.ON, did="reboot")) == (0, 1)  # a repair
    assert tally([marked, e("unknown")], e("fail", taint=HistoryTaint.ON)) == (0, 0)  # unknown judges nothing
    assert tally([marked], e("pass", boot="b", did="reboot+untaint")) == (0, 1)
    assert tally([marked], e("fail", taint=HistoryTaint.ON, did="clear")) == (0, 1)  # an operator's clear
    assert tally([e("fail")], e("pass", boot="b")) == (0, 0)  # unmarked (observe): no repair asked
    assert tally([e("pass")], e("pass", boot="b")) == (0, 0)  # a healthy node rebooted


def test_the_window_decays_and_each_number_is_its_own() -> None:
    counts = add(add({}, "2026-11-01", (2, 0)), "2026-11-10", (1, 1))
    policy = RiskPolicy(failures=3, repairs=2, window_days=30)
    assert risk(counts, policy, "2026-11-10") == HIGH
    assert risk(counts, policy, "2026-11-30") == HIGH  # 2026-11-01 is the 30th day back
    assert risk(counts, policy, "2026-12-01") == NORMAL  # it fell out: 1 episode, 1 repair left
    assert risk(add(counts, "2026-12-01", (0, 1)), policy, "2026-12-01") == HIGH  # 2 repairs
    assert risk(counts, RiskPolicy(failures=0, repairs=0), "2026-11-10") == NORMAL  # both off
    old = add({}, "2026-01-01", (5, 5))
    assert add(old, "2026-11-01", (1, 0)) == {"2026-11-01": (1, 0)}  # older than 90 days: gone


def test_counts_outlive_the_20_entries_and_an_older_reader_skips_them() -> None:
    h = History(DEFAULT_PREFIX)
    node: dict[str, Any] = {"metadata": {"annotations": {}}, "status": {"conditions": []}}
    doc = {"version": 1, "checks": [], "latched": []}
    for i in range(30):  # 15 failure episodes, each recovered
        status = Status.FAIL if i % 2 == 0 else Status.PASS
        m = Marks(status, Severity.REBOOT if i % 2 == 0 else Severity.NONE, json.dumps(doc), False, "m",
                  worst_key=f"k{i}", boot_id="boot-a")  # fmt: skip
        ann = h.annotation(node, m, TaintDecision())
        node["metadata"]["annotations"].update(ann)
    raw = node["metadata"]["annotations"][K.history]
    assert len(parse(raw)) == MAX_ENTRIES  # the entries keep 20 transitions ...
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    assert parse_counts(raw) == {today: (15, 0)}  # ... the counts all 15 episodes
    assert json.loads(raw)[0] == {"days": {today: [15, 0]}}  # first, one element of its own
    # an older agent's reader (entries with `at` and `status` only) skips it
    assert [x for x in json.loads(raw) if "at" in x] == json.loads(encode(parse(raw)))
    assert risk_now(raw, parse(raw), status="pass", boot="boot-a", cleared=False,
                    now=f"{today}T12:00:00Z", policy=RiskPolicy()) == HIGH  # fmt: skip


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


def config_dir(tmp_path: Path, risk: dict[str, int]) -> Path:
    """The shipped config with node.risk set and the per-GPU reboot escalation off (an Xid 79 back
    after 2 reboots would become isolate on its own; the label does not depend on it)."""
    out = tmp_path / "config"
    shutil.copytree(ROOT / "config", out, dirs_exist_ok=True)
    doc = yaml_safe.load((out / "config.yaml").read_text())
    doc["node"]["escalateAfterReboots"] = 0
    doc["node"]["risk"] = risk
    (out / "config.yaml").write_text(yaml.safe_dump(doc))
    return out


def agent_on(recording: Path, boot: str, writer: NodeWriter, tmp_path: Path) -> tuple[Engine, Marks]:
    """An agent started on this boot with this recording, and its first verdict's Marks."""
    snap = tmp_path / "snap"
    shutil.rmtree(snap, ignore_errors=True)
    shutil.copytree(recording, snap, symlinks=True)
    (snap / "boot_id").write_text(boot + "\n")
    eng = Engine(
        SnapshotSource(snap),
        load_config_dir(tmp_path / "config"),
        node_getter=lambda: node_from_dict(writer.watch.current(fresh=True)),
    )
    eng.restore(writer.read_results())
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    return eng, eng.evaluate()[1]


def label(core: k8s.CoreV1Api, name: str) -> str | None:
    return (core.read_node(name).metadata.labels or {}).get(K.risk)


@pytest.mark.kube
def test_three_episodes_raise_it_and_it_decays(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, tmp_path: Path
) -> None:
    gpu_node()
    config_dir(tmp_path, {"failures": 3, "repairs": 0, "windowDays": 30})
    writes = Writes()
    writer = NodeWriter(core, kube_node_name, on_write=writes, cfg=shipped())
    seen = []
    for i, recording in enumerate((XID79, HEALTHY, XID79, HEALTHY, XID79)):
        agent, m = agent_on(recording, f"{i:08x}-boot", writer, tmp_path)
        before = Counter(writes.c)
        assert writer.apply(m).ok
        assert (writes.c - before)["node"] == 1  # the label rides in the PATCH of the transition
        seen.append(label(core, kube_node_name))
    assert seen == [NORMAL, NORMAL, NORMAL, NORMAL, HIGH]
    raw = core.read_node(kube_node_name).metadata.annotations[K.history]
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    # 3 episodes; and every reboot came while our taint was on (the passing boots still wait for
    # node.recoverAfter): 4 repairs, not counted here (repairs: 0)
    assert parse_counts(raw) == {today: (3, 4)}
    # steady state: the next verdict's fingerprint is the same (the agent's loop writes nothing);
    # a restarted agent on the same boot keeps the label and adds no transition
    assert fingerprint(agent.evaluate()[1]) == fingerprint(m)
    history = core.read_node(kube_node_name).metadata.annotations[K.history]
    assert writer.apply(agent_on(XID79, "00000004-boot", writer, tmp_path)[1]).ok
    assert label(core, kube_node_name) == HIGH
    assert core.read_node(kube_node_name).metadata.annotations[K.history] == history
    # 30 days later (the counts moved back by the test, as an admin would): normal, one write
    then = (date.fromisoformat(today) - timedelta(days=30)).isoformat()
    moved = raw.replace(f'"{today}"', f'"{then}"')
    core.patch_node(kube_node_name, {"metadata": {"annotations": {K.history: moved}}})
    writer.watch.current(fresh=True)
    _, m = agent_on(XID79, "00000004-boot", writer, tmp_path)
    assert m.risk == NORMAL
    before = Counter(writes.c)
    assert writer.apply(m).ok and (writes.c - before)["node"] == 1
    assert label(core, kube_node_name) == NORMAL


@pytest.mark.kube
def test_two_repairs_raise_it(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, tmp_path: Path
) -> None:
    gpu_node()
    config_dir(tmp_path, {"failures": 0, "repairs": 2, "windowDays": 30})
    writer = NodeWriter(core, kube_node_name, cfg=shipped())
    seen = []
    for i, recording in enumerate((XID79, XID79, XID79)):  # a reboot of a tainted node, twice
        assert writer.apply(agent_on(recording, f"{i:08x}-boot", writer, tmp_path)[1]).ok
        seen.append(label(core, kube_node_name))
    assert seen == [NORMAL, NORMAL, HIGH]
    kept = parse(core.read_node(kube_node_name).metadata.annotations[K.history])
    assert [x.did for x in kept] == ["taint", "reboot", "reboot"]
