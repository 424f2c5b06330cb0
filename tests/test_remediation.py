"""node.remediationConditions (issue 22 item 1): the conditions remediation engines act on.

Pure tests: the entries' validation, the types the admission fence must list for a config, the engine's
marks in each mode, and what the writer plans once the taint is decided (the brake, the opt-out label,
one PATCH, removal of ours only). Their hysteresis (fail / unknown / recovery / restart, a clear):
tests/test_state.py. The real API server tests are in tests/test_remediation_kube.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config_dir, parse_config
from agent.config.fence_view import condition_types
from agent.config.schema import ConfigError
from agent.core.marks import Marks
from agent.core.remediation_types import (
    OUR_CONDITION_REASONS,
    OUR_REMEDIATION_REASONS,
    RemediationCondition,
    RemediationMark,
    RemediationReason,
)
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes.snapshot import SnapshotSource
from agent.reporters.node_patch import plan_conditions

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
AHR = "AcceleratedHardwareReady"
ENTRY = f'    - type: {AHR}\n      unhealthyStatus: "False"\n      minSeverity: reset\n'
R = RemediationReason


# ------------------------------------------------------------------------------------------ config


def test_the_entry_shape_and_its_defaults() -> None:
    cfg = parse_config(
        {
            "node": {
                "remediationConditions": [
                    {"type": AHR, "unhealthyStatus": "False", "minSeverity": "reset"},
                    {"type": "example.com/GPUOk", "unhealthyStatus": "True", "minSeverity": "isolate"},
                    {"type": "NodeGPUBroken"},
                ]
            }
        }
    )
    assert cfg.node.remediation_conditions == (
        RemediationCondition(AHR, "False", Severity.RESET),
        RemediationCondition("example.com/GPUOk", "True", Severity.ISOLATE),
        RemediationCondition("NodeGPUBroken", "False", Severity.RESET),
    )
    assert cfg.node.remediation_conditions[1].healthy_status == "False"
    assert parse_config({}).node.remediation_conditions == ()  # empty by default: nothing changes


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([{"type": AHR, "extra": 1}], "unknown key"),
        ([{"unhealthyStatus": "False"}], "type: missing"),
        ([{"type": AHR, "unhealthyStatus": False}], "quote it"),
        ([{"type": AHR, "unhealthyStatus": "Unknown"}], "not one of True, False"),
        ([{"type": AHR, "minSeverity": "monitor"}], "never fails a node"),
        ([{"type": "Ready"}], "kubelet's condition"),
        ([{"type": "GPUHealthy"}], "node.conditionType"),
        ([{"type": AHR}, {"type": AHR}], "listed twice"),
        ([{"type": "not a type"}], "is not a condition type"),
        (["AcceleratedHardwareReady"], "expected a mapping"),
        ({"type": AHR}, "expected list"),
    ],
)
def test_a_bad_entry_is_a_rejected_config(entries: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_config({"node": {"remediationConditions": entries}})


def test_an_entry_below_the_taints_severity_is_rejected() -> None:
    """An engine acts only on a node we taint: a lower minSeverity would promise what never comes."""
    with pytest.raises(ConfigError, match=r"below node\.taintMinSeverity"):
        parse_config({"node": {"taintMinSeverity": "reboot", "remediationConditions": [{"type": AHR}]}})


def test_the_types_the_fence_must_list_are_the_configs_in_any_yaml_style(tmp_path: Path) -> None:
    """The policy takes no parameter: its list is generated from the parsed config, so any YAML style
    of config.yaml is fine (the old fence read the text with regular expressions and forbade some)."""
    text = (
        "node: {conditionType: GPUOk, remediationConditions: "
        f"[{{type: {AHR}}}, {{type: example.com/GPUBroken, minSeverity: isolate}}]}}\n"
    )
    (tmp_path / "config.yaml").write_text(text)
    cfg = load_config_dir(tmp_path)
    assert condition_types(cfg.node) == ["GPUOk", AHR, "example.com/GPUBroken"]
    # The shipped file (commented example included) names no remediation type.
    assert condition_types(load_config_dir(ROOT / "config").node) == ["GPUHealthy"]


def test_the_generated_policy_lists_the_shipped_configs_types() -> None:
    policy = (ROOT / "manifests" / "30-admission-policy.yaml").read_text()
    assert "['GPUHealthy']" in policy and "params" not in policy and "paramKind" not in policy


# ------------------------------------------------------------------------------------------ engine


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    return dest


def engine_for(snap: Path, **node: object) -> Engine:
    shipped = load_config_dir(ROOT / "config")
    doc = {
        "node": {"remediationConditions": [{"type": AHR}, {"type": "GPUIsolate", "minSeverity": "isolate"}]}
    }
    doc["node"].update(node)
    base = parse_config(doc)
    cfg = type(shipped)(raw=base.raw, profiles=shipped.profiles, xid_catalog=shipped.xid_catalog)
    return Engine(SnapshotSource(snap), cfg)


def run_all(engine: Engine) -> None:
    for tier in ("gpu", "xid", "efa", "topology"):
        engine.run_tier(tier)


def gpu_timeout(snap: Path) -> None:
    """A hung nvidia-smi: a GPU failure at reboot (not latched), once two gpu cycles confirm it."""
    (snap / "errors.json").write_text(
        json.dumps({"nvidia-smi-q.txt": {"kind": "timeout", "message": "no answer after 30 s; killed"}})
    )


def by_type(marks: Marks) -> dict[str, RemediationMark]:
    return {m.type: m for m in marks.remediation}


def test_the_message_changes_only_with_the_verdict(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)
    gpu_timeout(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    _, first = eng.evaluate()
    for _ in range(3):
        run_all(eng)
        _, again = eng.evaluate()
        assert again.remediation == first.remediation


@pytest.mark.parametrize("mode", ["observe", "label"])
def test_observe_and_label_modes_never_mark_a_node_for_remediation(snap: Path, mode: str) -> None:
    eng = engine_for(snap, mode=mode)
    run_all(eng)
    gpu_timeout(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    _, marks = eng.evaluate()
    got = by_type(marks)[AHR]
    assert not got.unhealthy and got.reason == R.NOT_ENFORCED
    assert f"mode {mode}" in got.message and f"{AHR}=False" in got.message


# ------------------------------------------------------------------------------------------ writer


def mark(unhealthy: bool = True, reason: str = R.FAILED, kind: str = AHR) -> RemediationMark:
    return RemediationMark(kind, "False", unhealthy, reason, "fail (reboot): gpu.responsive: hung → reboot")


def marks_with(*entries: RemediationMark) -> Marks:
    return Marks(Status.FAIL, Severity.REBOOT, "{}", True, "fail: x", remediation=entries)


def node_with(*conditions: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "status": {"conditions": list(conditions)}}


def plan(node: dict[str, Any], marks: Marks, **decided: bool) -> dict[str, dict[str, Any]]:
    conds = plan_conditions(
        node,
        marks,
        condition_type="GPUHealthy",
        taint_on=decided.get("taint_on", False),
        brake_open=decided.get("brake_open", False),
        disabled=decided.get("disabled", False),
        prefix="gpu-healthcheck",
        now="2026-01-01T00:00:00Z",
    )
    return {c["type"]: c for c in conds}


def test_the_unhealthy_status_only_where_our_taint_is_on() -> None:
    marks = marks_with(mark())
    tainted = plan(node_with(), marks, taint_on=True)
    assert (tainted[AHR]["status"], tainted[AHR]["reason"]) == ("False", R.FAILED)
    assert set(tainted) == {"GPUHealthy", AHR}  # one PATCH for both
    held = plan(node_with(), marks, brake_open=True)[AHR]
    assert (held["status"], held["reason"]) == ("True", R.BRAKE_HELD)
    assert held["message"].startswith("not marked for remediation: the brake holds this node back")
    off = plan(node_with(), marks, disabled=True)[AHR]
    assert (off["status"], off["reason"]) == ("True", R.TAINT_DISABLED)
    assert "gpu-healthcheck/taint=disabled" in off["message"]


def test_nothing_to_write_when_every_condition_matches() -> None:
    marks = marks_with(mark())
    first = plan(node_with(), marks, taint_on=True)
    node = node_with(*first.values())
    assert plan(node, marks, taint_on=True) == {}


def test_a_removed_entry_goes_and_another_components_condition_stays() -> None:
    theirs = {"type": "NvidiaGPUHealthy", "status": "False", "reason": "NvidiaXidError", "message": "x"}
    ours_gone = {"type": "OldEntry", "status": "True", "reason": R.PASSED, "message": "pass"}
    same_type_not_ours = {"type": "Other", "status": "True", "reason": "KubeletReady", "message": "x"}
    got = plan(node_with(theirs, ours_gone, same_type_not_ours), marks_with(mark()), taint_on=True)
    assert got["OldEntry"] == {"type": "OldEntry", "$patch": "delete"}
    assert "NvidiaGPUHealthy" not in got and "Other" not in got


def test_every_reason_of_ours_is_one_the_fence_knows() -> None:
    assert set(OUR_REMEDIATION_REASONS) <= set(OUR_CONDITION_REASONS)
    policy = (ROOT / "manifests" / "30-admission-policy.yaml").read_text()
    assert all(f"'{r}'" in policy for r in OUR_CONDITION_REASONS)
