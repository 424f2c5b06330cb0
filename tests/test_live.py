"""The live source (probes/live.py): NVML first, nvidia-smi when NVML cannot be loaded; hung and
failing tools."""

from __future__ import annotations

import ctypes.util
import os
import stat
from pathlib import Path

import pytest

from agent.config.settings import Timeouts
from agent.core.gpu import GpuInventory
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.probes.live import LiveSource
from tests.conftest import live_cfg

FIX = Path(__file__).parent / "fixtures"
XML = FIX / "nvidia-smi-xml" / "telegraf-a10g-515.105.01.xml"


def put_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed here")
def test_without_libnvidia_ml_the_real_pynvml_falls_back_to_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_nvidia_smi(tmp_path, monkeypatch, f'cat "{XML}"')
    inv = LiveSource(live_cfg(timeout_s=5)).gpus()
    assert isinstance(inv, GpuInventory)
    assert inv.source.startswith("nvidia-smi") and len(inv.gpus) == 1


def test_a_hung_nvidia_smi_is_a_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put_nvidia_smi(tmp_path, monkeypatch, "sleep 300")
    result = LiveSource(live_cfg(timeout_s=0.5), use_nvml=False).gpus()
    assert isinstance(result, ProbeError) and result.kind is ProbeErrorKind.TIMEOUT


def test_a_driver_failure_is_a_tool_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put_nvidia_smi(
        tmp_path,
        monkeypatch,
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        'Make sure that the latest NVIDIA driver is installed and running."; exit 9',
    )
    result = LiveSource(live_cfg(timeout_s=5), use_nvml=False).gpus()
    assert isinstance(result, ProbeError) and result.kind is ProbeErrorKind.TOOL_FAILED
    assert "couldn't communicate" in result.message


def test_no_nvidia_smi_at_all_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = LiveSource(live_cfg(timeout_s=5), use_nvml=False).gpus()
    assert isinstance(result, ProbeError) and result.kind is ProbeErrorKind.UNAVAILABLE


def test_missing_kmsg_is_unavailable_and_no_infiniband_is_zero_devices(tmp_path: Path) -> None:
    src = LiveSource(live_cfg(), kmsg_path=str(tmp_path / "kmsg"), sys_root=tmp_path)
    kernel = src.kernel()
    assert isinstance(kernel, ProbeError) and kernel.kind is ProbeErrorKind.UNAVAILABLE
    rdma = src.rdma()
    assert not isinstance(rdma, ProbeError) and rdma.devices == ()  # type: ignore[union-attr]


MISSING = FIX / "nvidia-smi-xml" / "telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-missing.xml"


def test_a_gpu_nvidia_smi_says_on_stderr_is_lost_is_lost_not_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """<attached_gpus>2, one <gpu>: with nvidia-smi's stderr line the second GPU is lost (a fault)."""
    lost = "Unable to determine the device handle for GPU0000:C1:00.0: GPU is lost.  Reboot the system"
    put_nvidia_smi(tmp_path, monkeypatch, f'cat "{MISSING}"; echo "{lost}" >&2')
    inv = LiveSource(live_cfg(timeout_s=5), use_nvml=False).gpus()
    assert isinstance(inv, GpuInventory)
    assert [lg.pci_bus_id for lg in inv.lost] == ["00000000:c1:00.0"]


def test_a_gpu_missing_from_the_xml_without_a_word_is_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_nvidia_smi(tmp_path, monkeypatch, f'cat "{MISSING}"')
    result = LiveSource(live_cfg(timeout_s=5), use_nvml=False).gpus()
    assert isinstance(result, ProbeError) and result.kind is ProbeErrorKind.UNREADABLE
    assert "<attached_gpus> says 2" in result.message
    assert isinstance(result.partial, GpuInventory) and len(result.partial.gpus) == 1


def test_the_check_commands_timeout_bounds_nvidia_smi_and_nvml_alike() -> None:
    """`check --timeout` is the per-tool bound of the source it builds; without it, each tool keeps its
    configured bound (timeouts.nvml is not replaced by timeouts.nvidiaSmi)."""
    from agent.cli.main import tool_timeouts
    from agent.config import parse_config

    cfg = parse_config({"timeouts": {"nvidiaSmi": 20, "nvml": 9, "check": 70}})
    assert LiveSource(tool_timeouts(cfg, 5)).cfg.timeouts == Timeouts(5, 5, 70)
    assert LiveSource(tool_timeouts(cfg, None)).cfg.timeouts == Timeouts(20, 9, 70)
    assert cfg.timeouts == Timeouts(20, 9, 70)  # the loaded config is not changed
