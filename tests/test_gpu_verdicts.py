"""Who is hit and what to do (issue 16): a verdict per GPU in the results annotation, the pods the
kubelet says hold a failing GPU (in the annotation and the Event), and the next step of each finding
with its escalation, following NVIDIA's resolution buckets."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config_dir
from agent.core.actions import Action, escalation, from_nvidia_bucket, recommend
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.node_keys import Reason
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.gpu_verdicts import MAX_PODS, gpu_verdicts
from agent.probes.pod_resources import list_devices
from agent.probes.snapshot import SnapshotSource
from tests.fake_kubelet import compile_api, pod, serve

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
GPU2_UUID, GPU5_UUID = "GPU-973565ff-45cf-12ea-4e91-33386720f7bb", "GPU-06db64f6-6181-5a90-cf95-5ce52a58c4e5"
XID48_GPU2 = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:75:00): 48, pid=4242, "
    "name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.\n"
)


# ------------------------------------------------------------------------------------- next steps


@pytest.mark.parametrize(
    ("severity", "action", "then"),
    [
        (Severity.MONITOR, Action.WATCH, (Action.RESET_GPU, Action.REBOOT, Action.SERVICE)),
        (Severity.RESET, Action.RESET_GPU, (Action.REBOOT, Action.SERVICE)),
        (Severity.REBOOT, Action.REBOOT, (Action.SERVICE,)),
        (Severity.ISOLATE, Action.SERVICE, ()),
    ],
)
def test_the_step_follows_the_severity_when_the_check_names_none(
    severity: Severity, action: Action, then: tuple[Action, ...]
) -> None:
    rec = recommend(severity)
    assert (rec.action, rec.escalation) == (action, then)


def test_nvidia_buckets_name_the_step_whatever_the_severity() -> None:
    assert from_nvidia_bucket("RESTART_APP") is Action.RESTART_APP
    assert from_nvidia_bucket("restart_bm") is Action.REBOOT
    assert from_nvidia_bucket("CHECK_MECHANICALS") is Action.RESEAT
    assert from_nvidia_bucket("WORKFLOW_XID_45") is Action.RESTART_FABRIC_MANAGER
    assert from_nvidia_bucket("") is None and from_nvidia_bucket("SOMETHING_NEW") is None
    # an operator who lowers Xid 79 to monitor still reads that a reboot fixes it
    assert recommend(Severity.MONITOR, Action.REBOOT).describe() == "reboot (then: service)"
    assert escalation(Action.RESTART_APP) == (Action.RESET_GPU, Action.REBOOT, Action.SERVICE)


def test_every_catalog_bucket_is_a_known_step() -> None:
    catalog = load_config_dir().xid_catalog
    buckets = {e.nvidia_action for e in catalog.entries.values() if e.nvidia_action}
    unknown = sorted(b for b in buckets if from_nvidia_bucket(b) is None and b != "XID_154")
    assert unknown == []
    assert from_nvidia_bucket(catalog.entries[48].nvidia_action) is Action.RESET_GPU
    assert from_nvidia_bucket(catalog.entries[79].nvidia_action) is Action.REBOOT


# ------------------------------------------------------------------------------- per-GPU verdicts


def _gpu(i: int) -> Gpu:
    return Gpu(
        index=i, pci_bus_id=f"00000000:{0x53 + i:02x}:00.0", uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000"
    )


def test_a_gpu_verdict_lists_only_the_pods_of_a_failing_gpu() -> None:
    inv = GpuInventory("nvml", gpus=tuple(_gpu(i) for i in range(3)))
    f = Finding(
        "gpu.ecc", "gpu.ecc.dram-uncorrectable", Severity.RESET, "GPU 1: DBE", ("GPU 1 (0000:54:00.0)",)
    )
    asked = []

    def holders() -> dict[int, tuple[str, ...]]:
        asked.append(1)
        return {0: ("a/b/c",), 1: tuple(f"ml/p{i}/c" for i in range(MAX_PODS + 2))}

    out = gpu_verdicts([CheckResult("gpu.ecc", (f,))], inv, Status.FAIL, holders)
    assert [g["status"] for g in out] == ["pass", "fail", "pass"]
    assert out[1]["action"] == "reset-gpu" and out[1]["escalation"] == ["reboot", "service"]
    assert len(out[1]["pods"]) == MAX_PODS + 1 and out[1]["pods"][-1] == "+2 more"
    assert "pods" not in out[0]  # healthy GPUs never name pods: no write when pods come and go
    assert gpu_verdicts([CheckResult("gpu.ecc")], inv, Status.PASS, holders)[1]["status"] == "pass"
    assert len(asked) == 1  # the kubelet is asked only when a GPU has a finding


def test_without_a_finding_a_gpu_is_unknown_when_the_node_is() -> None:
    inv = GpuInventory("nvml", gpus=(_gpu(0),))
    assert gpu_verdicts([], inv, Status.UNKNOWN)[0]["status"] == "unknown"
    assert gpu_verdicts([], object(), Status.UNKNOWN) == []  # no inventory: no per-GPU claim


# ---------------------------------------------------------------- the engine, with a fake kubelet


@pytest.fixture
def kubelet(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[dict[str, Any]]:
    pb2, grpc_mod = compile_api(tmp_path_factory.mktemp("podresources"))
    response = pb2.ListPodResourcesResponse(
        pod_resources=[
            pod(pb2, "ml", "train-0", "main", "nvidia.com/gpu", GPU2_UUID),
            pod(pb2, "ml", "other", "main", "nvidia.com/gpu", GPU5_UUID),
        ]
    )
    with serve((pb2, grpc_mod), tmp_path / "kubelet.sock", response) as state:
        yield state


def test_the_pods_on_a_failing_gpu_are_named_in_the_event_and_the_annotation(
    kubelet: dict[str, Any], tmp_path: Path
) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    eng = Engine(
        SnapshotSource(snap),
        load_config_dir(ROOT / "config"),
        workloads=lambda: list_devices(kubelet["socket"]),
    )
    for tier in ("gpu", "xid", "efa", "topology"):
        eng.run_tier(tier)
    _, marks = eng.evaluate()
    assert kubelet["calls"] == 0  # a healthy node never asks the kubelet
    with (snap / "kmsg.log").open("a") as fh:
        fh.write(XID48_GPU2)
    eng.run_tier("xid")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and verdict.severity is Severity.RESET
    doc = json.loads(marks.results_json)
    gpu2 = doc["gpus"][2]
    assert (gpu2["uuid"], gpu2["status"], gpu2["severity"]) == (GPU2_UUID, "fail", "reset")
    assert gpu2["findings"] == ["xid/48/0000:75:00.0"] and gpu2["pods"] == ["ml/train-0/main"]
    assert (gpu2["action"], gpu2["escalation"]) == ("reset-gpu", ["reboot", "service"])
    assert all("pods" not in g for g in doc["gpus"] if g["index"] != 2)  # GPU 5's pod is not hit
    latched = next(e for e in marks.events if e.reason == Reason.LATCHED_FINDING)
    assert "→ reset-gpu (then: reboot, service)" in latched.message
    assert latched.message.endswith("; pods: ml/train-0/main")
    changed = next(e for e in marks.events if e.reason == Reason.GPU_HEALTH_CHANGED)
    assert "pods: ml/train-0/main" in changed.message
    (latch,) = doc["latched"]  # a latch carries its step in a check's shape, and keeps it on restore
    assert (latch["action"], latch["escalation"]) == ("reset-gpu", ["reboot", "service"])
    again = Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"))
    again.restore(doc)
    (kept,) = again.latches.values()
    assert kept.next_step is not None and kept.next_step.describe() == "reset-gpu (then: reboot, service)"

    # the kubelet gone: the verdict stands, without pod names
    kubelet["status"] = __import__("grpc").StatusCode.UNAVAILABLE
    _, marks = eng.evaluate()
    gpu2 = json.loads(marks.results_json)["gpus"][2]
    assert gpu2["status"] == "fail" and "pods" not in gpu2
