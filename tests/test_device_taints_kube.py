"""Per-GPU isolation with DRA device taints, on the real API server, whatever its version.

Each test reads the kube-apiserver's version and starts it with the flags that serve DeviceTaintRules
on that release (tests/kubeenv/dra.py SUPPORT: 1.37 stock serves `resource.k8s.io/v1`; 1.36 serves
`v1beta2` with the gate DRADeviceTaintRules and its runtime-config; 1.35 stock serves none), or,
where none is served, asserts the fallback: the Node taint and one `DeviceTaintsUnavailable` Event.
A second control plane serves no version at all on every release (1.37: the v1 resource switched
off by --runtime-config) for the fail-closed proofs.

The first control plane runs kube-controller-manager's real `device-taint-eviction-controller` and
`garbage-collector-controller`, no scheduler or kubelet. A ResourceSlice is shaped as NVIDIA's DRA
driver writes it (driver gpu.nvidia.com, pool = node name, 8 devices `gpu-<minor>` with `uuid`,
`type`, `resource.kubernetes.io/pciBusID`); pods bound to the node have ResourceClaims holding GPU 3
and GPU 5 (their allocation written as the scheduler would). The REAL agent process runs on the
healthy p5.48xlarge snapshot with `node.isolation: gpu` and Xid 79 → NoExecute; an Xid 79 line
naming GPU 3's PCI address is appended to its kernel log. The other tests drive the isolating writer
with the real Node writer, slice watch, brake and rules (no agent process).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.core.device_scope import Scope
from agent.core.severity import Severity, Status
from agent.reporters.device_taint_rules import eviction_status
from tests import eviction_scenario as scenario
from tests.conftest import brake_cfg, shipped
from tests.kubeenv.dra import (
    DRIVER,
    DeviceTaintSupport,
    apiserver_version,
    resource_slice,
    rules_path,
    support,
)
from tests.kubeenv.env import unique_name
from tests.kubeenv.eviction import EvictionCluster
from tests.kubeenv.fixtures import _binaries
from tests.kubeenv.server import free_ports
from tests.kubeenv.waiting import wait_for

pytestmark = pytest.mark.kube

XID_GPU3 = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)
GPU3 = Scope(False, ("00000000:86:00.0",))
GPU5 = Scope(False, ("00000000:a8:00.0",))
UNAVAILABLE = "DeviceTaintsUnavailable"
FALLS_BACK = "per-GPU isolation falls back to the node taint"  # the agent's log when none is served
CONTROLLERS = (
    "serviceaccount-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
)


class DraCluster(EvictionCluster):
    """EvictionCluster with the flags of *served* (or none: stock) and kube-controller-manager's
    device-taint eviction and garbage collector instead."""

    def __init__(self, binaries: Any, row: DeviceTaintSupport, apiserver_args: tuple[str, ...]) -> None:
        super().__init__(binaries)
        self.row = row
        self.plane.extra_apiserver_args += list(apiserver_args)
        self.served: str | None = None  # the DeviceTaintRule version this server serves

    def start(self) -> DraCluster:
        from agent.reporters.device_taint_rules import discover
        from tests.kubeenv.env import KubeEnv

        self.plane.start()
        self.env = KubeEnv(self.plane)
        self.kcm = self.plane.launch_controller_manager("kcm-dra", CONTROLLERS, self.row.controller_manager)
        self.wait_service_account("default")
        with self.kube.api_client() as api:
            found = discover(api)
        self.served = found.version if found is not None else None
        return self

    @property
    def rules(self) -> str:
        assert self.served is not None
        return rules_path(self.served)


def _cluster(request: pytest.FixtureRequest, *, served: bool) -> Iterator[DraCluster]:
    binaries = _binaries(request.config)
    row = support(apiserver_version(binaries))
    args = row.apiserver if served else row.none_served
    c = DraCluster(binaries, row, args)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[DraCluster]:
    """Serves DeviceTaintRules where this release can (SUPPORT's flags)."""
    yield from _cluster(request, served=True)


@pytest.fixture(scope="module")
def bare(request: pytest.FixtureRequest) -> Iterator[DraCluster]:
    """Serves no version of DeviceTaintRules, whatever the release."""
    yield from _cluster(request, served=False)


def served_or_skip(cluster: DraCluster) -> str:
    if cluster.served is None:
        pytest.skip(
            f"{cluster.kube.version} serves no DeviceTaintRule version here (stock); its fallback is "
            "proven by the tests on the `bare` server"
        )
    return cluster.served


def claim_pod(cluster: DraCluster, ns: str, node: str, minor: int) -> str:
    """A pod bound to *node* with a ResourceClaim allocated GPU *minor* (as the scheduler writes it)."""
    kube = cluster.kube
    name = f"holds-gpu-{minor}"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    code, body = kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim)
    assert code == 201, body
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    code, created = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, created
    status = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{minor}"}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": name, "uid": created["metadata"]["uid"]}],
        }
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status"
    code, body = kube.request("PATCH", path, status, content_type="application/merge-patch+json")
    assert code == 200, body
    scenario.running(kube, ns, name)
    return name


def agent_config() -> str:
    node = {**scenario.documented_policy(), "maxTaintedFraction": 1, "isolation": "gpu"}
    return yaml.safe_dump({"intervals": {"gpu": 2}, "node": node})


def shipped_isolation_config() -> str:
    """The shipped defaults with per-GPU isolation on: no effect set by hand (the device rule's
    default effect for a `reboot` GPU is NoExecute: node.deviceTaintEffectBySeverity)."""
    return yaml.safe_dump({"intervals": {"gpu": 2}, "node": {"maxTaintedFraction": 1, "isolation": "gpu"}})


def all_rules(cluster: DraCluster) -> list[dict[str, Any]]:
    if cluster.served is None:
        return []
    code, doc = cluster.kube.request("GET", cluster.rules)
    assert code == 200, doc
    return list(doc.get("items") or [])


