"""`sdc`: the SDC probe's reports (tests/fixtures/sdc-reports: written by the probe itself on its CPU
stand-in with a one-bit fault injected, devices named as the real 8x H100 listing's GPUs) judged
by the check, and where its findings act: one GPU, never the node."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from agent.checks.sdc import MISMATCH_ONCE, MISMATCH_REPEATED, NAME, check_sdc
from agent.core.device_scope import confined_scope, warn_scope
from agent.core.facts import NodeFacts
from agent.core.probed import ProbeError
from agent.core.sdc_report import SdcReport, judge, parse_sdc_report
from agent.core.severity import Severity, Status
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.snapshot import SnapshotSource
from agent.probes.tool_outputs import SDC
from sdcprobe.backend import CpuBackend
from sdcprobe.probe import Plan, run_probe
from tests.conftest import cfg

FIX = Path(__file__).parent / "fixtures"
INV = parse_nvsmi_text((FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt").read_text(encoding="utf-8"))
CFG = cfg()


def report(kind: str) -> SdcReport:
    return parse_sdc_report((FIX / "sdc-reports" / f"DERIVED-h100x8-{kind}.json").read_text())


def run(kind: str) -> object:
    return check_sdc(NodeFacts(gpus=INV, sdc=report(kind)), CFG)


def test_healthy_gpus_agree_and_the_check_passes() -> None:
    res = run("healthy")
    assert res.status is Status.PASS and not res.findings
    run_of = "in the SDC probe run of 2026-11-29T04:00:00Z"
    assert res.note == f"8 GPUs agreed bit for bit on 10 kernels and precisions {run_of}"


def test_one_mismatch_warns_on_that_gpu_alone() -> None:
    res = run("once")
    assert res.status is Status.WARN
    [f] = res.findings
    assert f.rule == MISMATCH_ONCE.name and f.severity is Severity.MONITOR
    assert f.entities == (INV.gpus[5].label,)
    assert f.message == (
        f"{INV.gpus[5].label}: its output differed bit for bit from the majority of its 7 siblings on "
        "gemm/fp32 in the SDC probe run of 2026-11-29T04:00:00Z, once: the immediate re-run with the "
        "same inputs agreed"
    )
    scope = warn_scope([res], INV)  # the None-effect device taint's scope: that GPU only
    assert scope is not None and not scope.node_wide and scope.gpus == (INV.gpus[5].pci_bus_id,)


def test_a_repeated_mismatch_fails_that_gpu_alone() -> None:
    res = run("repeated")
    assert res.status is Status.FAIL
    [f] = res.findings
    assert f.rule == MISMATCH_REPEATED.name and f.severity is Severity.ISOLATE
    assert "and again on the immediate re-run with the same inputs" in f.message
    scope = confined_scope([res], INV, Severity.RESET)  # isolated alone, never the node
    assert scope is not None and not scope.node_wide and scope.gpus == (INV.gpus[5].pci_bus_id,)


def test_two_gpus_corrupted_differently_are_each_named() -> None:
    res = run("two-odd")
    by_rule = {f.rule: f.entities for f in res.findings}
    assert by_rule == {MISMATCH_REPEATED.name: (INV.gpus[2].label,), MISMATCH_ONCE.name: (INV.gpus[6].label,)}
    assert res.status is Status.FAIL


def test_two_gpus_cannot_name_the_odd_one_unknown_never_fail() -> None:
    res = run("pair")
    assert res.status is Status.UNKNOWN and not res.findings
    assert res.unknown == (
        "gemm/fp32 disagreed in the SDC probe run of 2026-11-29T04:00:00Z with no majority of more "
        "than half of at least 3 GPUs: no GPU can be named"
    )


def test_a_gpu_that_could_not_run_is_unknown_for_it() -> None:
    res = run("error")
    assert res.status is Status.UNKNOWN and not res.findings
    assert res.unknown == (
        f"{INV.gpus[4].label} could not run the SDC probe run of 2026-11-29T04:00:00Z: gemm/bf16: "
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_a_device_nvml_does_not_show_is_unknown_not_a_node_fault() -> None:
    res = check_sdc(NodeFacts(gpus=replace(INV, gpus=INV.gpus[:5]), sdc=report("repeated")), CFG)
    assert res.status is Status.UNKNOWN and not res.findings
    assert res.unknown is not None and res.unknown.startswith("CUDA device 5 (00000000:")


def test_the_verdict_is_the_digests_not_the_probes_own_claim() -> None:
    doc = json.loads((FIX / "sdc-reports" / "DERIVED-h100x8-healthy.json").read_text())
    doc["attempts"][0]["differed"] = {"3": ["gemm/fp64"]}  # a claim the digests do not bear out
    assert judge(parse_sdc_report(json.dumps(doc))).once == {}


def test_one_gpu_is_skipped_and_no_report_is_skipped() -> None:
    one = run_probe(CpuBackend(count=1), Plan(size=4))
    res = check_sdc(NodeFacts(gpus=INV, sdc=parse_sdc_report(json.dumps(one))), CFG)
    assert res.skipped == "one GPU: no sibling to compare its output with"
    assert check_sdc(NodeFacts(gpus=INV), CFG).skipped == "sdc-probe.json not captured"


def test_the_message_is_stable_across_reads() -> None:
    assert run("once") == run("once")


def test_a_snapshot_reads_the_report_and_a_foreign_one_is_unknown(tmp_path: Path) -> None:
    shutil.copy(FIX / "sdc-reports" / "DERIVED-h100x8-repeated.json", tmp_path / SDC.file)
    got = SnapshotSource(tmp_path).read(SDC)
    assert isinstance(got, SdcReport) and got == report("repeated")
    (tmp_path / SDC.file).write_text(json.dumps({"version": 99}))
    bad = SnapshotSource(tmp_path).read(SDC)
    assert isinstance(bad, ProbeError) and "version 1 (version 99)" in bad.message
    res = check_sdc(NodeFacts(gpus=INV, sdc=bad), CFG)
    assert res.status is Status.UNKNOWN


@pytest.mark.parametrize("kind", ["healthy", "once", "repeated", "two-odd", "pair", "error"])
def test_the_fixtures_are_what_the_probe_writes_today(kind: str) -> None:
    """The fixtures' digests are the CPU stand-in's, as run now (a change of the probe shows here)."""
    doc = json.loads((FIX / "sdc-reports" / f"DERIVED-h100x8-{kind}.json").read_text())
    if kind == "error":
        return
    flips = {
        "healthy": {},
        "once": {5: {1}},
        "repeated": {5: {1, 2}},
        "two-odd": {2: {1, 2}, 6: {1}},
        "pair": {1: {1}},
    }
    fresh = run_probe(CpuBackend(count=len(doc["devices"]), flips=flips[kind]), Plan(size=8))
    assert [a["digests"] for a in fresh["attempts"]] == [a["digests"] for a in doc["attempts"]]


def test_the_check_is_named_as_its_rules() -> None:
    assert MISMATCH_ONCE.name.startswith(NAME + ".") and MISMATCH_REPEATED.name.startswith(NAME + ".")
    assert MISMATCH_ONCE.max_severity is Severity.MONITOR
