"""One hung GPU costs one GPU, on the real API server: the REAL agent process, live (NVML through the
real pynvml over the fake libnvidia-ml.so.1 on LD_LIBRARY_PATH, its machine the p5.48xlarge
snapshot's own `nvidia-smi -q`), with `node.isolation: gpu` and the docs' NoExecute policy, on a
node whose GPUs NVIDIA's DRA driver publishes (a ResourceSlice as it writes it) and two pods holding
GPU 3 and GPU 5. GPU 3's calls then hang (the fake's `hang_while` file, held from this process):
after `node.confirmAfter` cycles one DeviceTaintRule, for gpu-3 alone, no taint on the Node, the pod
on GPU 3 evicted and the one on GPU 5 not. When GPU 3 answers again the rule is lifted.
The control plane: tests/test_device_taints_kube's `cluster` (the DeviceTaintRule version this
release serves, turned on where it has a gate; the device-taint eviction controller running); skipped
where the release serves none (1.35 stock: the node-taint fallback is tested there)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agent.checks.registry import CHECKS
from tests import eviction_scenario as scenario
from tests.conftest import build_fake_libnvml
from tests.fakes.nvml.fake_nvml import from_recordings
from tests.kubeenv.dra import DRIVER, resource_slice
from tests.kubeenv.env import unique_name
from tests.kubeenv.waiting import wait_for
from tests.test_device_taints_kube import (
    DraCluster,
    claim_pod,
    cluster,
    node_taints,
    rules_of,
    served_or_skip,
)

pytestmark = pytest.mark.kube
SNAPSHOT = scenario.ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"


__all__ = ["cluster"]  # the module-scoped fixture, one server for this file


def live_agent(node: str, kubeconfig: Path, work: Path, hold: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`gpu-healthcheck agent` live on the fake NVML machine; GPU 3 hangs while `hold` exists. Only
    the gpu checks run (this machine's /sys and kernel log are not a GPU node's)."""
    machine = from_recordings(SNAPSHOT / "nvidia-smi-q.txt")
    machine.gpus[3]["hang_while"] = str(hold)
    (work / "nvml.conf").write_text(machine.text())
    config = work / "config"
    config.mkdir(parents=True)
    doc = {
        "intervals": {"gpu": 2, "efa": 3600, "topology": 3600},
        "timeouts": {"nvml": 2},
        "node": {**scenario.documented_policy(), "maxTaintedFraction": 1, "isolation": "gpu"},
        "checks": {str(s.name): False for s in CHECKS if not s.name.startswith("gpu.")},
    }
    (config / "config.yaml").write_text(yaml.safe_dump(doc))
    log = work / "agent.log"
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        FAKE_NVML_CONFIG=str(work / "nvml.conf"),
        LD_LIBRARY_PATH=f"{build_fake_libnvml()}:{os.environ.get('LD_LIBRARY_PATH', '')}",
    )
    argv = [
        sys.executable, "-m", "agent.cli", "agent", "--node", node, "--kubeconfig", str(kubeconfig),
        "--config-dir", str(config), "--state-dir", str(work / "state"), "--metrics-port", "0",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=scenario.ROOT, env=env)
    return proc, log


def test_a_hung_gpu_taints_that_gpu_alone_and_evicts_only_its_pod(
    cluster: DraCluster, tmp_path: Path
) -> None:
    served_or_skip(cluster)
    kube = cluster.kube
    ns = unique_name("hung", max_len=30)
    kube.ensure_namespace(ns)
    cluster.wait_service_account(ns)
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }
    code, body = kube.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class)
    assert code in (201, 409), body
    node = unique_name("hung")
    kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    code, body = kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", resource_slice(node))
    assert code == 201, body
    pod3, pod5 = claim_pod(cluster, ns, node, 3), claim_pod(cluster, ns, node, 5)
    hold = tmp_path / "gpu3-hangs"
    proc, log = live_agent(node, cluster.agent_kubeconfig(), tmp_path, hold)

    def status() -> str | None:
        labels = kube.request("GET", f"/api/v1/nodes/{node}")[1]["metadata"].get("labels") or {}
        return labels.get(scenario.KEYS.status)

    try:
        wait_for(lambda: status() == "pass", 90, "the live agent's first verdict (pass)")
        assert rules_of(cluster, node) == []
        hung_at = time.time()
        hold.touch()  # every NVML call on GPU 3 now waits
        wait_for(lambda: bool(rules_of(cluster, node)), 60, "a DeviceTaintRule")
        rule_seen = time.time()
        wait_for(lambda: cluster.evicted(ns, pod3), 60, f"{pod3} evicted")
        time.sleep(3)  # the pod on GPU 5 has had that long to be (wrongly) evicted
        rules = rules_of(cluster, node)
        taints = node_taints(cluster, node)
        assert status() == "degraded"  # one hung GPU, isolated alone: the node serves the other seven
        hold.unlink()  # GPU 3 answers again: its call returns, the next reads see it
        wait_for(lambda: rules_of(cluster, node) == [], 60, "the device taint lifted")
        lifted = time.time()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    said = log.read_text()[-3000:]
    assert [r["spec"]["deviceSelector"] for r in rules] == [
        {"driver": DRIVER, "pool": node, "device": "gpu-3"}
    ], said
    assert not [t for t in taints if t["key"].startswith("gpu-healthcheck")], said  # never the Node
    assert cluster.evicted(ns, pod3) and not cluster.evicted(ns, pod5), said
    print(
        f"\nGPU 3 hung → DeviceTaintRule seen: {rule_seen - hung_at:.1f} s (intervals.gpu 2 s, timeouts.nvml "
        f"2 s, confirmAfter 2); answering again → rule lifted: {lifted - rule_seen:.1f} s after the rule"
    )