def rules_of(cluster: DraCluster, node: str) -> list[dict[str, Any]]:
    return sorted(
        (r for r in all_rules(cluster) if r["spec"]["deviceSelector"].get("pool") == node),
        key=lambda r: str(r["spec"]["deviceSelector"].get("device")),
    )


def devices(cluster: DraCluster, node: str) -> list[str]:
    return [r["spec"]["deviceSelector"]["device"] for r in rules_of(cluster, node)]


def node_obj(cluster: DraCluster, node: str) -> dict[str, Any]:
    code, body = cluster.kube.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    return dict(body)


def node_taints(cluster: DraCluster, node: str) -> list[dict[str, Any]]:
    return list(node_obj(cluster, node)["spec"].get("taints") or [])


def node_tainted(cluster: DraCluster, node: str) -> bool:
    return any(t["key"] == scenario.KEYS.taint for t in node_taints(cluster, node))


def events(cluster: DraCluster, node: str, reason: str) -> list[dict[str, Any]]:
    query = {"fieldSelector": f"involvedObject.name={node},reason={reason}"}
    code, doc = cluster.kube.request("GET", "/api/v1/namespaces/default/events", query=query)
    assert code == 200, doc
    return list(doc.get("items") or [])


def gpu_node(cluster: DraCluster, hint: str, pool: str = "") -> str:
    """A GPU Node with the driver's slice (its labels scope a brake of its own to *pool*)."""
    node = unique_name(hint)
    labels = {"test.example/pool": pool} if pool else None
    cluster.kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8, labels=labels)
    code, body = cluster.kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", resource_slice(node))
    assert code == 201, body
    return node


class Writers:
    """The agent's writers for one Node: the isolating writer in front of the real Node writer, the
    slice watch, the rules and (with *brake*) a brake of the Node's own pool that counts the rules."""

    def __init__(
        self, api: Any, node: str, mode: str = "gpu", *, pool: str = "", metrics: Any = None
    ) -> None:
        from agent.reporters.brake import Brake
        from agent.reporters.device_isolation import IsolatingWriter
        from agent.reporters.device_taint_rules import tainted_nodes
        from agent.reporters.device_taints import DeviceTaints
        from agent.reporters.node_writer import NodeWriter
        from agent.reporters.resource_slices import SliceWatch

        brake = None
        self.taints = DeviceTaints(api, node)
        if pool:
            brake = Brake(
                api,
                scope=f"test.example/pool={pool}",
                node_name=node,
                cache_seconds=0,
                also_tainted=lambda: tainted_nodes(api, api=self.taints.served),
                cfg=brake_cfg(max_fraction=1.0),
            )
        self.brake = brake
        self.node = NodeWriter(api, node, brake=brake, cfg=shipped())
        self.slices = SliceWatch(api, node)
        cfg = parse_config({"node": {"isolation": mode}})
        self.w = IsolatingWriter(self.node, self.slices, self.taints, cfg, brake=brake, metrics=metrics)

    def __enter__(self) -> Writers:
        self.w.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.w.stop()


def fail(scope: Scope | None = GPU3) -> Any:
    from tests.test_node_writer import make_marks

    return replace(make_marks(Status.FAIL, Severity.REBOOT), scope=scope)


def healthy() -> Any:
    from tests.test_node_writer import make_marks

    return make_marks(Status.PASS)


def warn(scope: Scope) -> Any:
    from tests.test_node_writer import make_marks

    return replace(make_marks(Status.WARN, Severity.MONITOR), warn_scope=scope)


