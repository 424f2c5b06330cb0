"""gpu.stalled on recorded values: an idle H100, the same H100 under gpu-burn load, and that load
recording at the idle recording's power (the stall's shape; tests/fixtures/nvidia-smi-q/*stalled*
.source.txt says what was changed). The agent's engine reads each as its gpu tier, a minute apart,
while a fake kubelet (a real gRPC server at the PodResources socket) says a pod holds the GPU.

Where the figures come from: idle 69.85 W at 0 % (nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt);
busy 629.45 W at 100 % (…-q-load.txt); the shipped idle power of an H100 80GB HBM3, 70 W, from
that idle recording and the 8x H100 recording (68.88-71.97 W)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.checks.gpu_stall import check_stalled
from agent.checks.registry import RULE_BOOK
from agent.config import parse_config
from agent.config.schema import ConfigError
from agent.core.facts import NodeFacts
from agent.core.gpu_stall import StallPolicy
from agent.core.node_keys import EventReason
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.pod_resources import list_devices
from agent.probes.snapshot import SnapshotSource
from tests.conftest import cfg
from tests.fake_kubelet import compile_api, pod, serve

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-q"
H100 = "nvgpuexp-h100-80gb-hbm3-590.48.01-q-{}.txt"
IDLE, BUSY, STALLED = (FIX / H100.format(k) for k in ("idle", "load", "load-DERIVED-stalled-at-idle-power"))
UUID = "GPU-00000000-0000-0000-0000-000000000000"  # the recordings' (masked by the capture tool)
CFG = cfg()
T0 = 1_780_000_000


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return compile_api(tmp_path_factory.mktemp("podresources"))


@pytest.fixture
def kubelet(api: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A kubelet whose one pod holds the H100 by its UUID."""
    pb2, _ = api
    held = pb2.ListPodResourcesResponse(
        pod_resources=[pod(pb2, "team-a", "train-0", "main", "nvidia.com/gpu", UUID)]
    )
    with serve(api, tmp_path / "kubelet.sock", held) as state:
        yield state


class Node:
    """The engine on a one-file snapshot whose nvidia-smi -q is swapped per cycle, a minute apart."""

    def __init__(self, tmp: Path, kubelet: dict[str, Any] | None, config: Any = CFG) -> None:
        self.snap = tmp / "snap"
        self.snap.mkdir()
        (self.snap / "boot_id").write_text("b0\n")
        self.now = float(T0)
        sock = kubelet["socket"] if kubelet else str(tmp / "none.sock")
        self.engine = Engine(
            SnapshotSource(self.snap), config, wall=lambda: self.now, workloads=lambda: list_devices(sock)
        )

    def cycle(self, recording: Path, seconds: float = 60) -> tuple[Any, Any]:
        shutil.copyfile(recording, self.snap / "nvidia-smi-q.txt")
        self.engine.run_tier("gpu")
        verdict, marks = self.engine.evaluate()
        self.now += seconds
        return verdict, marks


def stalled_events(marks: Any) -> list[str]:
    return [e.message for e in marks.events if e.reason == EventReason.GPU_STALLED]


def test_the_recordings_read_as_their_case() -> None:
    for path, util, watts in ((IDLE, 0, 69.85), (BUSY, 100, 629.45), (STALLED, 100, 69.85)):
        g = parse_nvsmi_text(path.read_text()).gpus[0]
        assert (g.clocks.utilization_percent, g.power.draw_w) == (util, watts), path.name
    policy = CFG.stall
    assert policy.idle_power("NVIDIA H100 80GB HBM3") == 70.0
    assert policy.idle_power("NVIDIA H100 NVL") == 62.0  # the longer entry, not "H100 80GB HBM3"
    assert policy.idle_power("NVIDIA GH200 480GB") is None  # "H200" is not a word of it
    assert policy.idle_power("NVIDIA L40S") is None


