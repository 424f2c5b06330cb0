"""DRA-only GPU nodes on the real API server (stock kube-apiserver of the main suite: resource.k8s.io/v1
ResourceSlices are served by default, no gate): the GPU Operator's DRA-only mode runs no device
plugin, so the Node has no `nvidia.com/gpu` (or "0"), and NVIDIA's DRA driver publishes the GPUs in
a ResourceSlice (tests/kubeenv/dra.py: shaped as cmd/gpu-kubelet-plugin writes the 8 GPUs of the
p5.48xlarge snapshot). The REAL agent process runs on that snapshot, one per Node, each Node
registered with the validating taint:

- `ok` (no nvidia.com/gpu, the driver's slice of 8): gpu.allocatable compares and passes, the
  validating taint lifts, each GPU's verdict names its DRA device beside its PCI address and UUID;
- `late` (nvidia.com/gpu "0", no slice yet, and no DeviceClass gpu.nvidia.com on this server: the
  driver is not installed, so the validating taint does not wait for it; where it is:
  tests/test_validation_driver_kube.py): skipped for want of both publishers, never a fail, and the
  taint lifts; then the driver publishes 7 of the 8 GPUs (not GPU 3): the watch brings
  it to the next gpu cycle (no LIST per cycle) and the check warns, naming GPU 3; the driver
  republishes all 8 (generation 2): pass again.
The agents never write a ResourceSlice.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.core.node_keys import Keys
from tests import eviction_scenario as scenario
from tests.kubeenv.dra import GPUS, resource_slice
from tests.kubeenv.waiting import wait_for

KEYS = Keys()
VALIDATING = {"key": KEYS.validating, "effect": "NoSchedule"}
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def node_doc(kube: Any, node: str) -> dict[str, Any]:
    code, doc = kube.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, doc
    return dict(doc)


def results(kube: Any, node: str) -> dict[str, Any]:
    raw = (node_doc(kube, node)["metadata"].get("annotations") or {}).get(KEYS.results)
    return dict(json.loads(raw)) if raw else {}


def check(kube: Any, node: str, name: str = "gpu.allocatable") -> dict[str, Any]:
    return next((c for c in results(kube, node).get("checks", ()) if c["name"] == name), {})


def validating(kube: Any, node: str) -> bool:
    return any(t["key"] == KEYS.validating for t in node_doc(kube, node)["spec"].get("taints") or ())


def status(kube: Any, node: str) -> str | None:
    return (node_doc(kube, node)["metadata"].get("labels") or {}).get(KEYS.status)


@pytest.mark.kube
@pytest.mark.timeout(300)
def test_a_dra_only_node_is_compared_with_the_drivers_slices_and_validated(
    kube: Any, gpu_node: Any, tmp_path: Path
) -> None:
    config = yaml.safe_dump({"intervals": {"gpu": 2}, "node": {"maxTaintedFraction": 1}})
    ok = gpu_node(gpus=None, taints=[VALIDATING]).metadata.name
    late = gpu_node(gpus=0, taints=[VALIDATING]).metadata.name
    assert "nvidia.com/gpu" not in node_doc(kube, ok)["status"]["allocatable"]
    assert node_doc(kube, late)["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    code, body = kube.request("POST", SLICES, resource_slice(ok))
    assert code == 201, body
    agents = {
        n: scenario.Agent(n, scenario.snapshot(tmp_path / n / "snap"), kube.kubeconfig, tmp_path / n, config)
        for n in (ok, late)
    }
    try:
        wait_for(lambda: not validating(kube, ok), 60, "the healthy DRA-only node's validating taint lifted")
        wait_for(lambda: not validating(kube, late), 60, "the taint lifted where nothing publishes yet")
        compared = check(kube, ok)
        gpus = results(kube, ok)["gpus"]
        nothing = check(kube, late)

        # The driver publishes 7 of the 8 GPUs on `late` (its kubelet plugin started once the taint went).
        short = resource_slice(late)
        short["spec"]["devices"] = [d for d in short["spec"]["devices"] if d["name"] != "gpu-3"]
        code, posted = kube.request("POST", SLICES, short)
        assert code == 201, posted
        wait_for(lambda: check(kube, late).get("status") == "warn", 30, "the missing GPU found")
        wait_for(lambda: status(kube, late) == "warn", 30, "the node's warn verdict")
        missing, late_gpus = check(kube, late), results(kube, late)["gpus"]

        # ... and republishes all 8, as its resourceslice controller does (generation 2, in place).
        full = copy.deepcopy(posted)
        full["spec"]["devices"] = resource_slice(late)["spec"]["devices"]
        full["spec"]["pool"]["generation"] = 2
        code, updated = kube.request("PUT", f"{SLICES}/{posted['metadata']['name']}", full)
        assert code == 200, updated
        wait_for(lambda: check(kube, late).get("status") == "pass", 30, "the republished GPU")
        wait_for(lambda: status(kube, late) == "pass", 30, "the node's pass verdict")
    finally:
        logs = {}
        for n, agent in agents.items():
            agent.stop()
            logs[n] = agent.log.read_text()[-3000:]
    assert compared["status"] == "pass", (compared, logs[ok])
    assert compared["message"] == "NVIDIA's DRA driver publishes the 8 GPU(s) seen"
    assert status(kube, ok) == "pass"
    # the per-GPU verdict: the DRA device beside the PCI address and the UUID, for all 8
    assert [(g["index"], g["pci"], g["uuid"], g["dra"]) for g in gpus] == [
        (minor, pci, uuid, f"gpu-{minor}") for minor, pci, uuid in GPUS
    ]
    assert nothing["status"] == "skipped", (nothing, logs[late])
    assert "no nvidia.com/gpu on the Node" in nothing["message"]
    assert "no gpu.nvidia.com device for this node" in nothing["message"]
    assert missing["message"].startswith("GPU 3 (0000:86:00.0): NVIDIA's DRA driver does not publish it")
    gpu3 = late_gpus[3]
    assert (gpu3["pci"], gpu3["status"], "dra" in gpu3) == ("0000:86:00.0", "warn", False), gpu3
    assert gpu3["findings"] == ["gpu.allocatable.dra-unpublished/00000000:86:00.0"]
    assert all(g["dra"] == f"gpu-{g['index']}" for g in late_gpus if g["index"] != 3)
    # the agents read the slices and wrote none: each is as the test (the driver) left it
    for name, rv in ((f"{ok}-gpu.nvidia.com-slice", None), (posted["metadata"]["name"], updated)):
        code, now = kube.request("GET", f"{SLICES}/{name}")
        assert code == 200, now
        if rv is not None:
            assert now["metadata"]["resourceVersion"] == rv["metadata"]["resourceVersion"]
        else:
            assert now["metadata"]["generation"] == 1


@pytest.mark.kube
@pytest.mark.timeout(120)
def test_the_dra_input_starts_the_watch_only_without_a_device_plugin_and_lists_once(
    kube: Any, gpu_node: Any
) -> None:
    """The reader the agent wires (reporters/published_slices.py) on the real API server: a Node
    whose device plugin registers GPUs starts no watch; a DRA-only one starts it at the first read,
    lists once, and later reads (and a republish) cost no LIST; the parse is reused while the slices
    do not change."""
    from agent.core.dra import DraSlices
    from agent.core.probed import NotCaptured
    from agent.probes.node_object import node_from_dict
    from agent.reporters.published_slices import SliceInput
    from agent.reporters.resource_slices import SliceWatch

    plugin = gpu_node(gpus=8).metadata.name
    dra = gpu_node(gpus=None).metadata.name
    code, body = kube.request("POST", SLICES, resource_slice(dra))
    assert code == 201, body
    with kube.api_client() as api:
        watches = {n: SliceWatch(api, n) for n in (plugin, dra)}
        reads = {n: SliceInput(w, lambda n=n: node_from_dict(node_doc(kube, n))) for n, w in watches.items()}
        try:
            skipped = reads[plugin]()
            first = reads[dra]()
            again = [reads[dra]() for _ in range(5)]
            short = copy.deepcopy(body)
            short["spec"]["devices"] = short["spec"]["devices"][:7]
            short["spec"]["pool"]["generation"] = 2
            code, updated = kube.request("PUT", f"{SLICES}/{body['metadata']['name']}", short)
            assert code == 200, updated
            wait_for(lambda: len(getattr(reads[dra](), "devices", ())) == 7, 30, "the republish seen")
        finally:
            for w in watches.values():
                w.stop()
    assert isinstance(skipped, NotCaptured) and "device plugin" in skipped.source
    assert watches[plugin].lists == 0 and not watches[plugin].synced.is_set()
    assert isinstance(first, DraSlices) and [d.name for d in first.devices] == [f"gpu-{i}" for i in range(8)]
    assert all(r is first for r in again)  # parsed once while the slices did not change
    assert watches[dra].lists == 1  # the start's LIST; the republish came by the watch
