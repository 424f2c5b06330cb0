"""Damaged and partial captures, judged end to end (`check --from-snapshot`).

A capture that is cut short, lost lines or contradicts itself is `unknown`, never a broken GPU; a
fault the capture states plainly is reported even when the rest is unreadable or the capture is a
partial view. The inputs are real recordings and variants derived from them by
tests/fixtures/derived/make_damaged_variants.py (see each file's .source.txt).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.cli.main import main

FIX = Path(__file__).parent / "fixtures"
Q, XML, TOPO, NVLINK = (FIX / d for d in ("nvidia-smi-q", "nvidia-smi-xml", "nvidia-smi-topo", "nvlink"))


def judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, Path | str], itype: str | None
) -> tuple[int, dict[str, dict[str, Any]]]:
    for name, content in files.items():
        text = content.read_text() if isinstance(content, Path) else content
        (tmp_path / name).write_text(text)
    args = ["check", "--json", "--from-snapshot", str(tmp_path)]
    if itype:
        args += ["--instance-type", itype]
    code = main(args)
    doc = json.loads(capsys.readouterr().out)
    return code, {c["name"]: c for c in doc["checks"]}


# --------------------------------------------------------------------------- damaged: never a fail


@pytest.mark.parametrize(
    "damaged",
    [
        "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full-DERIVED-cut-after-gpu3.txt",
        "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full-DERIVED-every-other-line.txt",
    ],
)
def test_a_topo_matrix_with_rows_missing_is_unknown_not_a_gpu_count_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damaged: str
) -> None:
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-topo-m.txt": TOPO / damaged}, "p5.48xlarge")
    assert checks["topology"]["status"] == "unknown", checks["topology"]
    assert "GPU0" in checks["topology"]["message"] or "row" in checks["topology"]["message"]
    assert code == 2


def test_an_empty_nvlink_listing_is_unknown_where_nvlink_is_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = judge(
        tmp_path,
        capsys,
        {"nvidia-smi-nvlink-s.txt": NVLINK / "gpud-a10-nvlink-status-empty.txt"},
        "p5.48xlarge",
    )
    assert checks["nvlink"]["status"] == "unknown", checks["nvlink"]
    assert code == 2


def test_an_nvlink_listing_cut_inside_a_gpu_block_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = NVLINK / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s-DERIVED-cut-in-link6.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-nvlink-s.txt": cut}, "p5.48xlarge")
    assert checks["nvlink"]["status"] == "unknown", checks["nvlink"]
    assert code == 2


def test_an_nvlink_listing_with_fewer_gpus_than_the_inventory_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One healthy H100 listed while nvidia-smi -q describes eight: the other seven were not looked at."""
    files: dict[str, Path | str] = {
        "nvidia-smi-q.txt": Q / "gpud-h100x8-535.183.01.txt",
        "nvidia-smi-nvlink-s.txt": NVLINK / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt",
    }
    _, checks = judge(tmp_path, capsys, files, "p5.48xlarge")
    assert checks["nvlink"]["status"] == "unknown", checks["nvlink"]
    assert "1 GPU" in checks["nvlink"]["message"] and "8" in checks["nvlink"]["message"]


@pytest.mark.parametrize(
    "xml",
    [
        "telegraf-a100-sxm4-80gb-mig-535.54.03.xml",  # real: attached_gpus 4, one <gpu> kept
        "telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-missing.xml",
    ],
)
def test_xml_announcing_more_gpus_than_it_describes_is_unknown_not_a_lost_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], xml: str
) -> None:
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.xml": XML / xml}, None)
    assert checks["gpu.responsive"]["status"] == "unknown", checks["gpu.responsive"]
    assert code == 2


def test_xml_missing_a_gpu_that_the_text_view_says_is_lost_is_a_lost_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvidia-smi stating a GPU is lost is a fault, not unknown."""
    files: dict[str, Path | str] = {
        "nvidia-smi-q.xml": XML / "telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-missing.xml",
        "nvidia-smi-q.txt": "Unable to determine the device handle for GPU0000:02:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU\n",
    }
    code, checks = judge(tmp_path, capsys, files, None)
    assert checks["gpu.responsive"]["status"] == "fail", checks["gpu.responsive"]
    assert checks["gpu.responsive"]["severity"] == "reboot"
    assert code == 1


# --------------------------------------------------------------------------- plain faults: never unknown


def test_a_d_ecc_row_remapper_view_reports_the_pending_remap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    view = Q / "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending-DERIVED-d-ecc-row-remapper.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": view}, None)
    assert checks["gpu.row-remap"]["status"] == "fail" and checks["gpu.row-remap"]["severity"] == "reset"
    assert code == 1


def test_an_excerpt_with_ecc_mode_unknown_error_still_reports_the_pending_remap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'Attached GPUs : 4' and one GPU block: the other three are unknown, the pending remap is a fault."""
    excerpt = (
        Q / "thamada-a100-sxm4-80gb-x4-555.42.02-dram-ce-353-remap-pending-"
        "DERIVED-d-ecc-row-remapper-gpu1-only-ecc-unknown-error.txt"
    )
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": excerpt}, "p4d.24xlarge")
    remap = checks["gpu.row-remap"]
    assert remap["status"] == "fail" and remap["severity"] == "reset", remap
    assert "0000:9e:00.0" in remap["message"]
    assert checks["gpu.count"]["status"] == "unknown", checks["gpu.count"]
    assert code == 1