# -- end to end: the real agent --------------------------------------------------------------------------
def test_an_xid_on_gpu3_taints_gpu3_alone_and_evicts_only_its_pod(
    cluster: DraCluster, tmp_path: Path
) -> None:
    """Where a DeviceTaintRule version is served: one rule in that version for gpu-3 only, owned by the
    Node; no Node taint; the controller deletes the pod holding GPU 3, not the one holding GPU 5; the
    rule's status says so. Where none is (1.35 stock): the Node taint and one DeviceTaintsUnavailable."""
    kube = cluster.kube
    ns = unique_name("dra", max_len=30)
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
    broken, blind = gpu_node(cluster, "broken"), gpu_node(cluster, "blind")
    kubeconfig = cluster.agent_kubeconfig()
    agents: list[scenario.Agent] = []
    try:
        pod3, pod5 = claim_pod(cluster, ns, broken, 3), claim_pod(cluster, ns, broken, 5)
        snaps = {}
        for node in (broken, blind):
            snaps[node] = scenario.snapshot(tmp_path / node / "snap", readable=node != blind)
            agents.append(
                scenario.Agent(node, snaps[node], kubeconfig, tmp_path / node, shipped_isolation_config())
            )

        def status(node: str) -> str | None:
            return (node_obj(cluster, node)["metadata"].get("labels") or {}).get(scenario.KEYS.status)

        wait_for(lambda: status(broken) == "pass", 60, "the healthy node's first verdict (pass)")
        wait_for(lambda: status(blind) == "unknown", 60, "the blind node's first verdict (unknown)")
        assert all_rules(cluster) == []
        xid_at = time.time()
        with (snaps[broken] / "kmsg.log").open("a") as fh:
            fh.write(XID_GPU3)
        if cluster.served is None:
            wait_for(lambda: node_tainted(cluster, broken), 60, "the Node taint (no DeviceTaintRule served)")
            wait_for(
                lambda: bool(events(cluster, broken, UNAVAILABLE)), 30, "the DeviceTaintsUnavailable Event"
            )
            time.sleep(3)  # more gpu cycles of the same episode: still one Event
            assert len(events(cluster, broken, UNAVAILABLE)) == 1
            assert not cluster.evicted(ns, pod5)
            return
        wait_for(lambda: bool(all_rules(cluster)), 60, "a DeviceTaintRule")
        rule_seen = time.time()
        wait_for(lambda: cluster.evicted(ns, pod3), 60, f"{pod3} evicted")
        evicted_seen = time.time()
        time.sleep(3)  # the pod on GPU 5 has had that long to be (wrongly) evicted
        # One bad GPU is a node with seven good ones: degraded, not failed (engine/degraded.py).
        wait_for(lambda: status(broken) == "degraded", 30, "the broken node's verdict (degraded)")
        degraded_node = node_obj(cluster, broken)
        isolated_events = events(cluster, broken, "GPUIsolated")
        rules_before_clear = all_rules(cluster)
        taints_before_clear = node_taints(cluster, broken)
        wait_for(
            lambda: all(eviction_status(r) is not None for r in all_rules(cluster)),
            30,
            "the eviction controller's status on the rule",
        )
        said = subprocess.run(
            [sys.executable, "-m", "agent.cli", "status", broken, "--kubeconfig", str(kube.kubeconfig)],
            cwd=scenario.ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        # `gpu-healthcheck clear` clears the latched Xid, and with it the device taint.
        cleared = subprocess.run(
            [
                *(sys.executable, "-m", "agent.cli", "clear", broken, "--all"),
                *("--reason", "GPU 3 reseated", "--kubeconfig", str(kube.kubeconfig), "--wait", "30"),
            ],
            cwd=scenario.ROOT,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert cleared.returncode == 0, cleared.stdout + cleared.stderr
        wait_for(lambda: all_rules(cluster) == [], 30, "the device taint lifted by clear")
        wait_for(lambda: status(broken) == "pass", 30, "the cleared node's verdict (pass)")
        wait_for(lambda: bool(events(cluster, broken, "GPUReturned")), 30, "the GPUReturned Event")
        returned = events(cluster, broken, "GPUReturned")
        cleared_labels = node_obj(cluster, broken)["metadata"].get("labels") or {}
    finally:
        logs = {}
        for a in agents:
            a.stop()
            logs[a.log] = a.log.read_text()[-3000:]
    (rule,) = rules_before_clear
    created = [e for e in cluster.agent_writes() if e.resource == "devicetaintrules" and e.verb == "create"]
    assert [e.raw["objectRef"].get("apiVersion") for e in created] == [cluster.served], [
        e.what for e in created
    ]
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": broken, "device": "gpu-3"}, logs
    assert rule["spec"]["taint"]["key"] == scenario.KEYS.taint
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rule["metadata"]["labels"][f"{scenario.KEYS.prefix}/node"] == broken
    uid = node_obj(cluster, broken)["metadata"]["uid"]
    assert [(o["kind"], o["name"], o["uid"]) for o in rule["metadata"]["ownerReferences"]] == [
        ("Node", broken, uid)
    ]
    # (node.kubernetes.io/not-ready: the API server's, no kubelet runs)
    for taints in (taints_before_clear, node_taints(cluster, broken), node_taints(cluster, blind)):
        assert not [t for t in taints if t["key"].startswith("gpu-healthcheck")], logs
    assert cluster.evicted(ns, pod3)
    assert not cluster.evicted(ns, pod5), "the pod holding the healthy GPU 5 was evicted"
    assert events(cluster, broken, UNAVAILABLE) == []
    # The degraded Node: its labels, its condition, its Events, the status table (item 1 of issue 45).
    labels = degraded_node["metadata"]["labels"]
    assert labels[scenario.KEYS.status] == "degraded" and labels[scenario.KEYS.severity] == "reboot", labels
    assert labels[scenario.KEYS.gpus_in_service] == "7-of-8", labels
    (cond,) = [c for c in degraded_node["status"]["conditions"] if c["type"] == "GPUHealthy"]
    assert (cond["status"], cond["reason"]) == ("True", "GPUsIsolated"), cond
    head = "degraded (7 of 8 GPUs in service; isolated: GPU 3 (0000:86:00.0))"
    assert cond["message"].startswith(head), cond
    assert "when drained" in cond["message"], cond
    (isolated,) = isolated_events
    assert isolated["type"] == "Warning", isolated
    # no kubelet answers in this test, so no pod is known to hold GPU 3 (tests/test_degraded.py names one)
    for word in (
        "gpu-3",
        rule["metadata"]["name"],
        "reboot:NoExecute",
        "Xid 79",
        "no pod holds it",
        "7 of 8",
    ):
        assert word in isolated["message"], (word, isolated["message"])
    changed = [e["message"] for e in events(cluster, broken, "GPUHealthChanged")]
    assert any(m.startswith("pass → degraded: 7 of 8 GPUs in service") for m in changed), changed
    assert not any("→ fail" in m for m in changed), changed  # never shown failed on the way
    (back,) = returned
    assert "gpu-3" in back["message"] and rule["metadata"]["name"] in back["message"], back
    assert scenario.KEYS.gpus_in_service not in cleared_labels, cleared_labels
    row = next(line for line in said.splitlines() if line.startswith(broken))
    assert " degraded " in row and " 7/8 " in row and "gpu-3=reboot:NoExecute" in row, said
    assert "reboot (then: service) when drained" in row, said
    assert "1 node serves with GPUs isolated" in said and "1 node would be tainted" not in said, said
    # `status NODE` shows the rule and what the eviction controller wrote into its status.
    assert f"DEVICE TAINTS (resource.k8s.io/{cluster.served})" in said, said
    assert "gpu-3" in said and "EvictionInProgress=" in said, said
    # The driver's slice is untouched: only the test wrote it.
    code, slc = kube.request("GET", f"/apis/resource.k8s.io/v1/resourceslices/{broken}-{DRIVER}-slice")
    assert code == 200 and slc["metadata"].get("generation") == 1, slc
    writes = [e for e in cluster.agent_writes() if e.resource == "resourceslices"]
    assert writes == [], writes
    (deleted,) = [
        e
        for e in cluster.audit()
        if e.resource == "pods" and e.verb == "delete" and e.name == pod3 and e.code < 300
    ]
    assert "device-taint" in deleted.user or "kube-controller-manager" in deleted.user, deleted.user
    rule_at = next(
        e.completed for e in cluster.agent_writes() if e.resource == "devicetaintrules" and e.verb == "create"
    )
    print(
        f"\n{kube.version}, resource.k8s.io/{cluster.served}: Xid line → DeviceTaintRule seen: "
        f"{rule_seen - xid_at:.1f} s; → pod on GPU 3 deleted seen: {evicted_seen - xid_at:.1f} s (client "
        f"polls, 0.1-0.25 s); rule created → pod deleted by {deleted.user} (audit, server times): "
        f"{deleted.completed - rule_at:.2f} s"
    )


def test_three_episodes_of_gpu3_under_isolation_make_gpu3_high_risk_not_the_node(
    cluster: DraCluster, tmp_path: Path
) -> None:
    """node.risk per GPU: the real agent with `isolation: gpu`; three times an Xid 79 on GPU 3 (its
    DeviceTaintRule, no Node taint) and `gpu-healthcheck clear`. GPU 3 is high-risk, by its counts in
    the history annotation (3 episodes, 3 repairs: the clears lifted its device taint) and in its
    per-GPU verdict; the Node's label stays `normal` in every PATCH (one flaky GPU is not a lemon
    node); `status NODE` lists it; and the node, settled, writes nothing."""
    served_or_skip(cluster)
    kube, risk = cluster.kube, f"{scenario.KEYS.prefix}/risk"
    node = gpu_node(cluster, "lemon-gpu")
    snap = scenario.snapshot(tmp_path / "snap")
    agent = scenario.Agent(node, snap, cluster.agent_kubeconfig(), tmp_path, agent_config())

    def labels() -> dict[str, str]:
        return dict(node_obj(cluster, node)["metadata"].get("labels") or {})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "agent.cli", *args, "--kubeconfig", str(kube.kubeconfig)]
        return subprocess.run(argv, cwd=scenario.ROOT, capture_output=True, text=True, timeout=90)

    try:
        wait_for(lambda: labels().get(scenario.KEYS.status) == "pass", 60, "the first verdict (pass)")
        for i in range(3):
            with (snap / "kmsg.log").open("a") as fh:
                fh.write(XID_GPU3.replace("03:12:44", f"03:2{i}:44"))  # a new line: the clear covers the old
            wait_for(lambda: devices(cluster, node) == ["gpu-3"], 60, f"episode {i + 1}: GPU 3's rule")
            assert not node_tainted(cluster, node)
            cleared = cli("clear", node, "--all", "--reason", "GPU 3 reseated", "--wait", "30")
            assert cleared.returncode == 0, cleared.stdout + cleared.stderr
            wait_for(lambda: devices(cluster, node) == [], 30, f"episode {i + 1}: the rule lifted by clear")
            wait_for(lambda: labels().get(scenario.KEYS.status) == "pass", 30, "pass after the clear")
        time.sleep(4)  # two gpu cycles: the last writes of the clear are done
        settled = len([e for e in cluster.agent_writes() if e.resource == "nodes" and e.name == node])
        time.sleep(6)  # three more: a steady node writes nothing
        steady = len([e for e in cluster.agent_writes() if e.resource == "nodes" and e.name == node])
        said = cli("status", node).stdout
        doc = node_obj(cluster, node)
    finally:
        agent.stop()
    log = agent.log.read_text()[-3000:]
    annotations = doc["metadata"]["annotations"]
    head = json.loads(annotations[scenario.KEYS.history])[0]
    patched = [
        ((e.request or {}).get("metadata") or {}).get("labels") or {}
        for e in cluster.agent_writes()
        if e.resource == "nodes" and e.name == node and e.verb == "patch"
    ]
    assert {x[risk] for x in patched if risk in x} == {"normal"}, ("the Node's label turned high", head)
    assert labels_of(doc).get(risk) == "normal"
    per_gpu = {
        g: [sum(v[0] for v in d.values()), sum(v[1] for v in d.values())] for g, d in head["gpus"].items()
    }
    assert per_gpu == {"0000:86:00.0": [3, 3]}, (head, log)  # 3 episodes, 3 repairs (any UTC days)
    assert "days" not in head and "isolated" not in head, head  # nothing for the node; no rule now
    gpus = json.loads(annotations[scenario.KEYS.results])["gpus"]
    assert [(g["index"], g.get("dra")) for g in gpus if g.get("risk") == "high"] == [(3, "gpu-3")], gpus
    assert steady == settled, (settled, steady)
    assert "GPU RISK" in said and "GPU 3 (0000:86:00.0, gpu-3)" in said, said
    assert "high" in said and "3 failure episode(s), 3 repair(s)" in said, said


def labels_of(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})


