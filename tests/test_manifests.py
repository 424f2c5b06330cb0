"""manifests/: what a user installs with `kubectl apply -f manifests/`.

Plain tests read the YAML (ConfigMap in sync with config/, no subPath, probes, tolerations, pinned
images). `kube` tests apply it to the real API server and run the agent process under a token of the
manifests' own ServiceAccount: the grants suffice (a full cycle writes every mark) and are least
(delete, Secrets, another Node, a foreign key, cordoning are all refused, by RBAC or by the VAP).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import agent
from agent.config import load_config_dir, yaml_safe
from agent.core.gpu_nodes import node_selector_terms
from agent.core.node_keys import DEFAULT_CONDITION_TYPE, TRACK_LABEL, TRUE, EventReason, Keys
from agent.core.record_kind import AGENT_RECORD_KINDS, SLOT_POLICY_KINDS, RecordKind

ROOT = Path(__file__).parent.parent
MANIFESTS = ROOT / "manifests"
CONFIG = ROOT / "config"
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
NS = "gpu-healthcheck"
SA = "gpu-healthcheck-agent"
KEYS = Keys()
PREFIX = f"{KEYS.prefix}/"
TAINT = KEYS.taint
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def docs(path: Path) -> list[dict[str, Any]]:
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    out = []
    for f in files:
        out.extend(d for d in yaml_safe.load_all(f.read_text()) if d is not None)
    return out


ALL = docs(MANIFESTS)


def find(kind: str, name: str, items: list[dict[str, Any]] = ALL) -> dict[str, Any]:
    return next(d for d in items if d["kind"] == kind and d["metadata"]["name"] == name)


def daemonsets() -> list[dict[str, Any]]:
    return [d for d in ALL if d["kind"] == "DaemonSet"]


def walk(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k, v
            yield from walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v)


def gen_module() -> Any:
    spec = importlib.util.spec_from_file_location("gen_configmap", ROOT / "scripts" / "gen-configmap.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------------- plain


def test_configmap_is_generated_and_current() -> None:
    assert (MANIFESTS / "20-configmap.yaml").read_text() == gen_module().render(CONFIG)


def test_configmap_keys_equal_config_files_byte_for_byte() -> None:
    data = find("ConfigMap", "gpu-healthcheck-config")["data"]
    assert set(data) == {"config.yaml", "instance-profiles.yaml", "xid-catalog.yaml", "dcgm-incidents.yaml"}
    for key, text in data.items():
        assert text == (CONFIG / key).read_text(), key


def test_configmap_files_pass_the_agents_validator(tmp_path: Path) -> None:
    for key, text in find("ConfigMap", "gpu-healthcheck-config")["data"].items():
        (tmp_path / key).write_text(text)
    cfg = load_config_dir(tmp_path)
    assert cfg.prefix == "gpu-healthcheck"
    assert cfg.dcgm.address == "nvidia-dcgm.gpu-healthcheck.svc:5555"


def test_every_manifest_parses_with_kind_and_namespace() -> None:
    everything = ALL + docs(MANIFESTS / "optional") + docs(MANIFESTS / "jobs")
    assert len(everything) >= 25
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    cluster_scoped |= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for d in everything:
        assert d.get("apiVersion") and d.get("kind"), d
        if d["kind"] not in cluster_scoped:
            ns = d["metadata"].get("namespace")
            # Events about a Node live in `default`: the agent's Role for them must too
            assert ns == NS or (d["kind"] in ("Role", "RoleBinding") and ns == "default"), d["metadata"]


def test_kustomization_lists_every_top_level_manifest() -> None:
    kust = yaml_safe.load((MANIFESTS / "Kustomization").read_text())
    assert kust["resources"] == sorted(p.name for p in MANIFESTS.glob("*.yaml"))
    assert not (MANIFESTS / "kustomization.yaml").exists()  # would break `kubectl apply -f manifests/`


def test_no_subpath_anywhere() -> None:
    everything = ALL + docs(MANIFESTS / "optional") + docs(MANIFESTS / "jobs")
    assert not [v for k, v in walk(everything) if k in ("subPath", "subPathExpr")]


def test_agent_daemonset_contract() -> None:
    ds = find("DaemonSet", "gpu-healthcheck-agent")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert spec["serviceAccountName"] == SA
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    port = yaml_safe.load((CONFIG / "config.yaml").read_text())["metrics"]["port"]
    assert port == 9402 and c["ports"][0]["containerPort"] == port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert mounts["config"]["mountPath"] == "/etc/gpu-healthcheck" and mounts["config"]["readOnly"]
    assert vols["config"]["configMap"]["name"] == "gpu-healthcheck-config"
    assert mounts["kmsg"]["mountPath"] == "/dev/kmsg" and mounts["kmsg"]["readOnly"]
    assert vols["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mounts["sys"]["mountPath"] == "/sys" and mounts["sys"]["readOnly"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")


def test_daemonsets_run_on_every_gpu_node_whatever_its_taints() -> None:
    """The DaemonSets select GPU nodes as the brake and `status` do (core/gpu_nodes.py, with the
    profiles' instance types) and tolerate every taint; gen-configmap.py writes both."""
    assert {d["metadata"]["name"] for d in daemonsets()} == {
        "gpu-healthcheck-agent",
        "nvidia-dcgm",
        "dcgm-exporter",
    }
    want = node_selector_terms(load_config_dir(CONFIG).gpu_node_selection)
    # The agent's two DaemonSets split the GPU nodes by the image canary's label: one agent a node.
    canary = find("DaemonSet", "gpu-healthcheck-agent-canary", docs(MANIFESTS / "optional"))
    track = {"gpu-healthcheck-agent": "NotIn", "gpu-healthcheck-agent-canary": "In"}
    for ds in [*daemonsets(), canary]:
        spec = ds["spec"]["template"]["spec"]
        assert spec["tolerations"] == [{"operator": "Exists"}], ds["metadata"]["name"]
        assert "nodeSelector" not in spec
        req = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        op = track.get(ds["metadata"]["name"])
        extra = [{"key": TRACK_LABEL, "operator": op, "values": ["canary"]}] if op else []
        expected = [{"matchExpressions": [*t["matchExpressions"], *extra]} for t in want]  # type: ignore[list-item]
        assert req["nodeSelectorTerms"] == expected, ds["metadata"]["name"]
        if ds["metadata"]["name"] != "dcgm-exporter":  # the exporter may go first under pressure
            assert spec["priorityClassName"] == "system-node-critical"


def test_gke_quota_admits_the_critical_priority_class() -> None:
    quota = find("ResourceQuota", "gpu-healthcheck-critical-pods")
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert expr["scopeName"] == "PriorityClass" and "system-node-critical" in expr["values"]


def test_the_policies_record_kinds_are_the_vocabulary_s() -> None:
    """The kinds the two Lease policies hold are core/record_kind.py's (gen-configmap writes them),
    and together they cover every kind: a new kind is fenced by one policy or the other."""
    policies = {d["metadata"]["name"]: d for d in ALL if d["kind"] == "ValidatingAdmissionPolicy"}

    def variable(policy: str, name: str) -> list[str]:
        v = next(v for v in policies[policy]["spec"]["variables"] if v["name"] == name)
        return [w.strip(" '") for w in v["expression"].strip("[]").split(",")]

    assert variable("gpu-healthcheck-own-slots", "slotKinds") == list(SLOT_POLICY_KINDS)
    assert variable("gpu-healthcheck-own-records", "slotKinds") == list(SLOT_POLICY_KINDS)
    assert variable("gpu-healthcheck-own-records", "agentKinds") == list(AGENT_RECORD_KINDS)
    assert RecordKind.RELEASE not in AGENT_RECORD_KINDS  # an operator's
    assert set(SLOT_POLICY_KINDS).isdisjoint(AGENT_RECORD_KINDS)


def test_hostengine_daemonset_service_and_networkpolicy() -> None:
    ds = find("DaemonSet", "nvidia-dcgm")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert c["ports"] == [{"name": "dcgm", "containerPort": 5555, "protocol": "TCP"}]
    probe = ["python3", "-m", "hostengine.probe", "--address", "127.0.0.1:5555", "--timeout", "5"]
    assert c["readinessProbe"]["exec"]["command"] == probe  # a real DCGM connection
    assert c["livenessProbe"]["exec"]["command"] == [*probe, "--allow-no-gpu"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["HOSTENGINE_GUARD_LISTEN"] == "$(POD_IP)" and "HOSTENGINE_BIND" not in env
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    sc = c["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert spec["automountServiceAccountToken"] is True  # the guard lists its allowed clients
    role = find("ClusterRole", "nvidia-dcgm")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    svc = find("Service", "nvidia-dcgm")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert svc["spec"]["ports"][0]["port"] == 5555
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    np = find("NetworkPolicy", "nvidia-dcgm")
    assert np["spec"]["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    (rule,) = np["spec"]["ingress"]
    allowed = {p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]}
    assert allowed == {"gpu-healthcheck-agent", "dcgm-exporter", "gpu-healthcheck-quarantine"}
    assert rule["ports"] == [{"port": 5555, "protocol": "TCP"}]


def test_exporter_runs_in_remote_mode_against_the_agents_engine() -> None:
    (c,) = find("DaemonSet", "dcgm-exporter")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    address = yaml_safe.load((CONFIG / "config.yaml").read_text())["dcgm"]["address"]
    assert env["DCGM_REMOTE_HOSTENGINE_INFO"] == address == "nvidia-dcgm.gpu-healthcheck.svc:5555"


def test_images_pinned_by_tag_never_latest() -> None:
    everything = ALL + docs(MANIFESTS / "jobs")
    images = [v for k, v in walk(everything) if k == "image"]
    assert len(images) >= 4
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and "/" in name and tag and tag != "latest", image
    ours = [i for i in images if i.startswith("ghcr.io/gpu-healthcheck/")]
    assert ours and all(i.endswith(f":{agent.__version__}") for i in ours)


def test_rbac_grants_exactly_what_the_agent_needs() -> None:
    role = find("ClusterRole", SA)
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("nodes",)): ["get", "list", "patch", "watch"],
        (("",), ("nodes/status",)): ["patch"],
        (("",), ("pods",)): ["list"],  # this node's pods: a second DCGM engine
        (("resource.k8s.io",), ("resourceslices",)): ["list", "watch"],  # node.isolation: the DRA slices
        (("resource.k8s.io",), ("deviceclasses",)): ["get"],  # gpu.nvidia.com only: the driver wait
        (("resource.k8s.io",), ("devicetaintrules",)): ["create", "delete", "get", "list", "patch"],
        (("fence.gpu-healthcheck.io",), ("nodes",)): ["fenced"],  # the admission fence's mark
    }
    classes = next(r for r in role["rules"] if r["resources"] == ["deviceclasses"])
    assert classes["resourceNames"] == ["gpu.nvidia.com"]
    events = find("Role", "gpu-healthcheck-agent-events")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]
    records = find("Role", "gpu-healthcheck-agent-records")  # the repair budget's, in its own namespace
    assert records["metadata"]["namespace"] == NS
    verbs = ["create", "get", "list", "delete"]
    leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs}
    mark = {"apiGroups": ["fence.gpu-healthcheck.io"], "resources": ["nodes"], "verbs": ["fenced"]}
    daemonsets = {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list"]}  # the brake's total
    assert records["rules"] == [leases, daemonsets, mark]  # the records policy fences whoever holds it


def test_prometheus_rules_name_metrics_the_agent_exports() -> None:
    from agent.reporters.metrics import Metrics

    exported = {m.name for m in Metrics().registry.collect()}
    exported |= {f"{n}{s}" for n in exported for s in ("_total", "_bucket", "_count", "_sum")}
    rules = find("PrometheusRule", "gpu-healthcheck", docs(MANIFESTS / "optional"))["spec"]["groups"][0]
    alerts = {r["alert"]: r["expr"] for r in rules["rules"]}
    assert {"GPUNodeFailing", "GPUNodeUnknownTooLong", "GPUHealthcheckAgentDown"} <= set(alerts)
    assert {"DCGMEngineUnreachable", "GPUHealthcheckBrakeOpen"} <= set(alerts)
    assert {"GPUHealthcheckAgentVanished", "GPUNodeWithoutAgent", "GPUHealthcheckUnfenced"} <= set(alerts)
    assert {"GPUNodeSelectorMissesThisNode"} <= set(alerts)
    import re

    used = {m for e in alerts.values() for m in re.findall(r"\bgpu_healthcheck_[a-z_]+", e)}
    assert used and used <= exported, used - exported
    dash = find("ConfigMap", "gpu-healthcheck-dashboard", docs(MANIFESTS / "optional"))
    panels = json.loads(dash["data"]["gpu-healthcheck.json"])["panels"]
    used = {
        m for p in panels for t in p["targets"] for m in re.findall(r"\bgpu_healthcheck_[a-z_]+", t["expr"])
    }
    assert used and used <= exported, used - exported


def test_quarantine_job_template() -> None:
    job = next(d for d in docs(MANIFESTS / "jobs") if d["kind"] == "Job")
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpu-healthcheck-quarantine"
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "__NODE__"}
    assert spec["containers"][0]["command"] == ["python3", "-m", "agent.cli.quarantine"]
    assert {t["key"] for t in spec["tolerations"]} >= {TAINT, "node.kubernetes.io/unschedulable"}


