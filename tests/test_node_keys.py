"""The Node contract as users read it: the table of docs/agent.md is core/node_keys, word for word.

This is the one test that spells the keys and reasons: a change to any of them is a change every
user's alerts, scripts and admission policy see, so it must be a deliberate edit here too.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.config import load_config_dir
from agent.core.marks import Marks
from agent.core.node_keys import CANARY, CONDITIONS, DISABLED, TRUE, EventReason, Keys
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "examples" / "snapshots"


def readme_contract_rows() -> dict[str, str]:
    """`| what | key | values |` rows of the agent's page (docs/agent.md), by key."""
    section = (ROOT / "docs" / "agent.md").read_text()
    rows = re.findall(r"^\| (\w+) \| ([^|]+) \| (.+) \|$", section, flags=re.M)
    return {key.strip("`"): values for _, key, values in rows}


def test_the_readme_documents_every_key_of_the_contract() -> None:
    keys = Keys()
    rows = readme_contract_rows()
    assert (keys.status, keys.severity, keys.results, keys.clear_latched) == (
        "gpu-healthcheck/status",
        "gpu-healthcheck/severity",
        "gpu-healthcheck/results",
        "gpu-healthcheck/clear-latched",
    )
    for key in (keys.status, keys.severity, keys.results, keys.clear_latched):
        assert key in rows, key
    assert f"{keys.tainted}={TRUE}" in rows
    assert f"{keys.taint_opt_out}={DISABLED}" in rows
    assert f"{keys.config_channel}={CANARY}" in rows  # an operator's label the agent only reads
    assert f"{keys.taint}=<severity>:NoSchedule" in rows
    assert all(f"`{s.label}`" in rows[keys.severity] for s in Severity)
    assert all(f"`{s.value}`" in rows[keys.status] for s in Status if s is not Status.SKIPPED)


def test_the_readme_names_every_condition_reason_and_event_reason() -> None:
    rows = readme_contract_rows()
    for status, cond in CONDITIONS.items():
        assert f"`{cond.status}`" in rows["GPUHealthy"], status
        assert f"`{cond.reason}`" in rows["GPUHealthy"], status
    reasons = {r.value for r in EventReason}
    assert reasons == set(re.findall(r"`(\w+)`", rows["on the Node"]))


def test_the_engine_pairs_each_status_with_the_contract_condition() -> None:
    """A failing snapshot's Marks carry ChecksFailed; a healthy one's AllChecksPassed."""
    cfg = load_config_dir()
    seen: dict[Status, Marks] = {}
    for name in ("p5.48xlarge-healthy", "p5.48xlarge-xid79"):
        engine = Engine(SnapshotSource(SNAPSHOTS / name), cfg)
        for tier in ("gpu", "xid", "efa", "topology"):
            engine.run_tier(tier)
        _, marks = engine.evaluate()
        seen[marks.status] = marks
    assert set(seen) == {Status.PASS, Status.FAIL}
    assert (seen[Status.FAIL].condition_status, seen[Status.FAIL].condition_reason) == (
        "False",
        "ChecksFailed",
    )
    assert (seen[Status.PASS].condition_status, seen[Status.PASS].condition_reason) == (
        "True",
        "AllChecksPassed",
    )
