"""gpu.driver-taints and its step after the checks (checks/dra_taints.py): the taints NVIDIA's DRA driver
puts on its own devices are evidence beside ours.

The recordings: examples/snapshots/p5.48xlarge-dra (healthy, the driver's slice without taints) and
p5.48xlarge-xid79 (Xid 79 on GPU 4, 0000:97:00.0, then lost), each with the driver's slice changed
here in one place: a taint on one device, shaped as cmd/gpu-kubelet-plugin/device_health.go writes
it (key gpu.nvidia.com/xid with the Xid as value, NoSchedule or None; gpu-lost and unmonitored
without value). Every check runs, then `after_checks`, as the agent and `check` do.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.checks import dra_taints
from agent.checks.registry import CHECKS, after_checks, run_checks
from agent.core.device_scope import confined_scope, warn_scope
from agent.core.dra import DeviceTaint, DraDevice, DraSlices
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.gpu_verdicts import gpu_verdicts
from agent.engine.verdict import decide
from agent.probes.dra_slices import parse_slices_json
from agent.probes.snapshot import SLICES, SnapshotSource
from agent.probes.source import gather_facts
from agent.reporters.metrics import Metrics
from tests.conftest import cfg

ROOT = Path(__file__).parent.parent
SNAPS = ROOT / "examples" / "snapshots"
DRA_SNAP = SNAPS / "p5.48xlarge-dra"
CFG = cfg()
XID48 = {"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}
XID79 = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
XID13 = {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}
LOST = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}
UNMONITORED = {"key": "gpu.nvidia.com/unmonitored", "effect": "None"}
GPU2 = "00000000:75:00.0"
XID13_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:75:00): 13, pid=4242, "
    "name=python3, Graphics Exception: ESR 0x405840=0x1\n"
)


def slices(**taints: list[dict[str, str]]) -> dict[str, Any]:
    """The recorded slice with taints on some devices: slices(**{"gpu-2": [XID48]})."""
    doc = copy.deepcopy(json.loads((DRA_SNAP / SLICES).read_text()))
    for device in doc["items"][0]["spec"]["devices"]:
        if device["name"] in taints:
            device["taints"] = taints[device["name"]]
    return dict(doc)


@functools.cache
def recorded(snap: str) -> NodeFacts:
    return gather_facts(SnapshotSource(SNAPS / snap), CFG)


def judged(
    snap: str = "p5.48xlarge-dra", **taints: list[dict[str, str]]
) -> tuple[list[CheckResult], NodeFacts]:
    facts = replace(recorded(snap), dra=parse_slices_json(json.dumps(slices(**taints)), None))
    return after_checks(run_checks(CHECKS, facts, CFG)), facts


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def naming(results: list[CheckResult], pci: str) -> list[Finding]:
    return [f for r in results for f in r.findings if pci in f.key]


def entry(results: list[CheckResult], facts: NodeFacts, index: int) -> dict[str, Any]:
    verdict = decide(results)
    return next(
        e for e in gpu_verdicts(results, facts.gpus, verdict.status, dra=facts.dra) if e["index"] == index
    )


# ------------------------------------------------------------------------------- no taint: nothing new
@pytest.mark.parametrize("snap", ["p5.48xlarge-dra", "p5.48xlarge-healthy"])
def test_the_healthy_recordings_pass_and_name_no_driver_taint(snap: str) -> None:
    facts = recorded(snap)
    raw = run_checks(CHECKS, facts, CFG)
    results = after_checks(raw)
    assert results == raw
    assert decide(results).status is Status.PASS
    own = by_name(results)["gpu.driver-taints"]
    assert own.findings == ()
    if snap.endswith("dra"):
        assert (
            own.status is Status.PASS
            and own.message == "NVIDIA's DRA driver taints none of the 8 GPU(s) it publishes"
        )
    else:  # no driver here: no slice captured
        assert own.status is Status.SKIPPED
    entries = gpu_verdicts(results, facts.gpus, Status.PASS, dra=facts.dra)
    assert len(entries) == 8 and not any("driverTaints" in e for e in entries)


# -------------------------------------------------------------- the driver alone: a warning on that GPU
def test_a_fatal_xid_taint_on_a_gpu_our_checks_see_healthy_warns_on_that_gpu_naming_both() -> None:
    results, facts = judged(**{"gpu-2": [XID48]})
    (f,) = by_name(results)["gpu.driver-taints"].findings
    assert (f.rule, f.severity, f.key) == (
        "gpu.driver-taints.xid",
        Severity.MONITOR,
        f"gpu.driver-taints.xid/{GPU2}",
    )
    assert f.message == (
        "GPU 2 (0000:75:00.0): NVIDIA's DRA driver taints gpu-2 gpu.nvidia.com/xid=48:NoSchedule: Xid 48 "
        "(ROBUST_CHANNEL_GPU_ECC_DBE) reported by NVML, which it deems fatal; no new claim gets that "
        "device; our own checks find nothing wrong with it"
    )
    assert decide(results).status is Status.WARN
    assert naming(results, "0000:75:00.0") == [f]
    gpu2 = entry(results, facts, 2)
    assert (gpu2["status"], gpu2["dra"], gpu2["driverTaints"]) == (
        "warn",
        "gpu-2",
        ["gpu.nvidia.com/xid=48:NoSchedule"],
    )
    assert gpu2["findings"] == [f"gpu.driver-taints.xid/{GPU2}"]
    assert entry(results, facts, 3)["status"] == "pass"
    # confined to GPU 2: per-GPU isolation shows it on that device only
    scope = warn_scope(results, facts.gpus)
    assert scope is not None and (scope.node_wide, scope.gpus) == (False, (GPU2,))
    assert confined_scope(results, facts.gpus, Severity.RESET) is None


def test_gpu_lost_warns_and_says_when_our_xid_check_could_not_look() -> None:
    facts = replace(
        recorded("p5.48xlarge-dra"),
        dra=parse_slices_json(json.dumps(slices(**{"gpu-2": [LOST, XID48]})), None),
        kernel=ProbeError("kmsg.log", ProbeErrorKind.UNREADABLE, "not a kernel log"),
    )
    results = after_checks(run_checks(CHECKS, facts, CFG))
    found = {f.rule: f for f in by_name(results)["gpu.driver-taints"].findings}
    assert set(found) == {"gpu.driver-taints.xid", "gpu.driver-taints.gpu-lost"}
    assert found["gpu.driver-taints.gpu-lost"].message.endswith(
        "gpu-lost:NoSchedule: NVML told it the GPU is lost; no new claim gets that device; "
        "our own checks find nothing wrong with it"
    )
    assert (
        "(our xid check could not look: could not read kmsg.log: not a kernel log)"
        in found["gpu.driver-taints.xid"].message
    )


def test_the_drivers_gpu_lost_on_every_device_is_node_wide() -> None:
    """NVML's GPU_IS_LOST from the event wait taints every device of the node: more than half the
    GPUs at once is a node's fault (core/device_scope), as with our own findings."""
    results, facts = judged(**{f"gpu-{i}": [LOST] for i in range(8)})
    assert len(by_name(results)["gpu.driver-taints"].findings) == 8
    scope = warn_scope(results, facts.gpus)
    assert scope is not None and scope.node_wide and "8 of 8 GPUs" in scope.why