# ---------------------------------------------------------------------------------------------- kube


def kubectl_ok(kube: Any, *args: str) -> str:
    return str(kube.kubectl(*args).stdout)


@pytest.fixture(scope="module")
def installed(kube: Any) -> Any:
    """The manifests applied server-side once (as a user would); the VAP in force before tests run."""
    out = kubectl_ok(kube, "apply", "--server-side", "-f", str(MANIFESTS))
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-healthcheck-own-node" in out
    return kube


def wait_denied(kube: Any, token: str, node: str) -> None:
    """A fresh VAP is enforced once the API server's informer has it: wait for its first denial."""
    deadline = time.monotonic() + 30
    while True:
        status, _ = kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"labels": {"vap-probe": "x"}}},
            token=token,
            content_type=MERGE,
        )
        if status == 403:
            return
        assert status == 200, status
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"labels": {"vap-probe": None}}},
            content_type=MERGE,
        )
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
        time.sleep(0.5)


@pytest.fixture
def agent_token(installed: Any, gpu_node: Any) -> dict[str, Any]:
    node = gpu_node(
        instance_type="p5.48xlarge",
        gpus=8,
        labels={"team": "ml"},
        taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    )
    other = gpu_node()
    name = node.metadata.name
    token = installed.token_for(NS, SA, bound_node=name, expiration=600, create=False)
    wait_denied(installed, token, name)
    return {"kube": installed, "node": name, "other": other.metadata.name, "token": token}


