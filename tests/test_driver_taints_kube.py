"""NVIDIA's DRA driver's own device taints on the real API server (checks/dra_taints.py).

The driver's ResourceSlice (tests/kubeenv/dra.py, shaped as cmd/gpu-kubelet-plugin writes it) carries
on gpu-2 the taint its NVML health monitor writes for a fatal Xid (`gpu.nvidia.com/xid=48:NoSchedule`)
and on gpu-5 `gpu.nvidia.com/unmonitored:None`. The REAL agent process runs on the healthy p5.48xlarge
snapshot with `node.isolation: gpu` (the control plane of tests/test_device_taints_kube.py: DeviceTaintRules
served where the release can). It must:
- name the driver's taints per GPU in the results annotation (`driverTaints`), warn on gpu-2 (our
  own checks see it healthy: both sources named), only say gpu-5's, and show its warning on gpu-2's
  device alone (a rule of ours, effect None);
- isolate GPU 3 on an Xid 79 of ours with a rule in our own key domain, never a gpu.nvidia.com key;
- leave the driver's slice and its taints as the test wrote them (no write of the agent's touches a
  ResourceSlice), and list them in `status NODE`, labelled as the driver's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import eviction_scenario as scenario
from tests.kubeenv.dra import DRIVER, resource_slice
from tests.kubeenv.env import unique_name
from tests.kubeenv.waiting import wait_for
from tests.test_device_taints_kube import (
    XID_GPU3,
    DraCluster,
    _cluster,
    agent_config,
    devices,
    node_obj,
    rules_of,
    served_or_skip,
)

pytestmark = pytest.mark.kube

XID48 = {"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}
UNMONITORED = {"key": "gpu.nvidia.com/unmonitored", "effect": "None"}
DRIVER_TAINTS = {2: [XID48], 5: [UNMONITORED]}


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[DraCluster]:
    yield from _cluster(request, served=True)


def slice_taints(cluster: DraCluster, node: str) -> dict[str, list[dict[str, Any]]]:
    """device → its taints as the API server holds them (the fields the driver writes, and timeAdded)."""
    code, slc = cluster.kube.request("GET", f"/apis/resource.k8s.io/v1/resourceslices/{node}-{DRIVER}-slice")
    assert code == 200, slc
    return {d["name"]: d["taints"] for d in slc["spec"]["devices"] if d.get("taints")}


def results(cluster: DraCluster, node: str) -> dict[str, Any]:
    raw = (node_obj(cluster, node)["metadata"].get("annotations") or {}).get(scenario.KEYS.results)
    return dict(json.loads(raw)) if raw else {}


def test_the_drivers_taints_are_named_per_gpu_warned_on_and_never_touched(
    cluster: DraCluster, tmp_path: Path
) -> None:
    served_or_skip(cluster)  # 1.35 stock serves no DeviceTaintRule: no per-GPU warning to show
    kube = cluster.kube
    node = unique_name("driver-taints")
    kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    code, body = kube.request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", resource_slice(node, DRIVER_TAINTS)
    )
    assert code == 201, body
    written = slice_taints(cluster, node)
    if sorted(written) != ["gpu-2", "gpu-5"]:
        pytest.skip(f"{kube.version} drops device taints from a ResourceSlice (gate DRADeviceTaints off)")
    snap = scenario.snapshot(tmp_path / "snap")
    agent = scenario.Agent(node, snap, cluster.agent_kubeconfig(), tmp_path, agent_config())
    try:

        def gpu(index: int) -> dict[str, Any]:
            return next((g for g in results(cluster, node).get("gpus", ()) if g["index"] == index), {})

        wait_for(lambda: "driverTaints" in gpu(2), 60, "gpu-2's driver taints in the results annotation")
        wait_for(lambda: gpu(2).get("status") == "warn", 30, "the warning on GPU 2")
        doc = results(cluster, node)
        wait_for(lambda: devices(cluster, node) == ["gpu-2"], 30, "our effect-None rule on gpu-2 alone")
        (warned,) = rules_of(cluster, node)
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID_GPU3)
        wait_for(lambda: devices(cluster, node) == ["gpu-2", "gpu-3"], 60, "our rule isolating gpu-3")
        ours = rules_of(cluster, node)
        said = subprocess.run(
            [sys.executable, "-m", "agent.cli", "status", node, "--kubeconfig", str(kube.kubeconfig)],
            cwd=scenario.ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    finally:
        agent.stop()
        log = agent.log.read_text()[-3000:]
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert gpus[2]["dra"] == "gpu-2" and gpus[2]["driverTaints"] == ["gpu.nvidia.com/xid=48:NoSchedule"], log
    assert gpus[2]["findings"] == ["gpu.driver-taints.xid/00000000:75:00.0"]
    assert gpus[5]["driverTaints"] == ["gpu.nvidia.com/unmonitored:None"] and gpus[5]["status"] == "pass"
    assert [i for i, g in gpus.items() if "driverTaints" in g] == [2, 5]
    assert [i for i, g in gpus.items() if g["status"] != "pass"] == [2]
    (check,) = [c for c in doc["checks"] if c["name"] == "gpu.driver-taints"]
    assert check["status"] == "warn"
    assert "gpu-2 gpu.nvidia.com/xid=48:NoSchedule" in check["message"], check
    assert "our own checks find nothing wrong with it" in check["message"], check
    # ours: in our own key domain, effect None for the warning, NoExecute for the Xid 79 of GPU 3
    assert (warned["spec"]["taint"]["key"], warned["spec"]["taint"]["effect"]) == (
        scenario.KEYS.taint,
        "None",
    )
    taints = {r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"] for r in ours}
    assert taints["gpu-3"]["effect"] == "NoExecute", taints
    for r in ours:
        key = r["spec"]["taint"]["key"]
        assert key.startswith(f"{scenario.KEYS.prefix}/") and not key.startswith(DRIVER), r
    # the driver's slice and its taints as the test wrote them; no write of the agent's touched one
    assert slice_taints(cluster, node) == written
    assert [e.what for e in cluster.agent_writes() if e.resource == "resourceslices"] == []
    assert (
        "NVIDIA's DRA driver's own taints" in said and "gpu-2    gpu.nvidia.com/xid=48:NoSchedule" in said
    ), said
    assert "gpu-5    gpu.nvidia.com/unmonitored:None" in said, said