def test_no_version_served_taints_the_node_and_says_so_once(bare: DraCluster, tmp_path: Path) -> None:
    """A server that serves no DeviceTaintRule version (1.35 and 1.36 stock; 1.37 with the v1 resource
    switched off): the real agent with `isolation: gpu` taints the Node for an Xid 79 on GPU 3 and
    posts one DeviceTaintsUnavailable Event for the episode. A config reload asks discovery again
    once (its log line again), and posts no second Event in the same episode."""
    assert bare.served is None, f"{bare.kube.version} serves {bare.served} under {bare.row.none_served}"
    node = gpu_node(bare, "unserved")
    agent = scenario.Agent(
        node, scenario.snapshot(tmp_path / "snap"), bare.agent_kubeconfig(), tmp_path, agent_config()
    )
    try:
        wait_for(
            lambda: (
                (node_obj(bare, node)["metadata"].get("labels") or {}).get(scenario.KEYS.status) == "pass"
            ),
            60,
            "the first verdict (pass)",
        )
        scenario.append_xid79(tmp_path / "snap")  # GPU 4 (0000:97:00.0): one GPU's own fault
        wait_for(lambda: node_tainted(bare, node), 60, "the Node taint")
        wait_for(lambda: bool(events(bare, node, UNAVAILABLE)), 30, "the Event")
        time.sleep(4)  # two more gpu cycles of the episode
        said = events(bare, node, UNAVAILABLE)
        asked = agent.log.read_text().count(FALLS_BACK)  # discovery says so when its answer is new
        config = tmp_path / "config" / "config.yaml"
        config.write_text(agent_config().replace("isolation: gpu", "isolation: auto"))
        wait_for(lambda: agent.log.read_text().count(FALLS_BACK) > asked, 30, "discovery after the reload")
        time.sleep(4)  # two more gpu cycles: discovery is not asked per cycle
        after = agent.log.read_text().count(FALLS_BACK)
        said_after = events(bare, node, UNAVAILABLE)
    finally:
        agent.stop()
    log = agent.log.read_text()
    assert len(said) == 1, (said, log[-3000:])
    assert said[0]["type"] == "Warning" and "serves no DeviceTaintRules" in said[0]["message"]
    assert (asked, after) == (1, 2), log[-3000:]
    assert "config reloaded" in log
    assert len(said_after) == 1, said_after
    assert node_tainted(bare, node)