# --------------------------------------------------------------------- agreeing: one finding, both named
def test_a_drivers_xid_our_xid_check_also_found_is_one_finding_naming_both() -> None:
    raw_facts = recorded("p5.48xlarge-xid79")
    results, _ = judged("p5.48xlarge-xid79", **{"gpu-4": [XID79, LOST]})
    assert by_name(results)["gpu.driver-taints"].findings == ()
    assert by_name(results)["gpu.driver-taints"].status is Status.PASS
    (xid,) = [f for f in naming(results, "0000:97:00.0") if f.rule == "xid.79"]
    assert xid.message.endswith(
        "; NVIDIA's DRA driver agrees: it taints gpu-4 gpu.nvidia.com/xid=79:NoSchedule"
    )
    (lost,) = [f for f in naming(results, "0000:97:00.0") if f.rule.startswith("gpu.responsive")]
    assert lost.message.endswith(
        "; NVIDIA's DRA driver agrees: it taints gpu-4 gpu.nvidia.com/gpu-lost:NoSchedule"
    )
    # our findings keep their identity and severity; nothing else changes
    raw = {f.key: f for r in run_checks(CHECKS, raw_facts, CFG) for f in r.findings}
    assert (raw[xid.key].severity, raw[xid.key].latched) == (xid.severity, xid.latched)
    assert decide(results).severity == Severity.REBOOT


