"""The NVML session kept open across reads, through the real pynvml and a fake libnvidia-ml.so.1 at
its C ABI (tests/fakes/nvml): how many times NVML is initialised, GPUs attached and NVML shut down,
and when a session is started again (driver reload, UNINITIALIZED, a lost GPU, a hung call).

The machine is the real 8x H100 `nvidia-smi -q` recording gpud-h100x8-535.183.01 (the fake answers
what that recording shows, tests/fakes/nvml/fake_nvml.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.core.gpu import GpuInventory
from agent.probes import nvml, nvml_session
from agent.probes.live import LiveSource
from agent.probes.nvlink_errors import read_nvlink_errors
from agent.probes.nvml import read_nvml
from agent.probes.nvsmi_errors import NvmlUnavailable, ProbeTimeout, ToolReportedFailure
from agent.probes.nvsmi_text import parse_nvsmi_text
from tests.conftest import live_cfg
from tests.fakes.nvml.fake_nvml import Machine, from_recordings

FIX = Path(__file__).parent / "fixtures"
H100X8 = FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt"


@pytest.fixture
def h100x8(fake_nvml: Any) -> Machine:
    machine = from_recordings(H100X8)
    fake_nvml.write(machine)
    return machine


def test_a_hundred_reads_init_once_and_attach_each_gpu_once(fake_nvml: Any, h100x8: Machine) -> None:
    for _ in range(100):
        inv = read_nvml(timeout_s=10)
        assert len(inv.gpus) == 8
    counts = fake_nvml.counts()
    assert counts["inits"] == 1 and counts["shutdowns"] == 0
    assert counts["attaches"] == 8 and counts["handle_calls"] == 8
    assert nvml_session.SESSION.inits >= 1


def test_the_inventory_through_the_c_abi_equals_the_recordings_text(fake_nvml: Any, h100x8: Machine) -> None:
    """The real pynvml over the fake library gives the model the text parser gives for the same
    machine, less what the NVML read does not ask (the SRAM threshold flag and the T.Limit
    temperatures, text only) and the evidence lines."""
    text = parse_nvsmi_text(H100X8.read_text(encoding="utf-8"))
    got = read_nvml(timeout_s=10)
    assert got.source == "nvml" and got.driver_version == text.driver_version
    text_only = [
        replace(
            g,
            ecc=replace(g.ecc, sram_threshold_exceeded=None),
            thermal=replace(g.thermal, gpu_tlimit_margin_c=None, gpu_slowdown_tlimit_c=None),
        )
        for g in text.gpus
    ]
    assert list(got.gpus) == text_only and got.attached_gpus == text.attached_gpus == 8


def test_a_changed_driver_version_starts_a_new_session(fake_nvml: Any, h100x8: Machine) -> None:
    read_nvml(timeout_s=10)
    fake_nvml.write(replace(h100x8, driver="580.159.05"), now=True)
    inv = read_nvml(timeout_s=10)
    assert inv.driver_version == "580.159.05"
    counts = fake_nvml.counts()
    assert (counts["inits"], counts["shutdowns"], counts["attaches"]) == (2, 1, 16)
    assert counts["refcount"] == 1  # the old session was shut down, not leaked


def test_a_changed_boot_id_starts_a_new_session(
    fake_nvml: Any, h100x8: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("a\n")
    monkeypatch.setattr(nvml_session.SESSION, "boot_id_path", boot)
    read_nvml(timeout_s=10)
    read_nvml(timeout_s=10)
    boot.write_text("b\n")
    read_nvml(timeout_s=10)
    counts = fake_nvml.counts()
    assert (counts["inits"], counts["shutdowns"], counts["attaches"]) == (2, 1, 16)


def test_uninitialized_is_read_again_on_a_fresh_session(fake_nvml: Any, h100x8: Machine) -> None:
    read_nvml(timeout_s=10)
    fake_nvml.uninitialise()  # the library forgot its initialisation: every call answers UNINITIALIZED
    inv = read_nvml(timeout_s=10)
    assert len(inv.gpus) == 8 and inv.lost == ()  # not a GPU fault: the read was made again
    assert fake_nvml.counts()["inits"] == 2 and fake_nvml.counts()["attaches"] == 16


def test_a_lost_gpu_makes_the_next_read_attach_afresh(fake_nvml: Any, h100x8: Machine) -> None:
    h100x8.gpus[3]["lost"] = "15"  # NVML_ERROR_GPU_IS_LOST on every call to GPU 3
    fake_nvml.write(h100x8)
    inv = read_nvml(timeout_s=10)
    assert len(inv.gpus) == 7 and inv.lost[0].message.startswith("GPU 3: nvmlDeviceGetPciInfo: GPU is lost")
    assert fake_nvml.counts()["shutdowns"] == 1 and fake_nvml.counts()["refcount"] == 0
    read_nvml(timeout_s=10)
    assert fake_nvml.counts()["inits"] == 2


def test_a_hung_call_is_a_timeout_and_the_session_is_never_shut_down_under_it(
    fake_nvml: Any, h100x8: Machine
) -> None:
    read_nvml(timeout_s=10)
    fake_nvml.hold(True)  # every call into the library blocks: a hung GPU
    with pytest.raises(ProbeTimeout, match="did not answer"):
        read_nvml(timeout_s=0.3)
    with pytest.raises(ProbeTimeout, match="still hung"):
        read_nvml(timeout_s=0.3)  # the watchdog: no second thread sent into the library
    assert fake_nvml.counts()["shutdowns"] == 0  # nothing shut down while a call may be inside
    fake_nvml.hold(False)
    for worker in nvml._WATCHDOG.parked(nvml.SOURCE):
        worker.join(timeout=10)
    # The released read shut its dropped session down on its way out; a new one is started.
    assert fake_nvml.counts()["shutdowns"] == 1
    assert len(read_nvml(timeout_s=10).gpus) == 8
    counts = fake_nvml.counts()
    assert counts["inits"] == 2 and counts["refcount"] == 1


def test_the_nvlink_counter_read_shares_the_session(fake_nvml: Any, h100x8: Machine) -> None:
    for _ in range(10):
        read_nvml(timeout_s=10)
        read_nvlink_errors(10)
    assert fake_nvml.counts()["inits"] == 1 and fake_nvml.counts()["attaches"] == 8


@pytest.mark.parametrize(("code", "error"), [(9, ToolReportedFailure), (18, ToolReportedFailure)])
def test_a_driver_nvml_cannot_start_is_a_tool_failure(fake_nvml: Any, code: int, error: type) -> None:
    fake_nvml.write(Machine(init_error=code))
    with pytest.raises(error):
        read_nvml(timeout_s=10)
    assert fake_nvml.counts()["inits"] == 0


def test_a_library_that_cannot_be_loaded_is_unknown_not_a_fault(
    fake_nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake without its file answers as pynvml does without libnvidia-ml: LIBRARY_NOT_FOUND.
    NVML is then unavailable, the live source tries nvidia-smi, and without it the input is unknown."""
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(tmp_path / "absent"))
    with pytest.raises(NvmlUnavailable):
        read_nvml(timeout_s=10)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    got = LiveSource(live_cfg(timeout_s=5), sys_root=tmp_path).gpus()
    assert not isinstance(got, GpuInventory) and got.kind.value == "unavailable"