# -- the isolating writer on the real server ---------------------------------------------------------------
def test_the_episode_device_taints_hold_through_recovery_and_node_wide_faults_taint_the_node(
    cluster: DraCluster,
) -> None:
    """A GPU's fault → its rule, the Node untainted; recovering (no failing finding, marks.taint still
    held by recoverAfter) → the rule stays; marks.taint false → gone; a node-wide fault, a GPU the
    driver does not publish, or isolation `node` → the Node taint, no rule. And a healthy node's
    applies read and write no DeviceTaintRule, nor LIST the slices again (the watch keeps them): the
    start's discovery and LIST only."""
    from tests.test_node_writer import make_marks

    served_or_skip(cluster)
    node = gpu_node(cluster, "episode")
    with cluster.kube.api_client() as api, Writers(api, node) as agent:
        w, taints, slices = agent.w, agent.taints, agent.slices
        for _ in range(3):
            assert w.apply(healthy()).ok
            assert slices.wait_synced(30)  # started by the first apply in mode gpu
        # the start's discovery (one GET per version asked, v1 first) and LIST of our rules only
        assert (taints.writes, taints.reads, slices.lists) == (0, 2, 1)
        assert taints.api is not None and taints.api.version == cluster.served
        assert w.apply(fail()).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == (["gpu-3"], False)
        recovering = replace(make_marks(Status.PASS, taint=True), taint_severity=Severity.REBOOT)
        assert w.apply(recovering).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == (["gpu-3"], False)
        # a second GPU in one episode: node.isolationNodeAtGpus (2, shipped) makes it a node fault,
        # the Node taint on beside the rules (which stay until the episode ends)
        assert w.apply(fail(GPU5)).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == (["gpu-3", "gpu-5"], True)
        assert w.apply(healthy()).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], False)
        w.cfg = parse_config({"node": {"isolation": "gpu", "isolationNodeAtGpus": 0}})  # off: alone
        assert w.apply(fail()).ok and w.apply(fail(GPU5)).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == (["gpu-3", "gpu-5"], False)
        assert w.apply(healthy()).ok
        w.cfg = parse_config({"node": {"isolation": "gpu"}})
        assert w.apply(fail(Scope(True, why="NVSwitch"))).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], True)
        assert w.apply(healthy()).ok
        assert w.apply(fail(Scope(False, ("00000000:ff:00.0",)))).ok  # not published
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], True)
        assert w.apply(healthy()).ok
        gpu, node_wide = (parse_config({"node": {"isolation": mode}}) for mode in ("gpu", "node"))
        w.apply_config(gpu, node_wide)  # a reload
        assert w.apply(fail()).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], True)
        assert slices.lists == 1