def test_an_xid_of_ours_below_the_drivers_on_the_same_gpu_does_not_hide_it(tmp_path: Path) -> None:
    """Our Xid 13 on GPU 2 (catalog: none, an application's fault) does not agree with the driver's
    fatal Xid 48 there: the warning stays, naming our finding; the driver's own Xid 13 joins ours."""
    snap = tmp_path / "snap"
    shutil.copytree(DRA_SNAP, snap, symlinks=True)
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID13_LINE)
    facts = gather_facts(SnapshotSource(snap), CFG)
    (ours,) = [f for r in run_checks(CHECKS, facts, CFG) for f in r.findings if f.rule == "xid.13"]
    assert ours.severity is Severity.NONE
    for taints, kept in (([XID48], "gpu.driver-taints.xid"), ([XID13], None)):
        dra = parse_slices_json(json.dumps(slices(**{"gpu-2": taints})), None)
        results = after_checks(run_checks(CHECKS, replace(facts, dra=dra), CFG))
        driver = by_name(results)["gpu.driver-taints"].findings
        assert [f.rule for f in driver] == ([kept] if kept else [])
        (xid,) = [f for f in naming(results, "0000:75:00.0") if f.rule == "xid.13"]
        assert xid.message.endswith("gpu.nvidia.com/xid=13:None") is (kept is None)
        if kept:
            assert decide(results).status is Status.WARN and driver[0].severity is Severity.MONITOR


# ---------------------------------------------------------------- said, not judged: unmonitored, non-fatal
def test_unmonitored_is_said_on_that_gpu_and_fails_or_warns_nothing() -> None:
    results, facts = judged(**{"gpu-5": [UNMONITORED]})
    own = by_name(results)["gpu.driver-taints"]
    (f,) = own.findings
    assert (f.rule, f.severity, own.status) == ("gpu.driver-taints.unmonitored", Severity.NONE, Status.PASS)
    assert "cannot health-check this GPU" in own.message and "our own checks still judge it" in own.message
    assert decide(results).status is Status.PASS
    gpu5 = entry(results, facts, 5)
    assert (gpu5["status"], gpu5["driverTaints"]) == ("pass", ["gpu.nvidia.com/unmonitored:None"])
    assert warn_scope(results, facts.gpus) is None


def test_a_non_fatal_xid_is_said_not_warned() -> None:
    results, facts = judged(**{"gpu-1": [XID13]})
    (f,) = by_name(results)["gpu.driver-taints"].findings
    assert (f.rule, f.severity) == ("gpu.driver-taints.xid-nonfatal", Severity.NONE)
    assert "Xid 13 (ROBUST_CHANNEL_GR_EXCEPTION) reported by NVML, which it deems non-fatal" in f.message
    assert decide(results).status is Status.PASS
    assert entry(results, facts, 1)["driverTaints"] == ["gpu.nvidia.com/xid=13:None"]


def test_a_severity_raised_in_config_fails_that_gpu_alone() -> None:
    strict = cfg({"severities": {"gpu.driver-taints.xid": "reset"}})
    facts = replace(
        recorded("p5.48xlarge-dra"), dra=parse_slices_json(json.dumps(slices(**{"gpu-2": [XID48]})), None)
    )
    results = after_checks(run_checks(CHECKS, facts, strict))
    assert decide(results).status is Status.FAIL
    scope = confined_scope(results, facts.gpus, Severity.RESET)
    assert scope is not None and (scope.node_wide, scope.gpus) == (False, (GPU2,))


