"""parse_topo on every recorded `nvidia-smi topo -m` output, derived faults, truncation and noise."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.probed import ParseError
from agent.core.topo import TopoMatrix
from agent.probes.topo import parse_topo

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-topo"
FULL = "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full.txt"
PARTIAL = "issue-nccl-1453-h100x8-9nic-topo-m-tabs-PARTIAL.txt"
ONE_GPU = (
    "nvgpuexp-h100-80gb-hbm3-590.48.01-topo-m.txt",
    "nvgpuexp-h200-590.48.01-topo-m.txt",
    "nvgpuexp-l40s-595.80-topo-m.txt",
    "nvidia-smi-topo-m_h100-1gpu_driver590.txt",
)


def load(name: str) -> TopoMatrix:
    return parse_topo((FIX / name).read_text(encoding="utf-8"))


def test_full_8xh100_space_padded() -> None:
    topo = load(FULL)
    assert topo.gpu_rows == tuple(f"GPU{i}" for i in range(8))
    assert topo.nic_rows == tuple(f"NIC{i}" for i in range(8))
    assert topo.columns[:8] == topo.gpu_rows and topo.columns[8:] == topo.nic_rows
    for i in range(8):
        row = topo.rows[f"GPU{i}"]
        assert row[f"GPU{i}"] == "X"
        assert all(row[f"GPU{j}"] == "NV18" for j in range(8) if j != i)
        assert row[f"NIC{i}"] == "PIX"
    assert topo.rows["NIC7"]["NIC7"] == "X"
    assert topo.rows["NIC0"]["GPU4"] == "SYS"
    assert topo.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(8)}
    assert topo.cpu_affinity["GPU0"] == "0-47,96-143"
    assert topo.cpu_affinity["GPU7"] == "48-95,144-191"
    assert topo.numa_affinity["GPU3"] == "0" and topo.numa_affinity["GPU4"] == "1"
    assert "NIC0" not in topo.cpu_affinity


def test_partial_tabs_file_is_unreadable_and_keeps_its_intact_rows() -> None:
    """The poster left out the NIC6-8 rows: rows and columns disagree, so the matrix is unreadable;
    the rows it shows are kept as evidence."""
    with pytest.raises(ParseError, match="names NIC6, NIC7, NIC8 but the matrix has no row") as caught:
        load(PARTIAL)
    topo = caught.value.partial
    assert isinstance(topo, TopoMatrix)
    assert len(topo.gpu_rows) == 8
    assert topo.nic_rows == tuple(f"NIC{i}" for i in range(6))  # NIC6-8 rows were beyond the excerpt
    assert len(topo.columns) == 17  # the header still names all 9 NICs
    assert topo.rows["GPU0"]["NIC8"] == "PIX"
    assert topo.rows["GPU7"]["NIC1"] == "PIX"
    assert topo.rows["GPU1"]["GPU0"] == "NV18"
    assert topo.nic_names == {}  # the NIC Legend was not captured
    assert topo.cpu_affinity["GPU4"] == "80-159"
    assert topo.numa_affinity["GPU0"] == "0"


@pytest.mark.parametrize("name", ONE_GPU)
def test_single_gpu_with_ansi_escapes(name: str) -> None:
    text = (FIX / name).read_text(encoding="utf-8")
    assert "\x1b[4m" in text  # the real header carries underline escapes
    topo = parse_topo(text)
    assert topo.columns == ("GPU0",)
    assert topo.rows == {"GPU0": {"GPU0": "X"}}
    assert topo.numa_affinity == {"GPU0": "0"}
    assert topo.cpu_affinity["GPU0"] in ("0-19", "0-23", "0-7")


def test_derived_x_off_diagonal() -> None:
    topo = load(FULL.replace(".txt", "-DERIVED-x-off-diagonal.txt"))
    assert topo.rows["GPU2"]["GPU5"] == "X"
    assert topo.rows["GPU5"]["GPU2"] == "NV18"


def test_derived_phb_pair() -> None:
    topo = load(FULL.replace(".txt", "-DERIVED-gpu3-gpu6-phb.txt"))
    assert topo.rows["GPU3"]["GPU6"] == "PHB" and topo.rows["GPU6"]["GPU3"] == "PHB"


def test_columns_named_after_rdma_devices_become_nics() -> None:
    """Newer drivers (per NVSentinel's parser tests) may name columns mlx5_N directly."""
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tmlx5_1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV18\tPIX\tSYS\t0-47\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tSYS\tPIX\t48-95\t1\t\tN/A\n"
        "mlx5_0\tPIX\tSYS\t X \tSYS\n"
        "mlx5_1\tSYS\tPIX\tSYS\t X \n"
    )
    topo = parse_topo(text)
    assert topo.columns == ("GPU0", "GPU1", "NIC0", "NIC1")
    assert topo.nic_rows == ("NIC0", "NIC1")
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.rows["GPU1"]["NIC1"] == "PIX"