def node_json(kube: Any, name: str) -> dict[str, Any]:
    status, body = kube.request("GET", f"/api/v1/nodes/{name}")
    assert status == 200
    return body  # type: ignore[no-any-return]


@pytest.mark.kube
def test_apply_f_and_k_succeed_and_agree(installed: Any) -> None:
    out = kubectl_ok(installed, "apply", "-f", str(MANIFESTS))
    assert "daemonset.apps/gpu-healthcheck-agent" in out and "error" not in out.lower()
    out = kubectl_ok(installed, "apply", "-k", str(MANIFESTS))
    assert "configmap/gpu-healthcheck-config" in out
    built = list(yaml_safe.load_all(kubectl_ok(installed, "kustomize", str(MANIFESTS))))
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in ALL
    )
    ds = json.loads(
        kubectl_ok(installed, "-n", NS, "get", "daemonset", "gpu-healthcheck-agent", "-o", "json")
    )
    assert ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9402


@pytest.mark.kube
def test_configmap_on_the_server_passes_the_validator(installed: Any, tmp_path: Path) -> None:
    cm = json.loads(
        kubectl_ok(installed, "-n", NS, "get", "configmap", "gpu-healthcheck-config", "-o", "json")
    )
    for key, text in cm["data"].items():
        assert text == (CONFIG / key).read_text()
        (tmp_path / key).write_text(text)
    assert load_config_dir(tmp_path).metrics_port == 9402