def test_an_excerpt_with_an_uncorrectable_sram_error_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    excerpt = Q / "DERIVED-h100x8-ecc-sram-uncorrectable-d-ecc-gpu2-only.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": excerpt}, "p5.48xlarge")
    assert checks["gpu.ecc"]["status"] == "fail" and checks["gpu.ecc"]["severity"] == "isolate"
    assert checks["gpu.count"]["status"] == "unknown"
    assert code == 1


def test_a_capture_cut_after_a_faulty_gpu_still_reports_the_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = Q / "DERIVED-h100x8-row-remap-failure-cut-in-gpu3.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": cut}, "p5.48xlarge")
    remap = checks["gpu.row-remap"]
    assert remap["status"] == "fail" and remap["severity"] == "isolate", remap
    assert remap["entities"] == ["GPU 2 (0000:75:00.0)"]
    assert checks["gpu.count"]["status"] == "unknown"
    assert checks["gpu.ecc"]["status"] == "unknown"
    assert code == 1


def test_partly_inactive_nvlinks_fail_when_the_instance_type_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = NVLINK / "nvidia-smi-nvlink-s_h100_driver590-DERIVED-link5-inactive.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-nvlink-s.txt": listing}, None)
    assert checks["nvlink"]["status"] == "fail" and checks["nvlink"]["severity"] == "reset"
    assert "inactive: 5" in checks["nvlink"]["message"]
    assert code == 1


def test_healthy_nvlinks_pass_when_the_instance_type_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = NVLINK / "nvidia-smi-nvlink-s_h100_driver590.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-nvlink-s.txt": listing}, None)
    assert checks["nvlink"]["status"] == "pass", checks["nvlink"]
    assert code == 0


# --------------------------------------------------------------------------- check --explain

EVIDENCE_LINE = re.compile(r"^      (?P<file>[\w.-]+):(?P<line>\d+): (?P<text>.*)$", re.M)


def explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, Path | str], *args: str
) -> str:
    for name, content in files.items():
        (tmp_path / name).write_text(content.read_text() if isinstance(content, Path) else content)
    code = main(["check", "--from-snapshot", str(tmp_path), "--explain", *args])
    assert code in (0, 1, 2)
    out = capsys.readouterr().out
    return out[out.index("\n\n") + 2 :]  # after the table


def assert_evidence_is_in_the_files(tmp_path: Path, text: str) -> list[re.Match[str]]:
    """Every evidence line names a snapshot file, a line number and that line's text, word for word."""
    found = list(EVIDENCE_LINE.finditer(text))
    for m in found:
        lines = (tmp_path / m["file"]).read_text().splitlines()
        assert lines[int(m["line"]) - 1].strip() == m["text"], m.group(0)
    return found


def test_explain_shows_the_line_each_finding_rests_on_and_why_a_check_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files: dict[str, Path | str] = {
        "nvidia-smi-q.txt": Q / "DERIVED-h100x8-row-remap-failure-cut-in-gpu3.txt",
        "nvidia-smi-nvlink-s.txt": NVLINK / "nvidia-smi-nvlink-s_h100_driver590-DERIVED-link5-inactive.txt",
        "nvidia-smi-topo-m.txt": TOPO
        / "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full-DERIVED-x-off-diagonal.txt",
    }
    text = explain(tmp_path, capsys, files, "--instance-type", "p5.48xlarge")
    found = assert_evidence_is_in_the_files(tmp_path, text)
    shown = {(m["file"], m["text"].split(":")[0].strip()) for m in found}
    assert ("nvidia-smi-q.txt", "Remapping Failure Occurred") in shown
    assert ("nvidia-smi-nvlink-s.txt", "Link 5") in shown
    assert any(f == "nvidia-smi-topo-m.txt" and t.startswith("GPU2") for f, t in shown)
    remap = text[text.index("gpu.row-remap: fail (isolate)") :]
    assert "could not look: could not read all of nvidia-smi-q.txt: cut short inside line" in remap
    assert "gpu.count: unknown" in text and "'Attached GPUs : 8' but only 4 GPU block(s)" in text


