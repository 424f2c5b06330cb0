"""Per-GPU isolation with DRA device taints, on the real API server (issue 31 item 1).

A control plane of its own with the gates on (kube-apiserver: DynamicResourceAllocation,
DRADeviceTaints, resource.k8s.io/v1alpha3 served; kube-controller-manager: the real
`device-taint-eviction-controller`, gate DRADeviceTaints). A ResourceSlice shaped as NVIDIA's DRA
driver writes it (driver gpu.nvidia.com, pool = node name, 8 devices `gpu-<minor>` with `uuid`,
`type`, `resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/pcieRoot`), a DeviceClass, and two
pods bound to the node whose ResourceClaims hold GPU 3 and GPU 5 (their allocation written as the
scheduler would: no scheduler or kubelet runs). The REAL agent process runs on the healthy p5.48xlarge
snapshot with `node.isolation: gpu` and Xid 79 → NoExecute; an Xid 79 line naming GPU 3's PCI address
is appended to its kernel log. Then: one DeviceTaintRule, for gpu-3 only; no taint on the Node; the
controller deletes the pod holding GPU 3 and not the one holding GPU 5. A second node whose
nvidia-smi output is unreadable (verdict unknown) gets no rule and no taint. The times from the Xid
line to the rule and to the eviction are printed (server times of the audit log), not asserted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import eviction_scenario as scenario
from tests.kubeenv.dra import APISERVER_ARGS, DRIVER, GATES, resource_slice
from tests.kubeenv.env import unique_name
from tests.kubeenv.eviction import EvictionCluster
from tests.kubeenv.fixtures import _binaries
from tests.kubeenv.waiting import wait_for

pytestmark = pytest.mark.kube

XID_GPU3 = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)
RULES = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"


class DraCluster(EvictionCluster):
    """EvictionCluster with the DRA gates and the device-taint eviction controller instead."""

    def __init__(self, binaries: Any) -> None:
        super().__init__(binaries)
        self.plane.extra_apiserver_args += APISERVER_ARGS

    def start(self) -> DraCluster:
        from tests.kubeenv.env import KubeEnv

        self.plane.start()
        self.env = KubeEnv(self.plane)
        self.kcm = self.plane.launch_controller_manager(
            "kcm-device-taint-eviction",
            ("serviceaccount-controller", "device-taint-eviction-controller"),
            (f"--feature-gates={GATES}",),
        )
        self.wait_service_account("default")
        return self


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[DraCluster]:
    c = DraCluster(_binaries(request.config))
    try:
        yield c.start()
    finally:
        c.stop()


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


def config() -> str:
    node = {**scenario.documented_policy(), "maxTaintedFraction": 1, "isolation": "gpu"}
    return yaml.safe_dump({"intervals": {"gpu": 2}, "node": node})


def our_rules(cluster: DraCluster) -> list[dict[str, Any]]:
    code, doc = cluster.kube.request("GET", RULES)
    assert code == 200, doc
    return list(doc.get("items") or [])


def node_taints(cluster: DraCluster, node: str) -> list[dict[str, Any]]:
    return list(cluster.kube.request("GET", f"/api/v1/nodes/{node}")[1]["spec"].get("taints") or [])


def test_an_xid_on_gpu3_taints_gpu3_alone_and_evicts_only_its_pod(
    cluster: DraCluster, tmp_path: Path
) -> None:
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
    broken, blind = unique_name("broken"), unique_name("blind")
    kubeconfig = cluster.agent_kubeconfig()
    agents: list[scenario.Agent] = []
    try:
        for node in (broken, blind):
            kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
            code, body = kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", resource_slice(node))
            assert code == 201, body
        pod3, pod5 = claim_pod(cluster, ns, broken, 3), claim_pod(cluster, ns, broken, 5)
        snaps = {}
        for node in (broken, blind):
            snaps[node] = scenario.snapshot(tmp_path / node / "snap", readable=node != blind)
            agents.append(scenario.Agent(node, snaps[node], kubeconfig, tmp_path / node, config()))

        def status(node: str) -> str | None:
            labels = kube.request("GET", f"/api/v1/nodes/{node}")[1]["metadata"].get("labels") or {}
            return labels.get(scenario.KEYS.status)

        wait_for(lambda: status(broken) == "pass", 60, "the healthy node's first verdict (pass)")
        wait_for(lambda: status(blind) == "unknown", 60, "the blind node's first verdict (unknown)")
        assert our_rules(cluster) == []
        xid_at = time.time()
        with (snaps[broken] / "kmsg.log").open("a") as fh:
            fh.write(XID_GPU3)
        wait_for(lambda: bool(our_rules(cluster)), 60, "a DeviceTaintRule")
        rule_seen = time.time()
        wait_for(lambda: cluster.evicted(ns, pod3), 60, f"{pod3} evicted")
        evicted_seen = time.time()
        time.sleep(3)  # the pod on GPU 5 has had that long to be (wrongly) evicted
        wait_for(lambda: status(broken) == "fail", 30, "the broken node's verdict (fail)")
        rules_before_clear = our_rules(cluster)
        taints_before_clear = node_taints(cluster, broken)
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
        wait_for(lambda: our_rules(cluster) == [], 30, "the device taint lifted by clear")
    finally:
        logs = {}
        for a in agents:
            a.stop()
            logs[a.log] = a.log.read_text()[-3000:]
    rules = rules_before_clear
    assert [r["spec"]["deviceSelector"] for r in rules] == [
        {"driver": DRIVER, "pool": broken, "device": "gpu-3"}
    ], (rules, logs)
    (rule,) = rules
    assert rule["spec"]["taint"]["key"] == scenario.KEYS.taint
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rule["metadata"]["name"].startswith(f"{broken}.")
    # (node.kubernetes.io/not-ready: the API server's, no kubelet runs)
    for taints in (taints_before_clear, node_taints(cluster, broken), node_taints(cluster, blind)):
        assert not [t for t in taints if t["key"].startswith("gpu-healthcheck")], logs
    assert cluster.evicted(ns, pod3)
    assert not cluster.evicted(ns, pod5), "the pod holding the healthy GPU 5 was evicted"
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
        f"\nXid line → DeviceTaintRule seen: {rule_seen - xid_at:.1f} s; → pod on GPU 3 deleted seen: "
        f"{evicted_seen - xid_at:.1f} s (client polls, 0.1-0.25 s); rule created → pod deleted by "
        f"{deleted.user} (audit, server times): {deleted.completed - rule_at:.2f} s"
    )


def test_the_fence_holds_the_agent_to_its_own_devices_and_refuses_no_one_else(cluster: DraCluster) -> None:
    """manifests/ applied: the agent's node-bound token may taint one device of its own node's pool
    and nothing else; an admin and an identity RBAC does not mark `fenced` are never refused."""
    kube = cluster.kube
    kube.kubectl("apply", "--server-side", "-f", str(scenario.ROOT / "manifests"))
    own, other = unique_name("own"), unique_name("other")
    for node in (own, other):
        kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    token = kube.token_for("gpu-healthcheck", "gpu-healthcheck-agent", bound_node=own, create=False)

    def rule(name: str, pool: str, **selector: str) -> dict[str, Any]:
        sel = {k: v for k, v in {"driver": DRIVER, "pool": pool, "device": "gpu-3", **selector}.items() if v}
        taint = {"key": "gpu-healthcheck/unhealthy", "value": "reboot", "effect": "NoSchedule"}
        return {
            "apiVersion": "resource.k8s.io/v1alpha3",
            "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {"deviceSelector": sel, "taint": taint},
        }

    def create(body: dict[str, Any], who: str | None) -> int:
        code, _ = kube.request("POST", RULES, body, query={"dryRun": "All"}, token=who)
        return code

    wait_for(lambda: create(rule(f"{other}.gpu-3", other), token) == 403, 30, "the device fence in force")
    assert create(rule(f"{own}.gpu-3.x", own), token) == 201  # its own node's device
    assert create(rule(f"{own}.gpu-3.x", other), token) == 403  # another node's pool
    assert create(rule(f"{other}.gpu-3.x", own), token) == 403  # a name that is not its node's
    assert create(rule(f"{own}.gpu-3.x", own, driver="other.example.com"), token) == 403
    assert create(rule(f"{own}.gpu-3.x", own, device=""), token) == 403  # no device: the whole pool
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


def test_the_episode_device_taints_hold_through_recovery_and_node_wide_faults_taint_the_node(
    cluster: DraCluster,
) -> None:
    """The isolating writer with the real Node writer, slice watch and rules (no agent process):
    a GPU's fault → its rule, the Node untainted; recovering (no failing finding, marks.taint still
    held by recoverAfter) → the rule stays; marks.taint false → gone; a node-wide fault, a GPU the
    driver does not publish, or isolation `node` → the Node taint, no rule. And a healthy node's
    applies read and write no DeviceTaintRule, nor LIST the slices again (the watch keeps them)."""
    from agent.core.device_scope import Scope
    from agent.core.severity import Severity, Status
    from agent.reporters.device_isolation import IsolatingWriter
    from agent.reporters.device_taints import DeviceTaints
    from agent.reporters.node_writer import NodeWriter
    from agent.reporters.resource_slices import SliceWatch
    from tests.test_node_writer import make_marks

    kube = cluster.kube
    node = unique_name("episode")
    kube.make_gpu_node(node, instance_type="p5.48xlarge", gpus=8)
    code, body = kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", resource_slice(node))
    assert code == 201, body
    mode = ["gpu"]
    with kube.api_client() as api:
        node_writer = NodeWriter(api, node)
        taints = DeviceTaints(api, node)
        slices = SliceWatch(api, node)
        w = IsolatingWriter(node_writer, slices, taints, lambda: mode[0])
        w.start()
        try:
            fail = make_marks(Status.FAIL, Severity.REBOOT)
            gpu3 = Scope(False, ("00000000:86:00.0",))

            def ours() -> list[str]:
                return sorted(
                    r["spec"]["deviceSelector"]["device"]
                    for r in our_rules(cluster)
                    if r["spec"]["deviceSelector"]["pool"] == node
                )

            def node_tainted() -> bool:
                return any(t["key"] == scenario.KEYS.taint for t in node_taints(cluster, node))

            healthy = make_marks(Status.PASS)
            for _ in range(3):
                assert w.apply(healthy).ok
                assert slices.wait_synced(30)  # started by the first apply in mode gpu
            assert (taints.writes, taints.reads, slices.lists) == (0, 1, 1)  # the start's LISTs only
            assert w.apply(replace(fail, scope=gpu3)).ok
            assert (ours(), node_tainted()) == (["gpu-3"], False)
            recovering = replace(make_marks(Status.PASS, taint=True), taint_severity=Severity.REBOOT)
            assert w.apply(recovering).ok
            assert (ours(), node_tainted()) == (["gpu-3"], False)
            assert w.apply(replace(fail, scope=Scope(False, ("00000000:a8:00.0",)))).ok
            assert (ours(), node_tainted()) == (["gpu-3", "gpu-5"], False)
            assert w.apply(healthy).ok
            assert (ours(), node_tainted()) == ([], False)
            assert w.apply(replace(fail, scope=Scope(True, why="NVSwitch"))).ok
            assert (ours(), node_tainted()) == ([], True)
            assert w.apply(healthy).ok
            assert w.apply(replace(fail, scope=Scope(False, ("00000000:ff:00.0",)))).ok  # not published
            assert (ours(), node_tainted()) == ([], True)
            assert w.apply(healthy).ok
            mode[0] = "node"  # a reload
            assert w.apply(replace(fail, scope=gpu3)).ok
            assert (ours(), node_tainted()) == ([], True)
            assert slices.lists == 1
        finally:
            w.stop()