def test_slices_that_cannot_be_read_skip_the_check_without_making_the_node_unknown() -> None:
    gap = ProbeError("ResourceSlices", ProbeErrorKind.UNAVAILABLE, "not listed yet")
    result = dra_taints.check_driver_taints(replace(recorded("p5.48xlarge-healthy"), dra=gap), CFG)
    assert result.status is Status.SKIPPED and "not listed yet" in result.message


# ----------------------------------------------------------------------------- MIG devices, the metric
def test_a_mig_devices_taint_is_named_with_its_device() -> None:
    pci = "00000000:53:00.0"
    whole = DraDevice("gpu-0", "n", "gpu", pci, "GPU-a")
    mig = DraDevice(
        "gpu-0-mig-1g10gb-19-0",
        "n",
        "mig",
        pci,
        "MIG-b",
        "GPU-a",
        taints=(DeviceTaint("gpu.nvidia.com/xid", "43", "None"),),
    )
    (gpu,) = DraSlices("n", (whole, mig)).gpus()
    assert gpu.taint_texts() == ["gpu.nvidia.com/xid=43:None on gpu-0-mig-1g10gb-19-0"]
    lost = DeviceTaint("gpu.nvidia.com/gpu-lost", "", "NoSchedule")
    (gpu,) = DraSlices("n", (replace(whole, taints=(lost,)), replace(mig, taints=(lost,)))).gpus()
    assert gpu.taint_texts() == ["gpu.nvidia.com/gpu-lost:NoSchedule"]


def test_the_metric_has_a_series_per_tainted_gpu_only_while_tainted() -> None:
    metrics = Metrics()
    odd = {"key": "example.com/other", "value": "x", "effect": "NoExecute"}
    dra = parse_slices_json(json.dumps(slices(**{"gpu-2": [XID48, odd], "gpu-5": [UNMONITORED]})), None)
    metrics.record_driver_taints(dra.taint_series())
    text = generate_latest(metrics.registry).decode()
    series = sorted(
        line for line in text.splitlines() if line.startswith("gpu_healthcheck_driver_device_taints{")
    )
    assert series == [
        'gpu_healthcheck_driver_device_taints{effect="NoExecute",gpu="gpu-2",key="other"} 1.0',
        'gpu_healthcheck_driver_device_taints{effect="NoSchedule",gpu="gpu-2",key="gpu.nvidia.com/xid"} 1.0',
        'gpu_healthcheck_driver_device_taints{effect="None",gpu="gpu-5",key="gpu.nvidia.com/unmonitored"} '
        "1.0",
    ]
    metrics.record_driver_taints([])
    assert "gpu_healthcheck_driver_device_taints{" not in generate_latest(metrics.registry).decode()


# ------------------------------------------------------------------------------ the engine, end to end
def test_the_engine_writes_the_drivers_taints_and_the_warning_into_the_results_annotation(
    tmp_path: Path,
) -> None:
    from agent.core.results_doc import decode_results

    snap = tmp_path / "snap"
    shutil.copytree(DRA_SNAP, snap, symlinks=True)
    (snap / SLICES).write_text(json.dumps(slices(**{"gpu-2": [XID48], "gpu-5": [UNMONITORED]})))
    eng = Engine(SnapshotSource(snap), CFG)
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.WARN
    doc = decode_results(marks.results_json)
    assert doc is not None
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert gpus[2]["driverTaints"] == ["gpu.nvidia.com/xid=48:NoSchedule"] and gpus[2]["status"] == "warn"
    assert gpus[5]["driverTaints"] == ["gpu.nvidia.com/unmonitored:None"] and gpus[5]["status"] == "pass"
    assert not any("driverTaints" in gpus[i] for i in (0, 1, 3, 4, 6, 7))
    assert marks.warn_scope is not None and marks.warn_scope.gpus == (GPU2,)
