"""The trend warnings end to end: an Engine on an 8x H100 snapshot whose files change read by read
(tests/trend_scenario.py says what is derived), on a wall clock the test moves. What the agent keeps,
writes, restores and counts; the one-shot check from a snapshot with the reads the agent kept."""

from __future__ import annotations

import json
from pathlib import Path

from agent.checks.registry import CHECKS, run_checks
from agent.core.node_keys import Keys
from agent.core.results_doc import MAX_RESULTS_BYTES
from agent.core.severity import Status
from agent.core.text import ELLIPSIS
from agent.engine.write_policy import fingerprint
from agent.probes.snapshot import SnapshotSource
from agent.probes.source import gather_facts
from agent.reporters.metrics import Metrics
from tests.trend_scenario import BUS, Node

RULES = (
    "trend.memory.ecc-rate",
    "trend.memory.remap-growth",
    "trend.memory.remap-headroom",
    "trend.nvlink.errors-growing",
    "trend.pcie.errors-growing",
    "trend.thermal.clock-stuck",
    "trend.thermal.near-slowdown",
)


def warned(doc: dict[str, object]) -> dict[str, set[str]]:
    """GPU pci → the trend rules its verdict warns of."""
    out: dict[str, set[str]] = {}
    for entry in doc["gpus"]:  # type: ignore[attr-defined]
        steps = entry.get("warnings") or {}
        out[entry["pci"]] = {rule for step in steps.values() for rule in step}
    return out


def test_every_warning_on_every_gpu_fits_the_annotation(tmp_path: Path) -> None:
    metrics = Metrics()
    node = Node(tmp_path, worn=True)
    node.engine.metrics = metrics
    for _ in range(node.cfg.trends.keep_reads):
        node.read()
    verdict, marks = node.engine.evaluate()
    doc = json.loads(marks.results_json)
    assert verdict.status is Status.WARN and not marks.taint  # warnings never taint
    assert warned(doc) == {f"0000:{b}:00.0": set(RULES) for b in BUS}
    gpu0 = doc["gpus"][0]
    assert gpu0["warnings"]["plan-service"]["trend.nvlink.errors-growing"] == "216.0/h"
    assert gpu0["warnings"]["watch"]["trend.memory.ecc-rate"] == "4000/h"
    assert "findings" not in gpu0  # the warnings are not repeated as keys
    # Under 16 KiB with nothing cut: every kept read, every message whole.
    size = len(marks.results_json.encode())
    assert size < MAX_RESULTS_BYTES, size
    assert len(doc["trends"]["t"]) == node.cfg.trends.keep_reads
    assert not any(ELLIPSIS in c["message"] for c in doc["checks"])
    # One series per rule, counting GPUs; none per GPU.
    families = {m.name: m for m in metrics.registry.collect()}
    samples = {s.labels["rule"]: s.value for s in families["gpu_healthcheck_gpu_warnings"].samples}
    assert samples == dict.fromkeys(RULES, 8.0)


def test_a_restarted_agent_keeps_the_reads(tmp_path: Path) -> None:
    node = Node(tmp_path, worn=True)
    for _ in range(5):
        node.read()
    _, marks = node.engine.evaluate()
    doc = json.loads(marks.results_json)
    assert len(doc["trends"]["t"]) == 5
    assert "trend.nvlink.errors-growing" not in warned(doc)["0000:19:00.0"]  # 4 intervals so far
    node.engine = node.new_engine()  # the agent restarts and reads its annotation back
    node.engine.restore(doc)
    for _ in range(4):
        node.read()
    _, marks = node.engine.evaluate()
    assert "trend.nvlink.errors-growing" in warned(json.loads(marks.results_json))["0000:19:00.0"]
    # Without the annotation, four reads are not a trend of eight intervals.
    node.engine = node.new_engine()
    for _ in range(4):
        node.read()
    _, marks = node.engine.evaluate()
    assert "trend.nvlink.errors-growing" not in warned(json.loads(marks.results_json))["0000:19:00.0"]


def test_a_healthy_node_writes_nothing_for_its_trends(tmp_path: Path) -> None:
    """Reads are kept every spacing and temperatures move, but no counter does: no Node write."""
    node = Node(tmp_path, worn=False)
    prints = []
    for _ in range(8):
        node.read()
        verdict, marks = node.engine.evaluate()
        assert verdict.status is Status.PASS
        prints.append(fingerprint(marks))
    assert len(set(prints[2:])) == 1  # after the first reads' notes ("no previous sample")
    assert len(json.loads(marks.results_json)["trends"]["t"]) == 8  # yet every read is kept
    # A counter that moves is written, so that a restart finds it.
    aer = node.devices / "0000:19:00.0" / "aer_dev_correctable"
    aer.write_text(aer.read_text().replace("TOTAL_ERR_COR 0", "TOTAL_ERR_COR 1"))
    node.read()
    _, marks = node.engine.evaluate()
    assert fingerprint(marks) != prints[-1]