def test_a_stalled_gpu_warns_after_ten_minutes_naming_the_pod(
    tmp_path: Path, kubelet: dict[str, Any]
) -> None:
    node = Node(tmp_path, kubelet)
    events: list[str] = []
    for minute in range(11):  # samples at 0 … 10 min
        verdict, marks = node.cycle(STALLED)
        events += stalled_events(marks)
        res = node.engine.results["gpu.stalled"]
        if minute < 10:
            assert res.status is Status.PASS and not res.findings, minute
    (f,) = res.findings
    assert f.severity is Severity.MONITOR and f.rule == "gpu.stalled.idle-power"
    assert f.key.startswith("gpu.stalled.idle-power/")
    assert "team-a/train-0/main" in f.message and "since 2026" in f.message
    assert (
        verdict.status is Status.WARN and not marks.taint and not any(m.unhealthy for m in marks.remediation)
    )
    assert len(events) == 1 and "team-a/train-0/main" in events[0]
    gpu = next(g for g in json.loads(marks.results_json)["gpus"] if g["index"] == 0)
    assert gpu["status"] == "warn" and gpu["pods"] == ["team-a/train-0/main"]
    # it goes on: the same message (no write per cycle), no second Event
    _, again = node.cycle(STALLED)
    assert node.engine.results["gpu.stalled"].findings[0].message == f.message and not stalled_events(again)
    # the job recovers (real work again): the warning ends at once
    node.cycle(BUSY)
    assert node.engine.results["gpu.stalled"].status is Status.PASS


@pytest.mark.parametrize("recording", [IDLE, BUSY], ids=["idle", "busy"])
def test_an_idle_gpu_and_one_doing_real_work_never_flag(
    recording: Path, tmp_path: Path, kubelet: dict[str, Any]
) -> None:
    node = Node(tmp_path, kubelet)
    for _ in range(15):
        node.cycle(recording)
        assert not node.engine.results["gpu.stalled"].findings
    assert kubelet["calls"] == 0  # nothing looked stalled: the kubelet is never asked


def test_not_held_by_a_pod_or_no_kubelet_never_flags(tmp_path: Path, api: Any) -> None:
    node = Node(tmp_path, None)  # no kubelet socket: nobody is known to hold it
    for _ in range(15):
        node.cycle(STALLED)
    assert not node.engine.results["gpu.stalled"].findings


def test_a_missed_read_starts_the_count_again(tmp_path: Path, kubelet: dict[str, Any]) -> None:
    node = Node(tmp_path, kubelet)
    for _ in range(6):
        node.cycle(STALLED)
    node.now += 10 * 60  # the agent did not look for 10 minutes
    for _ in range(10):
        node.cycle(STALLED)
    assert not node.engine.results["gpu.stalled"].findings  # 9 minutes since the gap
    node.cycle(STALLED)
    assert node.engine.results["gpu.stalled"].findings


def test_the_three_numbers_are_live(tmp_path: Path, kubelet: dict[str, Any]) -> None:
    node = Node(tmp_path, kubelet)
    for _ in range(11):
        node.cycle(STALLED)
    assert node.engine.results["gpu.stalled"].findings
    # each reload is judged at the next cycle, on the samples kept (a sample that did not look
    # stalled under the numbers then in force was not asked who holds it: a run starts after it)
    for stall, flagged in (({"minutes": 20}, False), ({}, True), ({"powerWithinPercent": 0}, False)):
        node.engine.cfg = cfg({"stall": stall})
        node.cycle(STALLED)
        assert bool(node.engine.results["gpu.stalled"].findings) == flagged, stall
    node.engine.cfg = cfg({"stall": {"utilizationPercent": 100}})
    for _ in range(10):
        node.cycle(STALLED)
    assert not node.engine.results["gpu.stalled"].findings  # 9 minutes since the run restarted
    node.cycle(STALLED)
    assert node.engine.results["gpu.stalled"].findings  # 100 % is still at least 100 %
    # a table without the H100: not judged (skipped), never a guess
    node.engine.cfg = cfg({"stall": {"idlePowerWatts": {"H200": 76}}})
    node.cycle(STALLED)
    assert node.engine.results["gpu.stalled"].status is Status.SKIPPED


def test_it_never_taints_and_one_look_cannot_judge_it() -> None:
    with pytest.raises(ConfigError, match="above what this rule may be"):
        parse_config({"severities": {"gpu.stalled.idle-power": "reset"}}, rules=RULE_BOOK)
    with pytest.raises(ConfigError, match="idlePowerWatts"):
        parse_config({"stall": {"idlePowerWatts": {"H100": -1}}}, rules=RULE_BOOK)
    facts = NodeFacts(gpus=parse_nvsmi_text(STALLED.read_text()))
    assert check_stalled(facts, CFG).status is Status.SKIPPED  # `gpu-healthcheck check`: one look
    assert StallPolicy().shaped(100, None, 70.0) is False  # a value not reported: never