def test_explain_points_into_the_xml_and_at_the_lost_gpu_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files: dict[str, Path | str] = {
        "nvidia-smi-q.xml": XML / "telegraf-a10g-515.105.01-DERIVED-volatile-dram-uncorrectable.xml",
    }
    found = assert_evidence_is_in_the_files(tmp_path, explain(tmp_path, capsys, files))
    assert [m["text"] for m in found if m["file"] == "nvidia-smi-q.xml"][:1] == [
        "<dram_uncorrectable>2</dram_uncorrectable>"
    ]
    lost = tmp_path / "lost"
    lost.mkdir()
    q = Q / "gpud-h100x8-535.183.01-DERIVED-gpu3-lost.txt"
    found = assert_evidence_is_in_the_files(lost, explain(lost, capsys, {"nvidia-smi-q.txt": q}))
    assert any(m["text"].startswith("Unable to determine the device handle") for m in found)


def test_explain_with_json_keeps_stdout_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nvidia-smi-nvlink-s.txt").write_text(
        (NVLINK / "nvidia-smi-nvlink-s_h100_driver590-DERIVED-link5-inactive.txt").read_text()
    )
    code = main(["check", "--from-snapshot", str(tmp_path), "--explain", "--json"])
    captured = capsys.readouterr()
    assert code == 1 and json.loads(captured.out)["status"] == "fail"
    assert "nvidia-smi-nvlink-s.txt:7: Link 5: <inactive>" in captured.err


# --------------------------------------------------------------------------- the real H100 capture

H100 = "h100-capture-580.159.04"


def test_the_real_h100_capture_passes_and_its_empty_nvlink_listing_is_no_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded today on one H100 (no NVLink peers): nvlink -s prints nothing and exits 0."""
    files: dict[str, Path | str] = {
        "nvidia-smi-q.xml": XML / f"{H100}-qx.xml",
        "nvidia-smi-q.txt": Q / f"{H100}-q.txt",
        "nvidia-smi-topo-m.txt": TOPO / f"{H100}-topo-m.txt",
        "nvidia-smi-nvlink-s.txt": NVLINK / f"{H100}-nvlink-s-empty.txt",
    }
    code, checks = judge(tmp_path, capsys, files, None)
    assert code == 0, {n: c["message"] for n, c in checks.items() if c["status"] != "pass"}
    assert checks["nvlink"]["status"] == "skipped"
    assert checks["gpu.row-remap"]["status"] == "pass" and checks["gpu.ecc"]["status"] == "pass"


def test_the_real_h100_d_view_reports_a_pending_remap_next_to_an_unknown_ecc_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy = Q / f"{H100}-q-d-ecc-row-remapper.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": healthy}, None)
    assert code == 0 and checks["gpu.row-remap"]["status"] == "pass"
    pending = Q / f"{H100}-q-d-ecc-row-remapper-DERIVED-ecc-unknown-error-remap-pending.txt"
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": pending}, None)
    assert checks["gpu.row-remap"]["status"] == "fail" and checks["gpu.row-remap"]["severity"] == "reset"
    assert code == 1


def test_an_unknown_check_with_warnings_says_first_why_it_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cut H100x8 capture: GPU 2 was recorded with HW Power Brake Slowdown active (monitor)."""
    cut = Q / "DERIVED-h100x8-row-remap-failure-cut-in-gpu3.txt"
    _, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": cut}, "p5.48xlarge")
    throttle = checks["gpu.throttle"]
    assert throttle["status"] == "unknown" and throttle["severity"] == "monitor"
    assert throttle["message"].startswith("could not read all of nvidia-smi-q.txt: cut short")
    assert "HW power brake slowdown active" in throttle["message"]


def test_an_excerpt_with_a_retired_page_pending_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real -q -d PAGE_RETIREMENT view cut down in this test to its header and the block of GPU
    00000002:00:00.0 (Double Bit ECC 61, Pending Page Blacklist Yes): 'Attached GPUs : 8' stays."""
    text = (Q / "aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED.txt").read_text()
    start, end = text.index("GPU 00000002:00:00.0"), text.index("GPU 00000003:00:00.0")
    excerpt = text[: text.index("GPU 00000001:00:00.0")] + text[start:end]
    code, checks = judge(tmp_path, capsys, {"nvidia-smi-q.txt": excerpt}, None)
    pages = checks["gpu.retired-pages"]
    assert pages["status"] == "fail" and pages["severity"] == "isolate", pages
    assert "page retirement pending" in pages["message"] and "61 page(s)" in pages["message"]
    assert checks["gpu.responsive"]["status"] == "unknown"
    assert code == 1