def test_a_reboot_starts_the_counts_that_start_again(tmp_path: Path) -> None:
    node = Node(tmp_path, worn=True)
    for _ in range(9):
        node.read()
    node.reboot("9d1e2f30-0000-4000-8000-000000000001")
    node.read()  # counters that live in the driver would start again from 0; ours keep growing
    _, marks = node.engine.evaluate()
    left = warned(json.loads(marks.results_json))["0000:19:00.0"]
    assert "trend.memory.ecc-rate" not in left and "trend.nvlink.errors-growing" not in left
    assert "trend.pcie.errors-growing" not in left
    # Remapped rows live in the GPU's InfoROM, and levels are levels: they stay.
    assert {"trend.memory.remap-growth", "trend.memory.remap-headroom", "trend.thermal.near-slowdown"} <= left


def test_check_from_a_snapshot_judges_with_the_reads_the_agent_kept(tmp_path: Path) -> None:
    node = Node(tmp_path, worn=True)
    for _ in range(8):
        node.read()
    _, marks = node.engine.evaluate()
    doc = json.loads((node.snap / "node.json").read_text())
    doc["metadata"]["annotations"] = {Keys().results: marks.results_json}
    (node.snap / "node.json").write_text(json.dumps(doc))
    node.read()  # the node one spacing later, as a snapshot would record it
    nvlink = [s for s in CHECKS if s.name == "trend.nvlink"]
    facts = gather_facts(SnapshotSource(node.snap), node.cfg, now=node.now)
    assert len(facts.trends.reads) == 9
    assert run_checks(nvlink, facts, node.cfg)[0].status is Status.WARN
    # The same snapshot without the agent's reads (no node.json): one read, no trend.
    (node.snap / "node.json").unlink()
    alone = gather_facts(SnapshotSource(node.snap), node.cfg, now=node.now)
    assert len(alone.trends.reads) == 1
    assert run_checks(nvlink, alone, node.cfg)[0].status is Status.PASS


def test_thresholds_and_the_reads_kept_change_live(tmp_path: Path) -> None:
    """A reloaded config (engine.cfg, as the ConfigMap watch sets it) applies at the next gpu cycle,
    on the reads already kept: no restart, no new read needed."""
    from tests.trend_scenario import config

    node = Node(tmp_path, worn=True)
    for _ in range(node.cfg.trends.keep_reads):
        node.read()
    node.engine.cfg = config(
        {
            "trends": {
                "eccCorrectablePerHour": 10**6,
                "keepReads": 6,
                "nvlinkGrowingReads": 5,
                "pcieGrowingReads": 5,
            }
        }
    )
    node.engine.run_tier("gpu")
    _, marks = node.engine.evaluate()
    doc = json.loads(marks.results_json)
    left = warned(doc)["0000:19:00.0"]
    assert "trend.memory.ecc-rate" not in left and "trend.nvlink.errors-growing" in left
    assert len(doc["trends"]["t"]) == 6  # fewer reads kept, at once
    node.engine.cfg = config({"severities": {"trend.thermal.clock-stuck": "none"}})
    node.engine.run_tier("gpu")
    _, marks = node.engine.evaluate()
    assert "trend.thermal.clock-stuck" not in warned(json.loads(marks.results_json))["0000:19:00.0"]


def test_warnings_on_every_gpu_with_a_link_trend_show_on_the_node_not_on_devices(tmp_path: Path) -> None:
    """marks.warn_scope (a None-effect device taint per GPU with isolation gpu|auto): the worn node
    warns on NVLink too, on all 8 GPUs: node-wide, no device shows it; mode observe asks for none."""
    from tests.trend_scenario import config

    scopes = []
    for mode, where in (("taint", tmp_path / "taint"), ("observe", tmp_path / "observe")):
        node = Node(where, worn=True, cfg=config({"node": {"mode": mode}}))
        for _ in range(node.cfg.trends.keep_reads):
            node.read()
        scopes.append(node.engine.evaluate()[1].warn_scope)
    assert scopes[0] is not None and scopes[0].node_wide
    assert scopes[1] is None