def test_a_refused_rule_write_taints_the_node_in_the_same_apply_until_the_rule_is_in_place(
    cluster: DraCluster,
) -> None:
    """Never open. A test ValidatingAdmissionPolicy refuses the rule's write: the same apply taints
    the Node and says it failed; while refused, the Node stays tainted; once the policy is gone the
    retry writes the rule, the brake counts it, and only then the Node taint lifts. A brake that does
    not count the rules keeps the episode on the Node. A write nobody answers is covered the same."""
    from agent.reporters.device_taint_rules import tainted_nodes
    from agent.reporters.kube_rest import KubeRest
    from agent.reporters.metrics import Metrics

    served = served_or_skip(cluster)
    kube = cluster.kube
    pool = unique_name("pool")
    node = gpu_node(cluster, "refused", pool)
    policy = unique_name("refuse-rules")
    vap = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["devicetaintrules"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "this-node",
                    "expression": f"object.spec.deviceSelector.?pool.orValue('') == '{node}'",
                }
            ],
            "validations": [{"expression": "false", "message": "test policy: no DeviceTaintRules here"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }
    for kind, body in (("validatingadmissionpolicies", vap), ("validatingadmissionpolicybindings", binding)):
        code, out = kube.request("POST", f"/apis/admissionregistration.k8s.io/v1/{kind}", body)
        assert code == 201, out
    probe = {
        "apiVersion": f"resource.k8s.io/{served}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": unique_name("probe")},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": node, "device": "gpu-0"},
            "taint": {"key": "example.com/probe", "effect": "NoSchedule"},
        },
    }
    refused = lambda: kube.request("POST", cluster.rules, probe, query={"dryRun": "All"})[0] != 201  # noqa: E731
    wait_for(refused, 30, "the test policy in force")
    metrics = Metrics()
    with kube.api_client() as api, Writers(api, node, pool=pool, metrics=metrics) as agent:
        assert agent.w.apply(healthy()).ok
        first = agent.w.apply(fail())
        assert not first.ok and "test policy" in str(first.error), first
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], True)  # the same apply
        assert not agent.w.apply(fail()).ok  # the retry, still refused: still the Node
        assert node_tainted(cluster, node)
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            kube.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{policy}")
        wait_for(lambda: not refused(), 30, "the test policy gone")
        again = agent.w.apply(fail())
        assert again.ok, again
        assert devices(cluster, node) == ["gpu-3"]
        assert node in tainted_nodes(api, api=agent.taints.served)  # what the brake counts
        assert not node_tainted(cluster, node)  # in place and counted: the Node taint lifted
        assert agent.w.apply(healthy()).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], False)
        # A rule write nobody answers (a port nothing listens on): the Node, in the same apply.
        live = agent.taints.rest
        (port,) = free_ports(1)
        dead = kube.api_client()
        dead.configuration.host = f"https://127.0.0.1:{port}"
        agent.taints.rest = KubeRest.of(dead)
        lost = agent.w.apply(fail())
        assert not lost.ok and node_tainted(cluster, node) and devices(cluster, node) == []
        agent.taints.rest = live
        assert agent.w.apply(fail()).ok
        assert (devices(cluster, node), node_tainted(cluster, node)) == (["gpu-3"], False)
        assert agent.w.apply(healthy()).ok
        dead.close()
    scraped = metrics.registry.get_sample_value
    assert scraped("gpu_healthcheck_device_taint_fallbacks_total", {"reason": "refused"}) == 1
    assert scraped("gpu_healthcheck_device_taint_fallbacks_total", {"reason": "unanswered"}) == 1
    assert scraped("gpu_healthcheck_device_taint_api", {"version": served}) == 1

    # A brake that does not count device taints: once the rule is in place the Node keeps its taint.
    other = gpu_node(cluster, "uncounted", pool)
    for kind, body in (("validatingadmissionpolicies", vap), ("validatingadmissionpolicybindings", binding)):
        body = {**body, "metadata": {"name": policy + "-2"}}
        if kind == "validatingadmissionpolicybindings":
            body["spec"] = {"policyName": policy + "-2", "validationActions": ["Deny"]}
        else:
            body["spec"] = {
                **vap["spec"],
                "matchConditions": [
                    {
                        "name": "this-node",
                        "expression": f"object.spec.deviceSelector.?pool.orValue('') == '{other}'",
                    }
                ],
            }
        code, out = kube.request("POST", f"/apis/admissionregistration.k8s.io/v1/{kind}", body)
        assert code == 201, out
    probe["spec"]["deviceSelector"]["pool"] = other
    wait_for(refused, 30, "the second test policy in force")
    with kube.api_client() as api, Writers(api, other, pool=pool) as agent:
        assert agent.brake is not None
        agent.brake.also_tainted = None
        assert not agent.w.apply(fail()).ok and node_tainted(cluster, other)
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            kube.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{policy}-2")
        wait_for(lambda: not refused(), 30, "the second test policy gone")
        assert agent.w.apply(fail()).ok
        assert (devices(cluster, other), node_tainted(cluster, other)) == (["gpu-3"], True)
        assert agent.w.apply(healthy()).ok
        assert (devices(cluster, other), node_tainted(cluster, other)) == ([], False)


def test_no_version_served_the_writer_taints_the_node_with_one_event_an_episode(bare: DraCluster) -> None:
    """`auto` where no version is served: the node taint, one DeviceTaintsUnavailable Event per
    episode (a new episode asks discovery again), the metric; a healthy node asks nothing per apply."""
    from agent.reporters.metrics import Metrics

    node = gpu_node(bare, "auto")
    metrics = Metrics()
    with bare.kube.api_client() as api, Writers(api, node, "auto", metrics=metrics) as agent:
        assert agent.w.apply(healthy()).ok
        reads = agent.taints.reads
        assert agent.w.apply(healthy()).ok and agent.taints.reads == reads
        for _ in range(2):
            assert agent.w.apply(fail()).ok  # a planned fallback, not a failed write
            assert agent.w.apply(fail()).ok
            assert node_tainted(bare, node)
            assert agent.w.apply(healthy()).ok
            assert not node_tainted(bare, node)
        assert agent.taints.reads == reads + 2  # discovery once more in each episode, never per apply
    assert len(events(bare, node, UNAVAILABLE)) == 2
    scraped = metrics.registry.get_sample_value
    assert scraped("gpu_healthcheck_device_taint_fallbacks_total", {"reason": "unavailable"}) == 2
    assert scraped("gpu_healthcheck_device_taint_api", {"version": "none"}) == 1


def test_a_404_asks_discovery_again_and_the_rule_moves_to_the_version_served(cluster: DraCluster) -> None:
    """A version that answers 404 (the API server changed under a running agent, as after an
    upgrade): that apply taints the Node, the next one discovers again, writes the rule in the
    version served now, and the Node taint lifts."""
    from agent.reporters.device_taint_rules import VERSIONS, RuleApi

    served = served_or_skip(cluster)
    node = gpu_node(cluster, "moved")
    with cluster.kube.api_client() as api, Writers(api, node) as agent:
        assert agent.w.apply(healthy()).ok
        gone = next(v for v in VERSIONS if v != served)
        agent.taints.api = RuleApi(gone, True)  # what an earlier discovery found
        reads = agent.taints.reads
        first = agent.w.apply(fail())
        assert not first.ok and "404" in str(first.error), first
        assert (devices(cluster, node), node_tainted(cluster, node)) == ([], True)
        assert agent.w.apply(fail()).ok
        assert agent.taints.api is not None and agent.taints.api.version == served
        assert agent.taints.reads == reads + 2  # discovery and the list, once
        assert (devices(cluster, node), node_tainted(cluster, node)) == (["gpu-3"], False)
        assert agent.w.apply(healthy()).ok


