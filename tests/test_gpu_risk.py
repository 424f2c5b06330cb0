"""Risk per GPU under per-GPU isolation (core/node_risk.py, reporters/history_entry.py,
engine/history_annotation_reads.py): an episode our DRA device taint confines to one GPU counts for
that GPU, not the node; a clear that lifts its device taint, or a new boot, is that GPU's repair;
the node's label turns high for node-wide episodes, or when node.risk.gpus of its GPUs are high.

Pure: what a write counts, the node's label and each GPU's, the history writer's element (its bound,
no write on a steady node), what the engine expects the device-taint writer to hold, the per-GPU
`risk` of the results annotation, and `status NODE`'s lines. On the real API server:
tests/test_device_taints_kube.py (three episodes of GPU 3 under the real agent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from agent.cli.status_devices import gpu_risk_lines
from agent.config import parse_config
from agent.core.device_scope import DRIVER
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.history_annotation import (
    MAX_GPU_DAYS,
    Entry,
    HistoryTaint,
    encode,
    parse,
    parse_counts,
    parse_gpu_counts,
    parse_isolated,
)
from agent.core.marks import ClearRequest, Marks
from agent.core.node import NodeObject
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.core.node_risk import HIGH, NORMAL, RiskPolicy, gpu_tally, outlook, outlook_now, tally
from agent.core.probed import Probed
from agent.core.severity import Severity, Status
from agent.engine.history_annotation_reads import expected_isolation, risk_outlook
from agent.reporters.history_entry import History, isolated_gpus
from agent.reporters.taint_gate import TaintDecision
from tests.readme import section_docs

K = Keys(DEFAULT_PREFIX)
G3, G5 = "0000:86:00.0", "0000:a8:00.0"
KEY = f"xid/79/{G3}"
ON = HistoryTaint.ON
PCIS = [f"00000000:{b}:00.0" for b in ("53", "64", "75", "86", "97", "a8", "b9", "ca")]
INV = GpuInventory("nvml", gpus=tuple(Gpu(i, p) for i, p in enumerate(PCIS)))


def e(status: str, boot: str = "a", taint: str = "", did: str = "") -> Entry:
    return Entry("2026-11-20T10:00:00Z", status, KEY if status == "fail" else "", boot, taint, "", did)


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


# -- what a write counts ------------------------------------------------------------------------------
def test_an_episode_on_an_isolated_gpu_is_the_gpus_and_its_clear_a_repair() -> None:
    assert tally([e("pass")], e("fail"), (), (G3,)) == (0, 0)  # no node episode ...
    assert gpu_tally([e("pass")], e("fail"), (), (G3,)) == {G3: (1, 0)}  # ... GPU 3's
    cleared = e("pass", did="clear")
    assert tally([e("fail")], cleared, (G3,), ()) == (0, 0)
    assert gpu_tally([e("fail")], cleared, (G3,), ()) == {G3: (0, 1)}  # the clear lifted its taint
    rebooted = e("pass", boot="b", did="reboot")
    assert gpu_tally([e("fail")], rebooted, (G3,), (G3,)) == {G3: (0, 1)}  # a new boot, taint held
    assert gpu_tally([e("fail")], e("fail", did="clear"), (G3, G5), (G3, G5)) == {}  # nothing lifted
    assert gpu_tally([e("fail")], None, (G3,), (G3, G5)) == {G5: (1, 0)}  # no entry: GPU 5 added
    assert gpu_tally([e("fail")], None, (G3,), ()) == {}  # recovered: no repair


def test_a_fault_that_turns_node_wide_is_the_nodes_and_the_old_rules_stay_out_of_it() -> None:
    assert tally([e("fail")], e("fail", taint=ON), (G3,), ()) == (1, 0)  # node-wide: a node episode
    assert tally([e("fail", taint=ON)], e("fail", taint=ON), (), ()) == (0, 0)  # still the same one
    # our node taint standing in for a refused rule: the clear repairs the GPU, not the node
    assert tally([e("fail", taint=ON)], e("pass", did="clear"), (G3,), ()) == (0, 0)
    assert gpu_tally([e("fail", taint=ON)], e("pass", did="clear"), (G3,), ()) == {G3: (0, 1)}
    # without device taints, as before
    assert tally([e("pass")], e("fail")) == (1, 0)
    assert tally([e("fail", taint=ON)], e("pass", did="clear")) == (0, 1)


def test_the_nodes_label_follows_its_own_counts_or_enough_high_risk_gpus() -> None:
    policy, day = RiskPolicy(), "2026-11-28"
    three = {G3: {day: (3, 0)}}
    assert outlook({}, three, policy, day).node == NORMAL  # one flaky GPU: only it is high
    assert outlook({}, three, policy, day).gpus == {G3: HIGH}
    two = {**three, G5: {day: (0, 2)}}
    assert outlook({}, two, policy, day).node == HIGH  # node.risk.gpus (2) GPUs high
    assert outlook({}, two, RiskPolicy(gpus=0), day).node == NORMAL  # 0: never by its GPUs
    assert outlook({}, three, RiskPolicy(gpus=1), day).node == HIGH
    assert outlook({day: (3, 0)}, {}, policy, day).node == HIGH  # node-wide episodes, as before
    later = "2026-12-28"  # 31st day: the window passed
    assert outlook({}, two, policy, later).gpus == {G3: NORMAL, G5: NORMAL}


# -- the writer's element -----------------------------------------------------------------------------
def node_doc() -> dict[str, Any]:
    return {"metadata": {"annotations": {}}, "status": {"conditions": []}}


def marks(status: Status, isolated: tuple[str, ...] | None, *, clear: bool = False) -> Marks:
    doc = {"version": 1, "status": status.value, "checks": [], "latched": []}
    sev = Severity.REBOOT if status is Status.FAIL else Severity.NONE
    return Marks(
        status,
        sev,
        json.dumps(doc),
        status is Status.FAIL,
        "m",
        worst_key=KEY if status is Status.FAIL else "",
        boot_id="boot-a",
        isolated=isolated,
        drop_annotations=(K.clear_latched, K.clear_latched_by) if clear else (),
    )


def write(h: History, node: dict[str, Any], m: Marks) -> dict[str, str]:
    ann = h.annotation(node, m, TaintDecision())  # the node taint is off: the rule isolates
    node["metadata"]["annotations"].update(ann)
    return ann


def test_three_episodes_of_one_isolated_gpu_and_their_clears_count_for_it_alone() -> None:
    h, node = History(DEFAULT_PREFIX), node_doc()
    anns = node["metadata"]["annotations"]
    for _ in range(3):
        assert write(h, node, marks(Status.FAIL, (G3,)))
        assert write(h, node, marks(Status.FAIL, (G3,))) == {}  # steady: nothing to write
        anns[K.clear_latched] = "all"
        anns[K.clear_latched_by] = ClearRequest("alice", "GPU 3 reseated").encode()
        assert write(h, node, marks(Status.PASS, (), clear=True))
        del anns[K.clear_latched], anns[K.clear_latched_by]
        assert write(h, node, marks(Status.PASS, ())) == {}
    raw = anns[K.history]
    assert parse_gpu_counts(raw) == {G3: {today(): (3, 3)}}
    assert parse_counts(raw) == {}  # nothing for the node
    assert parse_isolated(raw) == ()
    assert [x.did for x in parse(raw)].count("clear") == 3
    # a writer that cannot tell (None) keeps what was recorded
    assert write(h, node, marks(Status.FAIL, (G3,))) and write(h, node, marks(Status.FAIL, None)) == {}
    assert parse_isolated(anns[K.history]) == (G3,)


def test_the_element_is_bounded_and_an_older_reader_keeps_the_entries() -> None:
    days = [f"2026-{m:02d}-{d:02d}" for m in range(1, 8) for d in range(1, 29)]
    gpus = {f"0000:{b:02x}:00.0": {d: (1, 1) for d in days} for b in range(8)}
    text = encode([e("fail")], {}, gpus, [G3, G5])
    kept = parse_gpu_counts(text)
    assert sum(len(c) for c in kept.values()) == MAX_GPU_DAYS
    assert min(d for c in kept.values() for d in c) > days[0]  # the oldest went first
    assert len(text.encode()) < 4096
    assert [x for x in json.loads(text) if "at" in x] == json.loads(encode(parse(text)))
    assert parse_isolated(text) == (G3, G5)
    assert isolated_gpus([_Device(PCIS[3], "gpu-3"), _Device("", "gpu-9")]) == (G3, "gpu-9")


@dataclass(frozen=True)
class _Device:
    pci: str
    name: str


# -- what the engine expects, and shows ---------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    node: Probed[NodeObject]
    results: list[CheckResult]
    wanted: bool = True
    inventory: Any = INV
    gpus: list[dict[str, Any]] = field(default_factory=list)
    checked_at: str = field(default_factory=lambda: f"{today()}T12:00:00Z")
    cleared: bool = False


def xid79(pci: str) -> CheckResult:
    return CheckResult(
        "xid", findings=(Finding("xid", "xid.79", Severity.REBOOT, "Xid 79", key=f"xid/79/{pci}"),)
    )


def verdicts(published: bool = True) -> list[dict[str, Any]]:
    return [
        {"index": i, "pci": p[4:], **({"dra": f"gpu-{i}"} if published else {})} for i, p in enumerate(PCIS)
    ]


def node_with(history: str | None = None, labels: dict[str, str] | None = None) -> NodeObject:
    return NodeObject("n", labels or {}, None, None, annotations={K.history: history} if history else {})


def cfg(isolation: str = "auto", mode: str = "taint") -> Any:
    return parse_config({"node": {"isolation": isolation, "mode": mode}})


def test_the_engine_expects_what_the_device_taint_writer_will_hold() -> None:
    fail3 = Inputs(node_with(), [xid79(G3)], gpus=verdicts())
    assert expected_isolation(None, fail3, cfg()) == (G3,)
    assert expected_isolation(None, fail3, cfg("node")) == ()  # isolation node: the node taint
    assert expected_isolation(None, fail3, cfg(mode="observe")) == ()
    unpublished = Inputs(node_with(), [xid79(G3)], gpus=verdicts(published=False))
    assert expected_isolation(None, unpublished, cfg()) == ()  # not in the driver's slices
    held = encode([e("fail")], {}, {}, [G3])
    both = Inputs(node_with(held), [xid79(G3), xid79(G5)], gpus=verdicts())
    assert expected_isolation(held, both, cfg()) == (G3, G5)
    recovering = Inputs(node_with(held), [], gpus=verdicts())
    assert expected_isolation(held, recovering, cfg()) == (G3,)  # the rules stay while recovering
    node_wide = encode([e("fail", taint=ON)])
    assert (
        expected_isolation(node_wide, Inputs(node_with(node_wide), [xid79(G3)], gpus=verdicts()), cfg()) == ()
    )
    off = Inputs(node_with(None, {K.taint_opt_out: "disabled"}), [xid79(G3)], gpus=verdicts())
    assert expected_isolation(None, off, cfg()) == ()


def test_a_high_risk_gpu_shows_in_its_verdict_and_the_third_episode_predicts_it() -> None:
    day = today()
    two = encode([e("pass")], {}, {G3: {day: (2, 2)}})
    third = Inputs(node_with(two), [xid79(G3)], gpus=verdicts())
    risk = risk_outlook(third, cfg(), Status.FAIL, "boot-a")
    assert risk.node == NORMAL
    assert [g["index"] for g in risk.gpus if g.get("risk") == HIGH] == [3]
    # the prediction is what the writer will record: the same count
    seen = outlook_now(two, parse(two), status="fail", boot="boot-a", cleared=False,
                       now=f"{day}T12:00:00Z", policy=RiskPolicy(), isolated=(G3,))  # fmt: skip
    assert seen.gpus == {G3: HIGH} and seen.node == NORMAL
    # without isolation the same fail is the node's third episode
    node_only = encode([e("pass")], {day: (2, 0)})
    assert risk_outlook(Inputs(node_with(node_only), [xid79(G3)], gpus=verdicts()), cfg("node"),
                        Status.FAIL, "boot-a").node == HIGH  # fmt: skip


def test_status_node_lists_each_gpus_counts() -> None:
    day = today()
    raw = encode([e("pass")], {}, {G3: {day: (3, 3)}, G5: {day: (1, 0)}})
    results = {"gpus": [{"index": 3, "pci": G3, "dra": "gpu-3", "risk": "high"}, {"index": 5, "pci": G5}]}
    node = {"metadata": {"name": "n", "annotations": {K.history: raw, K.results: json.dumps(results)}}}
    lines = gpu_risk_lines(node)
    assert lines[0].startswith("GPU RISK")
    assert "GPU 3 (0000:86:00.0, gpu-3)" in lines[1] and "high" in lines[1]
    assert "3 failure episode(s), 3 repair(s)" in lines[1]
    assert "GPU 5 (0000:a8:00.0)" in lines[2] and "high" not in lines[2]
    assert gpu_risk_lines({"metadata": {"name": "n", "annotations": {}}}) == []


def test_the_readmes_kueue_example_for_dra_maps_the_drivers_device_class_to_its_quota() -> None:
    docs = section_docs()
    (config,) = [d for d in docs if d.get("kind") == "Configuration"]
    (mapping,) = config["resources"]["deviceClassMappings"]
    assert mapping["deviceClassNames"] == [DRIVER]
    queues = [d for d in docs if d.get("kind") == "ClusterQueue"]
    covered = [r for q in queues for g in q["spec"]["resourceGroups"] for r in g["coveredResources"]]
    assert mapping["name"] in covered and "nvidia.com/gpu" in covered  # DRA-only and device plugin