@pytest.mark.kube
def test_optional_and_job_manifests_validate(installed: Any, tmp_path: Path) -> None:
    out = kubectl_ok(
        installed, "apply", "--dry-run=server", "-f", str(MANIFESTS / "optional" / "grafana-dashboard.yaml")
    )
    assert "configmap/gpu-healthcheck-dashboard created (server dry run)" in out
    kubectl_ok(installed, "apply", "--server-side", "-f", str(MANIFESTS / "jobs" / "quarantine-rbac.yaml"))
    job = (MANIFESTS / "jobs" / "quarantine-job.yaml").read_text()
    job = job.replace("__NODE__", "some-node").replace("__LEVEL__", "3")
    out = str(installed.kubectl("create", "--dry-run=server", "-f", "-", input=job).stdout)
    assert "job.batch/gpu-quarantine-" in out and "(server dry run)" in out


@pytest.mark.kube
def test_rbac_grants_are_exactly_the_agents_needs(agent_token: dict[str, Any]) -> None:
    kube = agent_token["kube"]
    kcfg = kube.kubeconfig_for_token(agent_token["token"])

    def can(*args: str) -> bool:
        return kube.kubectl("auth", "can-i", *args, kubeconfig=kcfg, check=False).stdout.strip() == "yes"

    for allowed in (
        ("get", "nodes"), ("list", "nodes"), ("watch", "nodes"), ("patch", "nodes"),
        ("patch", "nodes", "--subresource=status"), ("create", "events", "-n", "default"),
        ("patch", "events", "-n", "default"), ("list", "pods", "--all-namespaces"),
    ):  # fmt: skip
        assert can(*allowed), allowed
    for refused in (
        ("delete", "nodes"), ("create", "nodes"), ("update", "nodes"), ("get", "secrets", "-n", NS),
        ("list", "secrets", "--all-namespaces"), ("get", "pods", "-n", NS), ("create", "events", "-n", NS),
        ("delete", "pods", "-n", NS), ("get", "configmaps", "-n", NS), ("create", "pods/eviction", "-n", NS),
    ):  # fmt: skip
        assert not can(*refused), refused