def test_the_real_pynvml_finds_the_fake_on_ld_library_path(fake_libnvml_dir: Path, tmp_path: Path) -> None:
    """In a fresh process, as on a node: pynvml's CDLL("libnvidia-ml.so.1") searches LD_LIBRARY_PATH."""
    conf = tmp_path / "nvml.conf"
    conf.write_text(from_recordings(H100X8).text(), encoding="utf-8")
    code = (
        "from agent.probes.nvml import read_nvml; from agent.probes.nvml_session import SESSION\n"
        "for _ in range(5): inv = read_nvml(10)\n"
        "print(len(inv.gpus), inv.driver_version, SESSION.inits, SESSION.attaches)\n"
    )
    env = {"LD_LIBRARY_PATH": str(fake_libnvml_dir), "FAKE_NVML_CONFIG": str(conf), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    assert out.stdout.split() == ["8", "535.183.01", "1", "8"]


def test_a_gpu_asking_for_a_reset_is_not_held_between_reads(fake_nvml: Any, h100x8: Machine) -> None:
    """Recovery action "Reset" on GPU 5: the session is shut down after each read, so that a reset
    (nvidia-smi -r) does not find the agent holding the GPU between reads."""
    h100x8.gpus[5]["field.230"] = "1"
    fake_nvml.write(h100x8)
    inv = read_nvml(timeout_s=10)
    assert inv.gpus[5].recovery_action == "Reset"
    assert fake_nvml.counts()["refcount"] == 0 and fake_nvml.counts()["shutdowns"] == 1
    h100x8.gpus[5]["field.230"] = "0"  # reset done
    fake_nvml.write(h100x8, now=True)
    read_nvml(timeout_s=10)
    read_nvml(timeout_s=10)
    assert fake_nvml.counts()["refcount"] == 1 and fake_nvml.counts()["inits"] == 2
