"""Where the agent runs and how it is fenced (issue 12, items 5 and 6).

GPU nodes are found the same way by the DaemonSets, the brake and `status` (core/gpu_nodes.py) on
every cloud; the DaemonSets run on tainted nodes; the admission fence follows a renamed install
(kustomize `namespace:` and `namePrefix:`) and the agent proves it at start. The DaemonSet test runs
the real daemonset controller (kube-controller-manager) against the real API server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import load_config_dir, parse_config, yaml_safe
from agent.config.schema import ConfigError
from agent.core.gpu_nodes import parse_selector
from agent.core.node_keys import Keys
from agent.reporters.brake import Brake
from agent.reporters.fence import FenceResult, prove_fence
from tests.conftest import brake_cfg
from tests.kubeenv.env import unique_name

ROOT = Path(__file__).parent.parent
MANIFESTS = ROOT / "manifests"
SELECTION = load_config_dir().gpu_node_selection
MERGE = "application/merge-patch+json"
KEYS = Keys()

# Node labels as each platform sets them (no nvidia.com/gpu.present unless said).
PLATFORMS: dict[str, dict[str, str]] = {
    "eks-no-operator": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "eks-karpenter": {
        "node.kubernetes.io/instance-type": "p9.48xlarge",  # a type we have no profile for
        "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
    },
    "gke": {
        "node.kubernetes.io/instance-type": "n1-standard-8",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
    },
    "aks": {
        "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4",
        "kubernetes.azure.com/accelerator": "nvidia",
    },
    "nfd-operator": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    "nfd-default": {"feature.node.kubernetes.io/pci-0302_10de.present": "true"},
    "on-prem-by-hand": {"nvidia.com/gpu.present": "true"},
}
CPU_NODE = {"node.kubernetes.io/instance-type": "m5.large", "kubernetes.io/os": "linux"}


# ------------------------------------------------------------------------------------------ pure


@pytest.mark.parametrize(
    ("selector", "requirements"),
    [
        ("a=1", [("a", "In", ("1",))]),
        ("a==1,b", [("a", "In", ("1",)), ("b", "Exists", ())]),
        ("a!=1", [("a", "NotIn", ("1",))]),
        ("!a", [("a", "DoesNotExist", ())]),
        ("t in (y, x),z notin (1)", [("t", "In", ("x", "y")), ("z", "NotIn", ("1",))]),
        ("example.com/k=v", [("example.com/k", "In", ("v",))]),
    ],
)
def test_label_selectors_become_the_api_servers_requirements(
    selector: str, requirements: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    """What the DaemonSets' nodeSelectorTerms are made of (the daemonset controller test below
    shows the API server reads them as the brake's and status' label selectors)."""
    assert [(r.key, r.operator, r.values) for r in parse_selector(selector)] == requirements


@pytest.mark.parametrize("bad", ["", "a in ()", "a=b=c", "a in (x", "-a"])
def test_a_selector_typo_rejects_the_config(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_selector(bad)
    with pytest.raises(ConfigError, match="gpuNodeSelector"):
        parse_config({"node": {"gpuNodeSelector": [bad]}})


def test_one_selector_as_a_string_still_works() -> None:
    cfg = parse_config({"node": {"gpuNodeSelector": "pool=gpu"}})
    assert cfg.node.gpu_node_selectors == ("pool=gpu",)
    assert cfg.gpu_node_selection == ("pool=gpu",)  # no profiles given: no instance types


# ------------------------------------------------------------------------------------------ kube


def _node(kube: Any, name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> None:
    body = {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints or []}}
    status, answer = kube.request("POST", "/api/v1/nodes", body)
    assert status == 201, answer


@pytest.fixture
def nodes(kube: Any) -> Iterator[dict[str, str]]:
    """One Node per platform, a CPU node and a GPU node tainted by us and by others: kind -> name."""
    made: dict[str, str] = {}
    tag = unique_name("where")
    for platform, labels in {**PLATFORMS, "cpu": CPU_NODE}.items():
        made[platform] = f"{tag}-{platform}"
        _node(kube, made[platform], {**labels, "test.example/pool": tag})
    made["tainted"] = f"{tag}-tainted"
    _node(
        kube,
        made["tainted"],
        {"node.kubernetes.io/instance-type": "p5.48xlarge", "test.example/pool": tag},
        [
            {"key": KEYS.taint, "value": "reboot", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "training", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        ],
    )
    made["pool"] = tag
    yield made
    for kind, name in made.items():
        if kind != "pool":
            kube.delete_node(name)


@pytest.mark.kube
def test_the_brake_counts_the_same_gpu_nodes_and_reports_a_selection_that_misses(
    kube: Any, nodes: dict[str, str]
) -> None:
    scope = f"test.example/pool={nodes['pool']}"
    seen: list[tuple[int, bool]] = []
    with kube.api_client() as api:
        brake = Brake(
            api,
            scope=scope,
            node_name=nodes["gke"],
            on_count=lambda *a: seen.append(a),
            cfg=brake_cfg(selectors=SELECTION),
        )
        assert brake.total() == len(PLATFORMS) + 1  # every platform and the tainted one
        assert seen[-1] == (len(PLATFORMS) + 1, True) and brake.selection_problem is None

        wrong = Brake(
            api, scope=scope, node_name=nodes["gke"], cfg=brake_cfg(selectors=["nvidia.com/gpu.present=true"])
        )
        wrong.total()
        assert wrong.selection_problem == "this Node is not among the 1 Nodes node.gpuNodeSelector matches"

        none = Brake(
            api, scope=scope, node_name=nodes["aks"], cfg=brake_cfg(selectors=["test.example/no-such=1"])
        )
        none.total()
        assert none.selection_problem == "node.gpuNodeSelector matches no Node"


def _kustomize_install(kube: Any, tmp: Path, namespace: str, prefix: str) -> list[dict[str, Any]]:
    """`kubectl apply -k` of an overlay that renames the install (what `kustomize edit set
    namespace` and `edit set nameprefix` write into a kustomization)."""
    overlay = tmp / "overlay"
    overlay.mkdir()
    (overlay / "base").symlink_to(MANIFESTS)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["base"], "namespace": namespace, "namePrefix": prefix})
    )
    built = list(yaml_safe.load_all(kube.kubectl("kustomize", str(overlay)).stdout))
    kube.kubectl("apply", "--server-side", "-k", str(overlay))
    return built


@pytest.fixture(scope="module")
def renamed(kube_controllers: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    kube = kube_controllers
    ns, prefix = unique_name("gpuhc-renamed", max_len=30), "team-"
    built = _kustomize_install(kube, tmp_path_factory.mktemp("kz"), ns, prefix)
    yield {"kube": kube, "ns": ns, "prefix": prefix, "built": built}
    for doc in built:
        if doc["kind"] in (
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            kube.kubectl(
                "delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found", check=False
            )
    kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def _daemon_pods(kube: Any, ns: str) -> dict[str, dict[str, int]]:
    """DaemonSet name -> {node the pod is made for -> pod count} (pods the controller created)."""
    status, doc = kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
    assert status == 200
    out: dict[str, dict[str, int]] = {}
    for pod in doc["items"]:
        owner = pod["metadata"]["ownerReferences"][0]["name"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (node,) = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"]
        out.setdefault(owner, {}).setdefault(node, 0)
        out[owner][node] += 1
    return out


@pytest.mark.kube
def test_one_agent_and_one_engine_pod_on_every_gpu_node_none_on_a_cpu_node(
    renamed: dict[str, Any], nodes: dict[str, str]
) -> None:
    kube, ns, prefix = renamed["kube"], renamed["ns"], renamed["prefix"]
    dsc = kube.plane.launch_controller_manager(unique_name("kcm-ds"), ["daemonset-controller"])
    try:
        want = {n for k, n in nodes.items() if k not in ("cpu", "pool")}
        deadline = time.monotonic() + 60
        while True:
            pods = _daemon_pods(kube, ns)
            mine = {
                ds: {n: c for n, c in per.items() if n in set(nodes.values())} for ds, per in pods.items()
            }
            agent, engine = (
                mine.get(f"{prefix}gpu-healthcheck-agent", {}),
                mine.get(f"{prefix}nvidia-dcgm", {}),
            )
            if (set(agent) >= want and set(engine) >= want) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(2)  # let the controller settle: no second pod may appear
        pods = _daemon_pods(kube, ns)
        for ds in (f"{prefix}gpu-healthcheck-agent", f"{prefix}nvidia-dcgm"):
            per = {n: c for n, c in pods.get(ds, {}).items() if n in set(nodes.values())}
            assert per == dict.fromkeys(sorted(want), 1), (ds, per, dsc.tail())
            assert nodes["cpu"] not in per
    finally:
        dsc.stop()


@pytest.mark.kube
def test_the_fence_follows_a_renamed_install(renamed: dict[str, Any], gpu_node: Any) -> None:
    """After `namespace:` and `namePrefix:` the renamed agent's token is still refused on another
    Node and for a foreign key, by the renamed policy, and the agent's own proof says fenced."""
    kube, ns, prefix = renamed["kube"], renamed["ns"], renamed["prefix"]
    names = {d["kind"]: d["metadata"]["name"] for d in renamed["built"]}
    assert names["ServiceAccount"].startswith(prefix)
    node, other = gpu_node().metadata.name, gpu_node().metadata.name
    token = kube.token_for(
        ns, f"{prefix}gpu-healthcheck-agent", bound_node=node, expiration=600, create=False
    )
    deadline = time.monotonic() + 30
    while True:  # a new policy is enforced once the API server's informer has it
        status, body = kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"labels": {"team": "x"}}},
            token=token,
            content_type=MERGE,
        )
        if status == 403 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 403 and "only labels under gpu-healthcheck/" in json.dumps(body), body
    status, body = kube.request(
        "PATCH",
        f"/api/v1/nodes/{other}",
        {"metadata": {"labels": {KEYS.status: "fail"}}},
        token=token,
        content_type=MERGE,
    )
    assert status == 403 and "only the Node its token is bound to" in json.dumps(body), body
    with kube.api_client_for_token(token) as api:
        proof = prove_fence(api, node, KEYS.prefix)
    assert proof.result is FenceResult.FENCED, proof.detail