@pytest.mark.kube
def test_agent_full_cycle_under_the_manifests_token(agent_token: dict[str, Any], tmp_path: Path) -> None:
    kube, name = agent_token["kube"], agent_token["node"]
    cm = json.loads(kubectl_ok(kube, "-n", NS, "get", "configmap", "gpu-healthcheck-config", "-o", "json"))
    cfg_dir = tmp_path / "config"
    cfg_dir.mkdir()
    for key, text in cm["data"].items():
        (cfg_dir / key).write_text(text)
    # The ConfigMap as installed, but with the brake off: Nodes other tests leave behind must not
    # decide whether this one is tainted (the brake's own metadata-only count still runs).
    conf = yaml_safe.load(cm["data"]["config.yaml"])
    conf["node"]["maxTaintedFraction"] = 1.0
    (cfg_dir / "config.yaml").write_text(yaml.safe_dump(conf))
    kcfg = kube.kubeconfig_for_token(agent_token["token"])
    argv = [sys.executable, "-m", "agent.cli", "agent", "--node", name, "--from-snapshot", str(XID79)]
    argv += ["--kubeconfig", str(kcfg), "--config-dir", str(cfg_dir), "--metrics-port", "0", "--once"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "API error 403" not in out and "Forbidden" not in out  # (the node's random name may hold "403")

    node = node_json(kube, name)
    labels, ann = node["metadata"]["labels"], node["metadata"]["annotations"]
    assert labels[KEYS.status] == "fail"
    assert labels[KEYS.severity] == "reboot"
    assert labels[KEYS.tainted] == TRUE
    assert labels["team"] == "ml"  # others' keys survive
    assert json.loads(ann[KEYS.results])["status"] == "fail"
    taints = {t["key"]: t for t in node["spec"]["taints"]}
    assert taints[TAINT]["value"] == "reboot" and taints[TAINT]["effect"] == "NoSchedule"
    assert taints["nvidia.com/gpu"]["value"] == "present"
    cond = next(c for c in node["status"]["conditions"] if c["type"] == DEFAULT_CONDITION_TYPE)
    assert cond["status"] == "False"
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    ev = json.loads(
        kubectl_ok(
            kube,
            "-n",
            "default",
            "get",
            "events",
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        )
    )
    reasons = {e["reason"] for e in ev["items"]}
    assert EventReason.TAINT_ADDED in reasons, reasons


@pytest.mark.kube
def test_the_fenced_agent_lifts_its_validating_taint_and_no_other(
    agent_token: dict[str, Any], tmp_path: Path
) -> None:
    """The startup taint the kubelet (or Karpenter) registered: the agent, under the manifests' fenced
    token, lifts it after a pass (a guarded write of the Node's own list, only ours changed); the
    fence lets it change that key and refuses a write that drops NVIDIA's taint."""
    kube, name, tok = agent_token["kube"], agent_token["node"], agent_token["token"]
    own = f"/api/v1/nodes/{name}"
    validating = {"key": KEYS.validating, "effect": "NoSchedule"}
    status, _ = kube.request(
        "PATCH",
        own,
        {"spec": {"taints": [*node_json(kube, name)["spec"]["taints"], validating]}},
        content_type=MERGE,
    )
    assert status == 200
    before = node_json(kube, name)["spec"]["taints"]
    others = [t for t in before if t["key"] != KEYS.validating]
    # the fence: not NVIDIA's taint, even beside ours
    status, body = patch(agent_token, own, {"spec": {"taints": [validating]}})
    assert status == 403 and "only its own taints" in json.dumps(body), body
    cfg_dir = tmp_path / "config"
    cfg_dir.mkdir()
    (cfg_dir / "config.yaml").write_text(yaml.safe_dump({"node": {"maxTaintedFraction": 1.0}}))
    healthy = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
    kcfg = kube.kubeconfig_for_token(tok)
    argv = [sys.executable, "-m", "agent.cli", "agent", "--node", name, "--from-snapshot", str(healthy)]
    argv += ["--kubeconfig", str(kcfg), "--config-dir", str(cfg_dir), "--metrics-port", "0", "--once"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "API error 403" not in out and "Forbidden" not in out, out[-3000:]
    assert node_json(kube, name)["spec"]["taints"] == others, out[-3000:]  # ours gone, the rest in place
    # and the fence lets it put the taint back (node.validate.addTaint)
    assert patch(agent_token, own, {"spec": {"taints": [*others, validating]}})[0] == 200


def patch(
    ctx: dict[str, Any], path: str, body: Any, ctype: str = MERGE, token: str | None = None
) -> tuple[int, Any]:
    return ctx["kube"].request("PATCH", path, body, token=token or ctx["token"], content_type=ctype)  # type: ignore[no-any-return]


@pytest.mark.kube
def test_least_privilege_refusals(agent_token: dict[str, Any]) -> None:
    kube, name, other = agent_token["kube"], agent_token["node"], agent_token["other"]
    tok = agent_token["token"]
    own = f"/api/v1/nodes/{name}"

    # the agent's normal writes pass: a label, an annotation, our taint, our condition, an Event
    taints = [
        *node_json(kube, name)["spec"]["taints"],
        {"key": TAINT, "value": "reset", "effect": "NoSchedule"},
    ]
    body = {
        "metadata": {
            "labels": {KEYS.status: "fail"},
            "annotations": {KEYS.results: "{}"},
        }
    }
    assert patch(agent_token, own, {**body, "spec": {"taints": taints}})[0] == 200
    cond = {"type": "GPUHealthy", "status": "False", "reason": "GPUFailing", "message": "test"}
    assert patch(agent_token, own + "/status", {"status": {"conditions": [cond]}}, STRATEGIC)[0] == 200
    event = {
        "metadata": {"generateName": f"{name}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name},
        "reason": "Test", "message": "m", "type": "Normal", "source": {"component": "gpu-healthcheck"},
    }  # fmt: skip
    assert kube.request("POST", "/api/v1/namespaces/default/events", event, token=tok)[0] == 201

    def denied(status_body: tuple[int, Any], why: str) -> None:
        status, body = status_body
        assert status == 403, (status, body)
        assert why in json.dumps(body), body

    # RBAC
    denied(kube.request("DELETE", own, token=tok), "cannot delete resource")
    denied(kube.request("GET", f"/api/v1/namespaces/{NS}/secrets", token=tok), "cannot list resource")
    denied(kube.request("GET", "/api/v1/namespaces/kube-system/secrets/x", token=tok), "cannot get resource")
    # the VAP: another Node, even with our own keys, and through its status
    denied(patch(agent_token, f"/api/v1/nodes/{other}", body), "only the Node its token is bound to")
    denied(
        patch(agent_token, f"/api/v1/nodes/{other}/status", {"status": {"conditions": [cond]}}, STRATEGIC),
        "only the Node its token is bound to",
    )
    # the VAP: on its own Node, keys outside the prefix, other taints, cordoning, others' conditions
    denied(
        patch(agent_token, own, {"metadata": {"labels": {"team": "x"}}}), "only labels under gpu-healthcheck/"
    )
    denied(
        patch(agent_token, own, {"metadata": {"labels": {"new": "x"}}}), "only labels under gpu-healthcheck/"
    )
    denied(
        patch(agent_token, own, {"metadata": {"labels": {"team": None}}}),
        "only labels under gpu-healthcheck/",
    )
    denied(patch(agent_token, own, {"metadata": {"annotations": {"x/y": "1"}}}), "only annotations under")
    mine = [t for t in node_json(kube, name)["spec"]["taints"] if t["key"] == TAINT]
    denied(patch(agent_token, own, {"spec": {"taints": mine}}), "only its own taint")
    denied(patch(agent_token, own, {"spec": {"unschedulable": True}}), "never cordons")
    ready = {"type": "Ready", "status": "False", "reason": "X", "message": "x"}
    denied(patch(agent_token, own + "/status", {"status": {"conditions": [ready]}}, STRATEGIC), "GPUHealthy")
    alloc = {"status": {"allocatable": {"nvidia.com/gpu": "0"}}}
    denied(patch(agent_token, own + "/status", alloc, STRATEGIC), "capacity or allocatable")
    # Events about another Node
    ev_other = {**event, "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": other}}
    denied(
        kube.request("POST", "/api/v1/namespaces/default/events", ev_other, token=tok), "only about the Node"
    )
    # a token of the same ServiceAccount that is not bound to a Node may change no Node at all
    unbound = kube.token_for(NS, SA, expiration=600, create=False)
    ours = {"metadata": {"labels": {KEYS.status: "pass"}}}
    denied(patch(agent_token, own, ours, token=unbound), "no node-name claim")
    # nothing of the above got through
    node = node_json(kube, name)
    assert node["metadata"]["labels"]["team"] == "ml" and not node["spec"].get("unschedulable")
    assert "x/y" not in node["metadata"]["annotations"]
    assert next(c for c in node["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    assert KEYS.status not in node_json(kube, other)["metadata"].get("labels", {})
