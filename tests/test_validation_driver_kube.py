"""Validate before service on DRA-only nodes, on the real API server (issue 45 item 3): the REAL agent
process, one per Node, each Node registered with `gpu-healthcheck/validating:NoSchedule` and without
`nvidia.com/gpu`, in a cluster where NVIDIA's DRA driver is installed (its DeviceClass
`gpu.nvidia.com`, as its Helm chart creates it) and publishes ResourceSlices shaped as its kubelet
plugin writes them (tests/kubeenv/dra.py: the 8 GPUs of the p5.48xlarge snapshot the agents read).

- `none`: no slice yet (the kubelet plugin not started): the taint stays, the agent says it waits
  (0 of 8 published); then the driver publishes all 8 and the taint lifts;
- `short`: the driver publishes 7 of 8 (not gpu-3): the taint stays naming GPU 3 and its PCI address;
  the driver republishes all 8 (generation 2) and the taint lifts;
- `late` (node.validate.driverTimeoutSeconds 5): nothing published past the bound: the taint stays,
  the reason in the results annotation and one ValidationDriverTimeout Event.
The DeviceClass is deleted at the end (the session's other tests run without the driver installed).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.core.node_keys import EventReason, Keys
from tests import eviction_scenario as scenario
from tests.kubeenv.dra import DRIVER, resource_slice
from tests.kubeenv.waiting import wait_for

KEYS = Keys()
VALIDATING = {"key": KEYS.validating, "effect": "NoSchedule"}
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
WAITING = "waiting for NVIDIA's DRA driver to publish the GPUs"
SELECTOR = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
DEVICE_CLASS = {  # as the driver's chart writes it (deviceclass-gpu.yaml)
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": SELECTOR}}]},
}


def node_doc(kube: Any, node: str) -> dict[str, Any]:
    code, doc = kube.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, doc
    return dict(doc)


def validating(kube: Any, node: str) -> bool:
    return any(t["key"] == KEYS.validating for t in node_doc(kube, node)["spec"].get("taints") or ())


def said(kube: Any, node: str) -> dict[str, Any]:
    """The results annotation's `validating` (what the agent says it waits for)."""
    raw = (node_doc(kube, node)["metadata"].get("annotations") or {}).get(KEYS.results)
    return dict(json.loads(raw).get("validating") or {}) if raw else {}


def events(kube: Any, node: str, reason: str) -> list[dict[str, Any]]:
    _, out = kube.request(
        "GET", "/api/v1/namespaces/default/events", query={"fieldSelector": f"involvedObject.name={node}"}
    )
    return [e for e in out["items"] if e["reason"] == reason]


def short_slice(node: str) -> dict[str, Any]:
    doc = resource_slice(node)
    doc["spec"]["devices"] = [d for d in doc["spec"]["devices"] if d["name"] != "gpu-3"]
    return doc


@pytest.mark.kube
@pytest.mark.timeout(400)
def test_a_dra_only_node_keeps_the_validating_taint_until_the_driver_publishes_every_gpu(
    kube: Any, gpu_node: Any, tmp_path: Path
) -> None:
    base = {"intervals": {"gpu": 2}, "node": {"maxTaintedFraction": 1}}
    bounded = {
        "intervals": {"gpu": 2},
        "node": {"maxTaintedFraction": 1, "validate": {"driverTimeoutSeconds": 5}},
    }
    code, body = kube.request("POST", CLASSES, DEVICE_CLASS)
    assert code == 201, body
    nodes = {
        kind: gpu_node(gpus=None, taints=[VALIDATING]).metadata.name for kind in ("none", "short", "late")
    }
    code, posted = kube.request("POST", SLICES, short_slice(nodes["short"]))
    assert code == 201, posted
    agents = {
        kind: scenario.Agent(
            node,
            scenario.snapshot(tmp_path / kind / "snap"),
            kube.kubeconfig,
            tmp_path / kind,
            yaml.safe_dump(bounded if kind == "late" else base),
        )
        for kind, node in nodes.items()
    }
    logs: dict[str, str] = {}
    try:
        for kind, counted in (("none", "0 of 8 published"), ("short", "7 of 8 published")):
            wait_for(
                lambda n=nodes[kind], c=counted: (
                    said(kube, n).get("driver", "").startswith(f"{WAITING} ({c}")
                ),
                90,
                f"{kind}: the agent says it waits for the driver",
            )
        wait_for(
            lambda: events(kube, nodes["late"], EventReason.VALIDATION_DRIVER_TIMEOUT),
            90,
            "late: the timeout",
        )
        # a few gpu cycles (2 s) later: every taint still on, nothing said twice
        waited = {kind: said(kube, node) for kind, node in nodes.items()}
        time.sleep(8)
        held = {kind: validating(kube, node) for kind, node in nodes.items()}
        short_said, late_said = said(kube, nodes["short"]), said(kube, nodes["late"])

        # The driver publishes on `none` and republishes all 8 on `short`: both lift.
        code, full = kube.request("POST", SLICES, resource_slice(nodes["none"]))
        assert code == 201, full
        republished = copy.deepcopy(posted)
        republished["spec"]["devices"] = resource_slice(nodes["short"])["spec"]["devices"]
        republished["spec"]["pool"]["generation"] = 2
        code, updated = kube.request("PUT", f"{SLICES}/{posted['metadata']['name']}", republished)
        assert code == 200, updated
        for kind in ("none", "short"):
            wait_for(
                lambda n=nodes[kind]: not validating(kube, n), 60, f"{kind}: lifted once all 8 published"
            )
        still_late = validating(kube, nodes["late"])
        timeouts = events(kube, nodes["late"], EventReason.VALIDATION_DRIVER_TIMEOUT)
        passed = {
            kind: events(kube, nodes[kind], EventReason.VALIDATION_PASSED) for kind in ("none", "short")
        }
    finally:
        for kind, agent in agents.items():
            agent.stop()
            logs[kind] = agent.log.read_text()[-3000:]
        kube.request("DELETE", f"{CLASSES}/{DRIVER}")
        for node in nodes.values():
            kube.request("DELETE", f"{SLICES}/{resource_slice(node)['metadata']['name']}")
    assert held == {"none": True, "short": True, "late": True}, (waited, logs)
    assert waited["none"]["waitingFor"] == ["dra-driver"], waited
    assert short_said["driver"] == f"{WAITING} (7 of 8 published; not GPU 3 (0000:86:00.0))", short_said
    assert "driverTimedOut" not in short_said
    # the timeout: the taint stays, with its reason in the annotation, one Event and the log
    assert still_late
    assert late_said["driverTimedOut"] is True and late_said["waitingFor"] == ["dra-driver"], late_said
    reason = late_said["driver"]
    assert reason.startswith("NVIDIA's DRA driver has not published this node's GPUs within 5 s "), reason
    assert "(node.validate.driverTimeoutSeconds): 0 of 8 published; not GPU 0 (0000:53:00.0)" in reason
    assert f"the taint {KEYS.validating} stays until it does" in reason
    assert [(e["type"], e.get("count", 1)) for e in timeouts] == [("Warning", 1)], timeouts
    assert timeouts[0]["message"].startswith(
        "NVIDIA's DRA driver has not published this node's GPUs within 5 s "
    )
    assert "has not published this node's GPUs" in logs["late"]
    assert all(len(p) == 1 for p in passed.values()), passed