@pytest.mark.kube
def test_the_fence_refuses_addresses_finalizers_and_owner_references(
    renamed: dict[str, Any], gpu_node: Any
) -> None:
    kube, ns, prefix = renamed["kube"], renamed["ns"], renamed["prefix"]
    node = gpu_node().metadata.name
    token = kube.token_for(
        ns, f"{prefix}gpu-healthcheck-agent", bound_node=node, expiration=600, create=False
    )
    ref = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "name": "x",
        "uid": "00000000-0000-0000-0000-000000000001",
    }
    for path, body in (
        (f"/api/v1/nodes/{node}", {"metadata": {"finalizers": ["example.com/keep"]}}),
        (f"/api/v1/nodes/{node}", {"metadata": {"ownerReferences": [ref]}}),
        (
            f"/api/v1/nodes/{node}/status",
            {"status": {"addresses": [{"type": "Hostname", "address": "evil"}]}},
        ),
    ):
        status, answer = kube.request("PATCH", path, body, token=token, content_type=MERGE)
        assert status == 403 and "addresses, finalizers or ownerReferences" in json.dumps(answer), (
            path,
            answer,
        )


@pytest.mark.kube
def test_an_unfenced_identity_is_reported_and_a_wildcard_one_is_not_fenced(
    kube_controllers: Any, gpu_node: Any, kube_namespace: str
) -> None:
    """An identity that may patch Nodes but lacks the fence's mark: the proof says unfenced (and the
    dry runs wrote nothing). One granted everything is not fenced (its writes land)."""
    kube = kube_controllers
    node, other = gpu_node().metadata.name, gpu_node().metadata.name
    for name, rules in (
        ("plain-patcher", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]),
        ("wildcard", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    ):
        role = f"{kube_namespace}-{name}"
        rbac = "rbac.authorization.k8s.io"
        cluster_role = {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": role}}
        binding = {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": kube_namespace}],
        }
        kube.kubectl(
            "create", "-f", "-", input=yaml.safe_dump_all([{**cluster_role, "rules": rules}, binding])
        )
    plain = kube.token_for(kube_namespace, "plain-patcher", bound_node=node, expiration=600)
    with kube.api_client_for_token(plain) as api:
        proof = prove_fence(api, node, KEYS.prefix)
    assert proof.result is FenceResult.UNFENCED, proof.detail
    assert "is not installed or does not match" in proof.detail
    status, got = kube.request("GET", f"/api/v1/nodes/{node}")
    assert "gpu-healthcheck.invalid/fence-probe" not in got["metadata"].get("labels", {})  # dry run
    wild = kube.token_for(kube_namespace, "wildcard", bound_node=node, expiration=600)
    status, _ = kube.request(
        "PATCH",
        f"/api/v1/nodes/{other}",
        {"metadata": {"labels": {"team": "x"}}},
        token=wild,
        content_type=MERGE,
    )
    assert status == 200  # an admin-like identity is not fenced by our policy


@pytest.mark.kube
def test_the_agent_logs_and_exports_its_fence(renamed: dict[str, Any], gpu_node: Any, tmp_path: Path) -> None:
    kube, ns, prefix = renamed["kube"], renamed["ns"], renamed["prefix"]
    node = gpu_node().metadata.name
    token = kube.token_for(
        ns, f"{prefix}gpu-healthcheck-agent", bound_node=node, expiration=600, create=False
    )
    kcfg = kube.kubeconfig_for_token(token)
    snap = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
    argv = [sys.executable, "-m", "agent.cli", "agent", "--node", node, "--from-snapshot", str(snap)]
    argv += ["--kubeconfig", str(kcfg), "--metrics-port", "0", "--once"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "fence: foreign keys and other Nodes are refused" in out or "fence: could not prove" in out, out[
        -3000:
    ]
    assert "UNFENCED" not in out