def test_a_warning_on_one_gpu_shows_on_its_device_with_effect_none_and_moves_nothing(
    cluster: DraCluster,
) -> None:
    """A warning confined to GPU 5: a rule of effect None (where the version serves it), which the
    brake does not count; a fault on GPU 5 then turns the same rule NoSchedule/NoExecute (an update
    with the resourceVersion read, as v1 requires); healthy again → gone."""
    from agent.reporters.device_taint_rules import tainted_nodes

    served_or_skip(cluster)
    node = gpu_node(cluster, "warned")
    with cluster.kube.api_client() as api, Writers(api, node) as agent:
        assert agent.w.apply(warn(GPU5)).ok
        (rule,) = rules_of(cluster, node)
        assert agent.taints.api is not None and agent.taints.api.none_effect
        assert (rule["spec"]["deviceSelector"]["device"], rule["spec"]["taint"]["effect"]) == (
            "gpu-5",
            "None",
        )
        assert rule["spec"]["taint"]["value"] == "monitor"
        assert not node_tainted(cluster, node)
        assert node not in tainted_nodes(api, api=agent.taints.served)
        assert agent.w.apply(fail(GPU5)).ok
        (moved,) = rules_of(cluster, node)
        assert moved["metadata"]["uid"] == rule["metadata"]["uid"]  # changed in place
        assert moved["spec"]["taint"]["effect"] in ("NoSchedule", "NoExecute")
        assert moved["metadata"]["generation"] == rule["metadata"]["generation"] + 1
        assert agent.w.apply(healthy()).ok
        assert rules_of(cluster, node) == []


def test_the_slice_watch_gives_a_copy_of_the_slices_it_watches(cluster: DraCluster) -> None:
    """SliceWatch.objects() (the checks' DRA input reads it): None until the first list, then the
    node's slices as the server holds them; a change to the copy does not reach the watch's own."""
    from agent.reporters.resource_slices import SliceWatch

    node = gpu_node(cluster, "objects")
    with cluster.kube.api_client() as api:
        watch = SliceWatch(api, node)
        assert watch.objects() is None
        watch.start()
        try:
            assert watch.wait_synced(30)
            (got,) = watch.objects() or []
            code, held = cluster.kube.request(
                "GET", f"/apis/resource.k8s.io/v1/resourceslices/{got['metadata']['name']}"
            )
            assert code == 200 and (got["metadata"], got["spec"]) == (held["metadata"], held["spec"])
            got["spec"]["devices"].clear()
            assert [d.name for d in watch.devices() or []] == [f"gpu-{m}" for m in range(8)]
            assert len((watch.objects() or [{}])[0]["spec"]["devices"]) == 8
        finally:
            watch.stop()


# -- nothing left behind ------------------------------------------------------------------------------------
def test_every_agent_removes_its_rules_it_no_longer_wants_and_never_anothers(cluster: DraCluster) -> None:
    """A restart with `isolation: node` on a passing node removes the earlier rule; a rollback to
    `node` while the fault lasts taints the Node first, then removes the rule; a rule that carries our
    label but no ownerReference (an admin's), or one named like ours without our marks, is left."""
    served = served_or_skip(cluster)
    kube = cluster.kube
    passing, failing = gpu_node(cluster, "rollback-pass"), gpu_node(cluster, "rollback-fail")
    with kube.api_client() as api:
        for node in (passing, failing):
            with Writers(api, node) as before:
                assert before.w.apply(fail()).ok
            assert devices(cluster, node) == ["gpu-3"] and not node_tainted(cluster, node)
        foreign = []
        for name, labels in (
            (f"{passing}.admin", {}),  # named as ours
            (unique_name("admin-quarantine"), {f"{scenario.KEYS.prefix}/node": passing}),  # our label
        ):
            body = {
                "apiVersion": f"resource.k8s.io/{served}",
                "kind": "DeviceTaintRule",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": passing, "device": "gpu-6"},
                    "taint": {"key": "example.com/quarantine", "value": "by-hand", "effect": "NoSchedule"},
                },
            }
            code, out = kube.request("POST", cluster.rules, body)
            assert code == 201, out
            foreign.append(name)
        with Writers(api, passing, "node") as after:  # restarted with isolation `node`, node passing
            assert after.w.apply(healthy()).ok
            assert after.slices.lists == 0  # `node` never reads the slices
        assert sorted(r["metadata"]["name"] for r in rules_of(cluster, passing)) == sorted(foreign)
        with Writers(api, failing, "node") as after:  # rolled back while GPU 3 still fails
            assert after.w.apply(fail()).ok
        assert (devices(cluster, failing), node_tainted(cluster, failing)) == ([], True)
    audit = [e for e in cluster.audit() if e.code < 300 and e.name.startswith(failing)]
    taint_at = next(
        e.completed
        for e in audit
        if e.resource == "nodes"
        and e.verb == "patch"
        and any(
            t.get("key") == scenario.KEYS.taint
            for t in ((e.request or {}).get("spec") or {}).get("taints") or []
        )
    )
    deleted_at = next(e.received for e in audit if e.resource == "devicetaintrules" and e.verb == "delete")
    assert taint_at <= deleted_at, "the rule went before the Node taint was on"


def test_an_isolation_node_agent_whose_rbac_cannot_list_rules_still_marks_its_node(
    cluster: DraCluster,
) -> None:
    """An install older than per-GPU isolation (no devicetaintrules in its ClusterRole) running an
    agent with `isolation: node`: the list is refused, logged, and the Node writes go on."""
    served_or_skip(cluster)
    kube = cluster.kube
    node = gpu_node(cluster, "old-rbac")
    sa = unique_name("old-agent")
    kube.create_service_account("default", sa)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": sa},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": sa},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "default"}],
    }
    for kind, body in (("clusterroles", role), ("clusterrolebindings", binding)):
        code, out = kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{kind}", body)
        assert code == 201, out
    with kube.api_client_for_token(kube.token_for("default", sa, create=False)) as api:
        wait_for(
            lambda: (
                kube.request(
                    "GET", f"/api/v1/nodes/{node}", token=api.configuration.api_key["authorization"]
                )[0]
                == 200
            ),
            30,
            "RBAC in force",
        )
        with Writers(api, node, "node") as agent:
            assert agent.w.apply(fail()).ok
            assert agent.taints.held == {} and node_tainted(cluster, node)
            assert agent.w.apply(healthy()).ok and not node_tainted(cluster, node)


