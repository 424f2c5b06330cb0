"""parse_nvlink on every recorded `nvidia-smi nvlink -s` output, plus shapes and noise."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.nvlink import NvlinkReport
from agent.core.probed import ParseError
from agent.probes.nvlink import parse_nvlink

FIX = Path(__file__).parent / "fixtures" / "nvlink"


def load(name: str) -> NvlinkReport:
    return parse_nvlink((FIX / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("name", "index", "links", "speed"),
    [
        ("awsome-p4de-a100-gpu0-nvlink-s.txt", 0, 12, 25.0),
        ("aznhc-azure-a100-gpu7-nvlink-status-good.txt", 7, 12, 25.0),
        ("nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt", 0, 18, 26.562),
        ("nvgpuexp-h200-590.48.01-nvlink-s.txt", 0, 18, 26.562),
        ("nvidia-smi-nvlink-s_h100_driver590.txt", 0, 18, 26.562),
    ],
)
def test_healthy(name: str, index: int, links: int, speed: float) -> None:
    report = load(name)
    assert report.supported
    (gpu,) = report.gpus
    assert gpu.index == index
    assert gpu.active_links == links and gpu.inactive_links == 0
    assert sorted(gpu.links) == list(range(links))
    assert set(gpu.links.values()) == {speed}
    assert not gpu.all_inactive
    assert gpu.uuid is not None and gpu.uuid.startswith("GPU-")
    assert gpu.name is not None and gpu.name.startswith("NVIDIA ")


def test_p4de_header_fields() -> None:
    (gpu,) = load("awsome-p4de-a100-gpu0-nvlink-s.txt").gpus
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-370ec676-e407-3115-836a-8ebcb3c4f62a"


def test_azure_gpu6_all_inactive() -> None:
    report = load("aznhc-azure-a100-gpu6-nvlink-all-inactive.txt")
    assert report.supported
    (gpu,) = report.gpus
    assert gpu.index == 6 and gpu.all_inactive and gpu.links == {}
    assert gpu.uuid == "GPU-9667d95e-6d22-0c22-1f57-c481f13e7c44"


def test_l40s_not_supported() -> None:
    report = load("nvgpuexp-l40s-595.80-nvlink-s.txt")
    assert report.supported is False
    assert [g.index for g in report.gpus] == [0]
    assert report.gpus[0].links == {}


def test_a10_empty_output_says_nothing() -> None:
    """No statement either way: the check skips it where no NVLink is expected, and calls it unknown
    where NVLink is expected (a capture that lost everything looks the same)."""
    assert (FIX / "gpud-a10-nvlink-status-empty.txt").read_bytes() == b""
    report = load("gpud-a10-nvlink-status-empty.txt")
    assert report == NvlinkReport(gpus=(), supported=None)


def test_inactive_links_and_two_gpus() -> None:
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n"
        "\t Link 0: 26.562 GB/s\n"
        "\t Link 1: <inactive>\n"
        "\t Link 2: 26.562 GB/s\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)\n"
        "NVML: Unable to retrieve NVLink information as all links are inactive\n"
    )
    report = parse_nvlink(text)
    g0, g1 = report.gpus
    assert g0.links == {0: 26.562, 1: None, 2: 26.562}
    assert (g0.active_links, g0.inactive_links) == (2, 1)
    assert g1.index == 1 and g1.all_inactive and g1.uuid == "GPU-bbbb"
    assert report.supported


def test_mig_mode_is_unavailable_not_a_link_fault() -> None:
    """Real 590 MIG capture: 'Nvlink queries are not supported for Devices in MIG mode'."""
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
        "Nvlink queries are not supported for Devices in MIG mode\n"
    )
    report = parse_nvlink(text)
    assert report.supported
    (gpu,) = report.gpus
    assert gpu.unavailable is not None and "MIG" in gpu.unavailable
    assert not gpu.all_inactive


@pytest.mark.parametrize(
    "text",
    [
        "Failed to initialize NVML: Driver/library version mismatch\n",
        "\t Link 0: 25 GB/s\n",  # a link before any GPU header (truncated head)
        "GPU 0: NVIDIA A100 (UUID: GPU-1)\nsomething unexpected\n",
        "random words\n",
    ],
)
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_nvlink(text)


def test_listing_cut_at_a_line_end_keeps_what_was_read() -> None:
    text = (FIX / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt").read_text(encoding="utf-8")
    cut = "\n".join(text.splitlines()[:7]) + "\n"
    (gpu,) = parse_nvlink(cut).gpus
    assert gpu.active_links == 6  # the check calls fewer links than the profile's unknown, not a fault


def test_listing_cut_inside_a_line_is_a_parse_error() -> None:
    cut = (FIX / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s-DERIVED-cut-in-link6.txt").read_text()
    with pytest.raises(ParseError, match="cut short inside line 8") as caught:
        parse_nvlink(cut)
    assert caught.value.partial is None  # its only GPU is the one cut


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "GPU 0: H100 (UUID: GPU-a)\n\t Link 0: 26.562 GB/s\n\t Link 2: 26.562 GB/s\n",
            "Link 2 where Link 1",
        ),
        (
            "GPU 0: H100 (UUID: GPU-a)\n\t Link 0: 26.562 GB/s\n\t Link 0: 26.562 GB/s\n",
            "Link 0 where Link 1",
        ),
        ("GPU 0: H100 (UUID: GPU-a)\n\t Link 0: <inact\n", "neither a speed nor <inactive>"),
        (
            "GPU 1: H100 (UUID: GPU-b)\n\t Link 0: 26.562 GB/s\n"
            "GPU 0: H100 (UUID: GPU-a)\n\t Link 0: 26.562 GB/s\n",
            "GPU 0 listed after GPU 1",
        ),
    ],
)
def test_a_listing_that_contradicts_itself_is_a_parse_error(text: str, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_nvlink(text)


def test_a_gpu_listing_fewer_links_than_the_others_is_cut_and_the_others_are_kept() -> None:
    one = (FIX / "nvgpuexp-h100-80gb-hbm3-590.48.01-nvlink-s.txt").read_text(encoding="utf-8")
    second = one.replace("GPU 0:", "GPU 1:")
    text = one + "\n".join(second.splitlines()[:10]) + "\n"
    with pytest.raises(ParseError, match="GPU 1 lists 9 link") as caught:
        parse_nvlink(text)
    assert isinstance(caught.value.partial, NvlinkReport)
    assert [g.index for g in caught.value.partial.gpus] == [0]


@settings(max_examples=300)
@given(st.text())
def test_random_text_never_raises_other_errors(text: str) -> None:
    try:
        result = parse_nvlink(text)
    except ParseError:
        return
    assert isinstance(result, NvlinkReport)


@settings(max_examples=200)
@given(st.binary())
def test_random_bytes_never_raise_other_errors(data: bytes) -> None:
    try:
        result = parse_nvlink(data.decode("utf-8", errors="replace"))
    except ParseError:
        return
    assert isinstance(result, NvlinkReport)


def test_a_nul_byte_makes_that_gpu_no_evidence() -> None:
    text = (FIX / "aznhc-azure-a100-gpu6-nvlink-all-inactive.txt").read_text(encoding="utf-8")
    with pytest.raises(ParseError, match="holds bytes nvidia-smi never prints"):
        parse_nvlink(text.replace("GPU-", "GPU-\x00", 1))