def test_truncated_mid_row_is_a_parse_error() -> None:
    text = (FIX / FULL).read_text(encoding="utf-8")
    cut = text.index("\nGPU3") + 30  # inside the GPU3 row
    with pytest.raises(ParseError, match="GPU3"):
        parse_topo(text[:cut])


def test_truncated_after_header_is_a_parse_error() -> None:
    text = (FIX / FULL).read_text(encoding="utf-8")
    with pytest.raises(ParseError):
        parse_topo(text.splitlines()[0] + "\n")


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "nvidia-smi: command not found\n", "NVIDIA-SMI has failed because it couldn't communicate"],
)
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_topo(text)


def test_duplicate_row_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="twice"):
        parse_topo("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU0\t X \tNV4\n")


@settings(max_examples=300)
@given(st.text())
def test_random_text_never_raises_other_errors(text: str) -> None:
    try:
        result = parse_topo(text)
    except ParseError:
        return
    assert isinstance(result, TopoMatrix) and result.gpu_rows


@settings(max_examples=200)
@given(st.binary())
def test_random_bytes_never_raise_other_errors(data: bytes) -> None:
    try:
        result = parse_topo(data.decode("utf-8", errors="replace"))
    except ParseError:
        return
    assert isinstance(result, TopoMatrix)


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=3300))
def test_every_prefix_of_the_real_file_parses_or_fails_cleanly(cut: int) -> None:
    text = (FIX / FULL).read_text(encoding="utf-8")[:cut]
    try:
        topo = parse_topo(text)
    except ParseError:
        return
    assert all(len(cells) == len(topo.columns) for cells in topo.rows.values())


@pytest.mark.parametrize(
    ("derived", "why"),
    [
        ("-DERIVED-cut-after-gpu3.txt", "names GPU4, GPU5, GPU6, GPU7 ... but the matrix has no row"),
        ("-DERIVED-every-other-line.txt", "names GPU0, GPU2, GPU4, GPU6 ... but the matrix has no row"),
    ],
)
def test_a_matrix_with_rows_lost_is_unreadable(derived: str, why: str) -> None:
    with pytest.raises(ParseError, match=why) as caught:
        load(FULL.replace(".txt", derived))
    partial = caught.value.partial
    assert isinstance(partial, TopoMatrix) and len(partial.columns) == 16


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ("GPU1\tNV18\t X \tN\n", "unexpected cell 'N'"),  # a cell cut short
        ("GPU1\tNV18\tNV18\tNV4\n", "does not read X towards itself"),
    ],
)
def test_a_row_that_contradicts_the_matrix_is_unreadable(row: str, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_topo("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tNV4\n" + row + "GPU2\tNV4\tNV4\t X \n")


def test_a_last_line_is_read_without_its_newline_only_when_whole() -> None:
    """Issue 23: a whole last line is evidence; the last NIC legend name may be cut, so it is not read."""
    text = (FIX / FULL).read_text(encoding="utf-8")
    whole, kept = parse_topo(text), parse_topo(text.rstrip("\n"))
    assert kept.rows == whole.rows and kept.nic_names == {
        k: v for k, v in whole.nic_names.items() if k != "NIC7"
    }
    matrix = text[: text.index("\n\nLegend")]  # the matrix alone, its NIC7 row last
    assert parse_topo(matrix).rows == whole.rows  # "NIC7 ... X" is whole
    with pytest.raises(ParseError, match="cut short inside line 17"):
        parse_topo(matrix.rstrip(" X") + " NO")  # a cell cut inside ("NO" of "NODE")


def test_a_matrix_quoted_inside_another_text_is_not_this_nodes() -> None:
    text = (FIX / FULL).read_text(encoding="utf-8")
    with pytest.raises(ParseError, match="before the header"):
        parse_topo("# $ nvidia-smi topo -m\n" + text)
    warned = "WARNING: infoROM is corrupted at gpu 0000:53:00.0\n" + text
    assert len(parse_topo(warned).gpu_rows) == 8