def test_the_garbage_collector_removes_the_rules_with_their_node_and_a_new_node_inherits_none(
    cluster: DraCluster,
) -> None:
    """kube-controller-manager's real garbage collector deletes our rule with its Node (the rule's
    ownerReference); a Node re-created with the same name has no rule, and its agent finds none."""
    served_or_skip(cluster)
    kube = cluster.kube
    node = gpu_node(cluster, "reused")
    with kube.api_client() as api:
        with Writers(api, node) as agent:
            assert agent.w.apply(fail()).ok
        assert devices(cluster, node) == ["gpu-3"]
        kube.delete_node(node)
        wait_for(lambda: rules_of(cluster, node) == [], 60, "the garbage collector to delete the rule")
        kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)  # the same name, a new machine
        assert rules_of(cluster, node) == []
        with Writers(api, node) as agent:
            assert agent.w.apply(healthy()).ok
            assert agent.taints.held == {}
    deleted = [
        e
        for e in cluster.audit()
        if e.resource == "devicetaintrules" and e.verb == "delete" and node in e.name and e.code < 300
    ]
    assert [e.user for e in deleted] == ["system:serviceaccount:kube-system:generic-garbage-collector"], [
        e.what for e in deleted
    ]


# -- the fence ---------------------------------------------------------------------------------------------
def test_the_fence_holds_the_agent_to_its_own_rules_and_refuses_no_one_else(cluster: DraCluster) -> None:
    """manifests/ applied: the agent's node-bound token may write a rule for one device of its own
    node's pool that carries our label and an ownerReference to its Node, and nothing else; it may not
    delete an admin's rule, whatever its name; an admin and an identity RBAC does not mark are never
    refused."""
    served = served_or_skip(cluster)
    kube = cluster.kube
    kube.kubectl("apply", "--server-side", "-f", str(scenario.ROOT / "manifests"))
    own, other = unique_name("own"), unique_name("other")
    for node in (own, other):
        kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    uid = {n: node_obj(cluster, n)["metadata"]["uid"] for n in (own, other)}
    token = kube.token_for("gpu-healthcheck", "gpu-healthcheck-agent", bound_node=own, create=False)
    label = f"{scenario.KEYS.prefix}/node"

    def rule(
        name: str, pool: str, owner: str | None = None, labelled: str | None = None, **sel: str
    ) -> dict[str, Any]:
        selector = {k: v for k, v in {"driver": DRIVER, "pool": pool, "device": "gpu-3", **sel}.items() if v}
        meta: dict[str, Any] = {"name": name}
        if labelled is not None:
            meta["labels"] = {label: labelled}
        if owner is not None:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": uid[owner]}]
        taint = {"key": "gpu-healthcheck/unhealthy", "value": "reboot", "effect": "NoSchedule"}
        return {
            "apiVersion": f"resource.k8s.io/{served}",
            "kind": "DeviceTaintRule",
            "metadata": meta,
            "spec": {"deviceSelector": selector, "taint": taint},
        }

    def create(body: dict[str, Any], who: str | None) -> int:
        code, _ = kube.request("POST", cluster.rules, body, query={"dryRun": "All"}, token=who)
        return code

    ours = lambda name, pool=own, **kw: rule(name, pool, own, own, **kw)  # noqa: E731
    wait_for(lambda: create(ours("p", other), token) == 403, 30, "the device fence in force")
    assert create(ours("any-name"), token) == 201  # its own node's device, our marks: any name
    assert create(ours("x", other), token) == 403  # another node's pool
    assert create(rule("x", own, own, None), token) == 403  # no label
    assert create(rule("x", own, None, own), token) == 403  # no owner
    assert create(rule("x", own, other, own), token) == 403  # owned by another Node
    assert create(rule("x", own, own, other), token) == 403  # another node's label
    assert create(ours("x", driver="other.example.com"), token) == 403
    assert create(ours("x", device=""), token) == 403  # no device: the whole pool
    # An admin's rule, even named as ours, with our label, or both: the agent may not delete it.
    for body in (rule(f"{own}.admin", own), rule(unique_name("admin"), own, None, own)):
        code, made = kube.request("POST", cluster.rules, body)
        assert code == 201, made
        code, said = kube.request("DELETE", f"{cluster.rules}/{body['metadata']['name']}", token=token)
        assert code == 403, said
    # Its own rule (really made) it may change and delete.
    code, made = kube.request("POST", cluster.rules, ours(unique_name("mine")), token=token)
    assert code == 201, made
    path = f"{cluster.rules}/{made['metadata']['name']}"
    for _ in range(5):  # the eviction controller writes the rule's status: its resourceVersion moves
        version = kube.request("GET", path)[1]["metadata"]["resourceVersion"]
        patch = {"metadata": {"resourceVersion": version}, "spec": {"taint": {"value": "replace"}}}
        code, out = kube.request(
            "PATCH", path, patch, token=token, content_type="application/merge-patch+json"
        )
        if code != 409:
            break
    assert code == 200, out
    assert kube.request("DELETE", path, token=token)[0] == 200
    # Nobody else is refused: the admin, and a ServiceAccount RBAC lets write rules but does not mark.
    assert create(rule(f"{other}.gpu-3.y", other), None) == 201
    kube.create_service_account("default", "dra-admin")
    for kind, body in (
        (
            "clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "dra-admin"},
                "rules": [
                    {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["create"]}
                ],
            },
        ),
        (
            "clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "dra-admin"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "dra-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "dra-admin", "namespace": "default"}],
            },
        ),
    ):
        code, out = kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{kind}", body)
        assert code == 201, out
    someone = kube.token_for("default", "dra-admin", create=False)
    wait_for(lambda: create(rule("anything", other, device=""), someone) == 201, 30, "RBAC in force")
