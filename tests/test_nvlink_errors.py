"""NVLink error counters: the NVML probe against a fake `pynvml` module (no GPU here; the functions
it offers are checked against the installed nvidia-ml-py), the snapshot file, and nvlink-errors.

No real recording of NVLink error counters exists among the project's fixture sources (the H100 capture's
`nvidia-smi nvlink -e` printed nothing: a single GPU without NVLink). The counts below are ours:
a healthy 18-link H100 with a few replays since driver load, and faults made from it."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml as real_pynvml
import pytest

from agent.checks.nvlink_errors import check_nvlink_errors
from agent.core.facts import NodeFacts
from agent.core.nvlink import NvlinkErrorSample
from agent.core.severity import Status
from agent.probes.live import LiveSource
from agent.probes.nvlink_errors import parse_nvlink_errors_json, read_nvlink_errors, to_json
from agent.probes.snapshot import SnapshotSource
from agent.probes.tool_outputs import NVLINK_ERRORS
from tests.conftest import cfg, live_cfg

CFG = cfg()


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class FakeNvml:
    """One H100 with 18 active links; counters[link][counter] per NVML_NVLINK_ERROR_DL_* index."""

    def __init__(self, links: int = 18) -> None:
        self.counters = {n: {0: 3, 1: 0, 2: 0, 3: 0} for n in range(links)}

    def module(self) -> types.ModuleType:
        mod: Any = types.ModuleType("pynvml")
        mod.NVMLError = NVMLError
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(mod, name, getattr(self, name))
        return mod

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"  # the kept session compares it on every read (a driver reload)

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return 100 + index

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(busId=b"00000000:53:00.0")

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link not in self.counters:
            raise NVMLError(3)  # NOT_SUPPORTED: no such link
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        return self.counters[link][counter]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    yield fake


def test_the_fake_offers_only_real_nvml_calls() -> None:
    for name in dir(FakeNvml):
        if name.startswith("nvml"):
            real = getattr(real_pynvml, name)
            fake_params = len(inspect.signature(getattr(FakeNvml, name)).parameters) - 1
            assert len(inspect.signature(real).parameters) == fake_params, name


def sample(nvml: FakeNvml, at: float) -> NvlinkErrorSample:
    got = read_nvlink_errors(5.0)
    return NvlinkErrorSample(got.gpus, at)


def test_quiet_counters_pass_and_a_single_read_judges_nothing(nvml: FakeNvml) -> None:
    first = sample(nvml, 0.0)
    assert len(first.gpus[0].links) == 18 and first.gpus[0].links[0] == {
        "replay": 3,
        "recovery": 0,
        "crc_flit": 0,
        "crc_data": 0,
    }
    one = check_nvlink_errors(NodeFacts(nvlink_errors=first), CFG)
    assert one.status == Status.PASS and "replay 54" in one.note and "no previous read" in one.note
    nvml.counters[4][0] += 2  # two replays in five minutes: below 1 a minute
    later = check_nvlink_errors(
        NodeFacts(nvlink_errors=sample(nvml, 300.0), nvlink_errors_previous=first), CFG
    )
    assert later.status == Status.PASS and later.note == "18 link(s): error counters quiet"


def test_recovery_replay_and_crc_growth_are_reported(nvml: FakeNvml) -> None:
    first = sample(nvml, 0.0)
    nvml.counters[4][1] += 1  # one link recovery
    nvml.counters[7][0] += 600  # 600 replays in 300 s
    nvml.counters[7][2] += 40  # 40 CRC flit errors
    result = check_nvlink_errors(
        NodeFacts(nvlink_errors=sample(nvml, 300.0), nvlink_errors_previous=first), CFG
    )
    assert [(f.rule, f.message) for f in result.findings] == [
        ("nvlink-errors.recovery", "GPU 0 NVLink 4: recovery grew by 1 in 300 s"),
        ("nvlink-errors.replay", "GPU 0 NVLink 7: replay grew by 600 in 300 s"),
        ("nvlink-errors.crc", "GPU 0 NVLink 7: crc_flit grew by 40 in 300 s"),
    ]


def test_no_nvlink_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(links=0)  # the H100 VM's case: no link answers
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    result = check_nvlink_errors(NodeFacts(nvlink_errors=LiveSource(live_cfg()).nvlink_errors()), CFG)
    assert result.status == Status.SKIPPED


def test_snapshot_file_round_trip_and_garbage(nvml: FakeNvml, tmp_path: Path) -> None:
    got = sample(nvml, 0.0)
    (tmp_path / "nvlink-errors.json").write_text(to_json(got))
    replay = SnapshotSource(tmp_path).read(NVLINK_ERRORS)
    assert isinstance(replay, NvlinkErrorSample) and replay.gpus == got.gpus
    assert parse_nvlink_errors_json(to_json(got)).gpus == got.gpus
    (tmp_path / "nvlink-errors.json").write_text("{not json")
    assert check_nvlink_errors(
        NodeFacts(nvlink_errors=SnapshotSource(tmp_path).read(NVLINK_ERRORS)), CFG
    ).status == (Status.UNKNOWN)


def test_capture_writes_the_counters_and_records_no_nvml(nvml: FakeNvml, tmp_path: Path) -> None:
    from agent.probes.capture import capture

    x = tmp_path / "x"
    capture(tmp_path / "a", timeout_s=2, sys_root=tmp_path / "sys", kmsg_path=str(x), boot_id_path=x)
    replay = SnapshotSource(tmp_path / "a").read(NVLINK_ERRORS)
    assert isinstance(replay, NvlinkErrorSample) and len(replay.gpus[0].links) == 18


def test_capture_without_nvml_leaves_the_file_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agent.probes.capture import capture

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: nvidia-ml-py absent
    x = tmp_path / "x"
    problems = capture(
        tmp_path / "a", timeout_s=2, sys_root=tmp_path / "sys", kmsg_path=str(x), boot_id_path=x
    )
    assert "nvlink-errors.json" not in problems and not (tmp_path / "a" / "nvlink-errors.json").exists()
    assert check_nvlink_errors(
        NodeFacts(nvlink_errors=SnapshotSource(tmp_path / "a").read(NVLINK_ERRORS)), CFG
    ).status == (Status.SKIPPED)
