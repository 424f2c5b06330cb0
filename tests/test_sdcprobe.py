"""The SDC probe's ladder on the CPU stand-in (sdcprobe/backend.CpuBackend): the fault is one bit of
one device's output, flipped at the lowest layer; everything above it is the real probe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sdcprobe import REPORT_VERSION
from sdcprobe.backend import CpuBackend, parse_flips
from sdcprobe.probe import Plan, differed, run_probe

ROOT = Path(__file__).resolve().parent.parent
PLAN = Plan(size=8)


def test_healthy_gpus_agree_bit_for_bit_and_run_once() -> None:
    report = run_probe(CpuBackend(count=8), PLAN)
    assert report["version"] == REPORT_VERSION
    [one] = report["attempts"]
    assert one["differed"] == {} and one["split"] == [] and one["errors"] == {}
    digests = one["digests"]
    assert len({json.dumps(d, sort_keys=True) for d in digests.values()}) == 1
    assert sorted(digests["0"]) == sorted(
        f"{k}/{p}" for p in ("fp64", "fp32", "tf32", "bf16", "fp16") for k in ("gemm", "reduce")
    )
    # every precision is its own computation: no two precisions give one digest
    assert len(set(digests["0"].values())) == len(digests["0"])


def test_repeated_runs_agree_bit_for_bit() -> None:
    a, b = run_probe(CpuBackend(count=4), PLAN), run_probe(CpuBackend(count=4), PLAN)
    assert a["attempts"][0]["digests"] == b["attempts"][0]["digests"]


def test_one_corruption_reruns_at_once_and_the_rerun_agrees() -> None:
    report = run_probe(CpuBackend(count=8, flips={3: {1}}), PLAN)
    first, second = report["attempts"]
    assert first["differed"] == {"3": ["gemm/fp32"]}
    assert second["attempt"] == 2 and second["differed"] == {} and second["split"] == []
    assert second["digests"]["3"] == first["digests"]["0"]


def test_a_repeated_corruption_differs_on_both_attempts() -> None:
    report = run_probe(CpuBackend(count=8, flips={3: {1, 2}}), PLAN)
    assert [a["differed"] for a in report["attempts"]] == [{"3": ["gemm/fp32"]}] * 2


def test_two_gpus_corrupted_differently_are_each_named() -> None:
    backend = CpuBackend(count=8, flips={2: {1, 2}, 6: {1}}, flip_byte=5)
    report = run_probe(backend, PLAN)
    first, second = report["attempts"]
    assert first["differed"] == {"2": ["gemm/fp32"], "6": ["gemm/fp32"]}
    assert second["differed"] == {"2": ["gemm/fp32"]}


def test_two_gpus_cannot_name_the_odd_one() -> None:
    report = run_probe(CpuBackend(count=2, flips={1: {1}}), PLAN)
    first = report["attempts"][0]
    assert first["differed"] == {} and first["split"] == ["gemm/fp32"]
    assert len(report["attempts"]) == 2  # a disagreement is re-run all the same


def test_a_device_that_errors_is_left_out_not_a_mismatch() -> None:
    class Broken(CpuBackend):
        def compute(self, device, kernel, precision, inputs):  # type: ignore[no-untyped-def]
            if device.index == 4 and precision == "bf16":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().compute(device, kernel, precision, inputs)

    report = run_probe(Broken(count=8), PLAN)
    [one] = report["attempts"]
    assert one["errors"] == {
        "4": "gemm/bf16: RuntimeError: CUDA error: an illegal memory access was encountered"
    }
    assert "gemm/bf16" not in one["digests"]["4"] and "gemm/fp16" in one["digests"]["3"]
    assert one["differed"] == {}


def test_differed_needs_a_majority() -> None:
    assert differed({"0": {"k": "a"}, "1": {"k": "b"}, "2": {"k": "c"}}) == ({}, ["k"])
    assert differed({"0": {"k": "a"}, "1": {"k": "a"}, "2": {"k": "b"}, "3": {"k": "b"}}) == ({}, ["k"])
    assert differed({"0": {"k": "a"}, "1": {"k": "a"}, "2": {"k": "b"}}) == ({"2": ["k"]}, [])


def test_the_command_line_runs_the_stand_in(tmp_path: Path) -> None:
    assert parse_flips("3:1,2;5:1") == {3: {1, 2}, 5: {1}}
    out = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "sdcprobe",
        "run",
        "--backend",
        "cpu",
        "--size",
        "8",
        "--inject",
        "1:1,2",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=60)
    report = json.loads(out.read_text())
    assert [a["differed"] for a in report["attempts"]] == [{"1": ["gemm/fp32"]}] * 2
    assert [d["pciBusId"] for d in report["devices"]][:2] == ["00000000:18:00.0", "00000000:19:00.0"]
