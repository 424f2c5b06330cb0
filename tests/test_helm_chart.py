"""The Helm chart is the install: with its default values it renders exactly manifests/, its values
change what they say (images, the DCGM engine, the policy, monitoring), `helm lint` passes, and a real
`helm install` on the test API server succeeds. helm is built from Go modules (scripts/build-helm.sh),
as the Kubernetes test binaries are."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent import __version__
from agent.config import yaml_safe
from tests.kubeenv.binaries import built_go_tool, pinned_k8s_version

ROOT = Path(__file__).parent.parent
CHART = ROOT / "charts" / "gpu-healthcheck"
MANIFESTS = ROOT / "manifests"
KUBE_VERSION = pinned_k8s_version().removeprefix("v")  # the suite's kube-apiserver


@pytest.fixture(scope="session")
def helm() -> str:
    return built_go_tool("build-helm.sh")


def render(helm: str, *sets: str, namespace: str = "gpu-healthcheck") -> list[dict[str, Any]]:
    argv = [helm, "template", "gpu-healthcheck", str(CHART), "--namespace", namespace]
    argv += ["--kube-version", KUBE_VERSION]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    return [d for d in yaml_safe.load_all(out) if d]


def key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])


def manifests(folder: Path = MANIFESTS) -> dict[tuple[str, str, str], dict[str, Any]]:
    docs = [d for f in sorted(folder.glob("*.yaml")) for d in yaml_safe.load_all(f.read_text()) if d]
    return {key(d): d for d in docs}


def test_the_default_rendering_is_manifests(helm: str) -> None:
    rendered = {key(d): d for d in render(helm)}
    assert rendered.keys() == manifests().keys()
    for k, doc in rendered.items():
        assert doc == manifests()[k], k


MAIN_IMAGE = f"ghcr.io/gpu-healthcheck/agent:{__version__}"


def test_monitoring_and_the_canary_render_the_optional_objects(helm: str) -> None:
    """manifests/optional/ is the rendering of monitoring.enabled and canary.image (set to the main
    image: the shipped canary runs it on no node until one is labelled)."""
    sets = ("monitoring.enabled=true", f"canary.image={MAIN_IMAGE}", "sdcProbe.enabled=true")
    rendered = {key(d): d for d in render(helm, *sets)}
    optional = manifests(MANIFESTS / "optional")
    assert rendered.keys() - manifests().keys() == optional.keys()
    canary = ("DaemonSet", "gpu-healthcheck", "gpu-healthcheck-agent-canary")
    assert rendered[canary] == optional[canary]
    sdc = {k for k in optional if k[2] == "gpu-healthcheck-sdcprobe"}  # the SDC probe: sdcProbe.enabled
    assert {k[0] for k in sdc} == {"DaemonSet", "Service", "NetworkPolicy"}
    assert all(rendered[k] == optional[k] for k in sdc)
    monitoring = {key(d) for d in render(helm, "monitoring.enabled=true")} - manifests().keys()
    assert monitoring == optional.keys() - {canary} - sdc


def affinity_terms(ds: dict[str, Any]) -> list[list[dict[str, Any]]]:
    spec = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    return [
        t["matchExpressions"]
        for t in spec["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ]


TRACK = {"key": "gpu-healthcheck/track", "values": ["canary"]}


def test_the_image_canary_is_the_agent_with_its_own_image_on_the_canary_nodes_only(helm: str) -> None:
    """canary.image: a second DaemonSet, the main one's twin but for its name, track label, selector,
    image and the track expression (In where the main one has NotIn, in every term), so that a node
    runs exactly one of them; none by default; with `scheduling` set too."""
    by = {
        (d["kind"], d["metadata"]["name"]): d
        for d in render(helm, "canary.image=registry.example/agent:0.2.1")
    }
    main, canary = (
        by[("DaemonSet", "gpu-healthcheck-agent")],
        by[("DaemonSet", "gpu-healthcheck-agent-canary")],
    )
    assert all({**TRACK, "operator": "NotIn"} in t for t in affinity_terms(main))
    assert all({**TRACK, "operator": "In"} in t for t in affinity_terms(canary))
    assert len(affinity_terms(main)) == len(affinity_terms(canary)) > 1
    (c,) = canary["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.example/agent:0.2.1"
    assert canary["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpu-healthcheck-agent",  # status, the PodMonitor and the guards see it
        "gpu-healthcheck/track": "canary",
    }
    assert canary["spec"]["minReadySeconds"] == main["spec"]["minReadySeconds"] == 180
    twin = json.loads(json.dumps(canary))
    twin["metadata"]["name"] = main["metadata"]["name"]
    for labels in (twin["metadata"]["labels"], twin["spec"]["selector"]["matchLabels"]):
        del labels["gpu-healthcheck/track"]
    del twin["spec"]["template"]["metadata"]["labels"]["gpu-healthcheck/track"]
    twin["spec"]["template"]["spec"]["containers"][0]["image"] = main["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    for term in affinity_terms(twin):
        for expr in term:
            if expr["key"] == "gpu-healthcheck/track":
                expr["operator"] = "NotIn"
    assert twin == main
    assert ("DaemonSet", "gpu-healthcheck-agent-canary") not in {
        (d["kind"], d["metadata"]["name"]) for d in render(helm)
    }

    scheduled = {
        d["metadata"]["name"]: d
        for d in render(helm, "canary.image=x/agent:1", "scheduling.nodeSelector.pool=gpu")
        if d["kind"] == "DaemonSet"
    }
    for name, op in (("gpu-healthcheck-agent", "NotIn"), ("gpu-healthcheck-agent-canary", "In")):
        spec = scheduled[name]["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"pool": "gpu"} and affinity_terms(scheduled[name]) == [
            [{**TRACK, "operator": op}]
        ]


def test_values_change_images_engine_and_policy(helm: str) -> None:
    docs = render(
        helm,
        "image.registry=registry.example/gpu",
        "image.tag=9.9.9",
        "dcgm.engine=operator-standalone",
        "mode=observe",
        "isolation=auto",
        "taintEffectBySeverity.isolate=NoExecute",
        namespace="gpu-health",
    )
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("DaemonSet", "nvidia-dcgm") not in kinds and ("DaemonSet", "dcgm-exporter") not in kinds
    agent = next(
        d for d in docs if (d["kind"], d["metadata"]["name"]) == ("DaemonSet", "gpu-healthcheck-agent")
    )
    (c,) = agent["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.example/gpu/agent:9.9.9" and agent["metadata"]["namespace"] == "gpu-health"
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg = yaml_safe.load(cm["data"]["config.yaml"])
    assert cfg["dcgm"]["address"] == "nvidia-dcgm.gpu-operator.svc:5555"
    assert cfg["node"]["mode"] == "observe" and cfg["node"]["taintEffectBySeverity"] == {
        "isolate": "NoExecute"
    }
    assert cfg["node"]["isolation"] == "auto"
    assert cfg["node"]["taintMinSeverity"] == "reset"  # untouched keys keep the shipped value
    ours = {key(d): d for d in render(helm, namespace="gpu-health")}
    address = yaml_safe.load(
        next(d for d in ours.values() if d["kind"] == "ConfigMap")["data"]["config.yaml"]
    )
    assert (
        address["dcgm"]["address"] == "nvidia-dcgm.gpu-health.svc:5555"
    )  # our engine, in the release's namespace


def policy_types(docs: list[dict[str, Any]], variable: str = "conditionTypes") -> str:
    """The CEL list of condition types (or another variable) in the rendered admission policy."""
    policy = next(
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "gpu-healthcheck-own-node"
    )
    return str(next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == variable))


def config_of(docs: list[dict[str, Any]]) -> str:
    return str(
        next(
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpu-healthcheck-config"
        )["data"]["config.yaml"]
    )


def test_remediation_conditions_from_the_values_are_what_the_fence_lists(helm: str, tmp_path: Path) -> None:
    """`remediationConditions` lands in config.yaml, and the admission policy lists exactly the types
    of that config (no parameter object: nothing namespaced can make the policy refuse anyone)."""
    from agent.config import load_config_dir

    values = tmp_path / "values.yaml"
    values.write_text(
        "remediationConditions:\n"
        "  - {type: AcceleratedHardwareReady, unhealthyStatus: 'False', minSeverity: reset}\n"
        "  - {type: example.com/GPUReplace, unhealthyStatus: 'True', minSeverity: isolate}\n"
    )
    argv = [helm, "template", "gpu-healthcheck", str(CHART), "--namespace", "gpu-health"]
    argv += ["--kube-version", KUBE_VERSION, "-f", str(values)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml_safe.load_all(out) if d]
    (tmp_path / "config.yaml").write_text(config_of(docs))
    entries = load_config_dir(tmp_path).node.remediation_conditions  # the agent's own load accepts it
    assert [(c.type, c.unhealthy_status, c.min_severity.label) for c in entries] == [
        ("AcceleratedHardwareReady", "False", "reset"),
        ("example.com/GPUReplace", "True", "isolate"),
    ]
    assert policy_types(docs) == "['GPUHealthy', 'AcceleratedHardwareReady', 'example.com/GPUReplace']"
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert "paramRef" not in binding["spec"]
    assert not any("paramKind" in d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy")


CONFIG_VALUES = """\
config:
  prefix: gpu.example.com
  intervals: {gpu: 45}
  timeouts: {nvidiaSmi: 7}
  node:
    mode: label
    conditionType: example.com/GPUOk
    maxTaintedFraction: 0
    remediationConditions:
      - {type: AcceleratedHardwareReady, unhealthyStatus: "False", minSeverity: reset}
mode: observe      # the shortcut; config.node.mode wins
"""


def test_config_values_merge_into_config_yaml_and_the_fence(helm: str, tmp_path: Path) -> None:
    """Every key of config.yaml is settable through `config:` (merged key by key into the shipped
    file, false and 0 included); the others keep the shipped value; the policy lists the merged types."""
    from agent.config import load_config_dir
    from agent.config.fence_view import condition_types

    values = tmp_path / "values.yaml"
    values.write_text(CONFIG_VALUES)
    argv = [helm, "template", "gpu-healthcheck", str(CHART), "--namespace", "gpu-health"]
    argv += ["--kube-version", KUBE_VERSION, "-f", str(values), "--set", "config.checks.efa=false"]
    docs = [
        d
        for d in yaml_safe.load_all(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        if d
    ]
    (tmp_path / "config.yaml").write_text(config_of(docs))
    cfg = load_config_dir(tmp_path)  # the agent accepts the merged file
    shipped = load_config_dir(ROOT / "config")
    assert cfg.intervals.gpu == 45 and cfg.timeouts.nvidia_smi == 7 and cfg.node.mode == "label"
    assert cfg.node.max_tainted_fraction == 0 and not cfg.enabled("efa")
    assert cfg.dcgm.address == "nvidia-dcgm.gpu-health.svc:5555"  # the release's engine, as without config
    assert cfg.intervals.topology == shipped.intervals.topology and cfg.profiles == shipped.profiles
    assert condition_types(cfg.node) == ["example.com/GPUOk", "AcceleratedHardwareReady"]
    assert policy_types(docs) == "['example.com/GPUOk', 'AcceleratedHardwareReady']"
    assert cfg.prefix == "gpu.example.com" and policy_types(docs, "prefix") == "'gpu.example.com/'"


@pytest.mark.parametrize(
    ("value", "why"),
    [("config.node.conditionType=it's", "is not a condition type"), ("config.prefix=a'b", "not a label key")],
)
def test_a_config_value_the_policy_cannot_hold_fails_the_render(helm: str, value: str, why: str) -> None:
    argv = [helm, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, "--set", value]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and why in proc.stderr, proc.stderr


def test_helm_lint(helm: str) -> None:
    proc = subprocess.run([helm, "lint", str(CHART)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.kube
def test_helm_install_on_the_api_server(helm: str, kube: Any, tmp_path: Path) -> None:
    """A real install, on an API server of its own: the session's already holds manifests/'s
    cluster-wide objects, which a release may not take over."""
    from tests.kubeenv.env import KubeEnv
    from tests.kubeenv.server import ControlPlane

    plane = ControlPlane(kube.binaries)
    plane.start()
    own = KubeEnv(plane)
    try:
        env = dict(os.environ, KUBECONFIG=str(own.kubeconfig), HELM_CACHE_HOME=str(tmp_path / "cache"))
        env.update(HELM_CONFIG_HOME=str(tmp_path / "config"), HELM_DATA_HOME=str(tmp_path / "data"))
        values = tmp_path / "values.yaml"
        values.write_text(CONFIG_VALUES)
        argv = [helm, "install", "ghc", str(CHART), "--namespace", "gpuhc", "--create-namespace"]
        argv += ["--set", "createNamespace=false", "--set", "monitoring.enabled=false", "-f", str(values)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ds = own.kubectl("-n", "gpuhc", "get", "daemonset", "-o", "name").stdout.split()
        assert sorted(ds) == [
            "daemonset.apps/dcgm-exporter",
            "daemonset.apps/gpu-healthcheck-agent",
            "daemonset.apps/nvidia-dcgm",
        ]
        vap = own.kubectl("get", "validatingadmissionpolicy", "-o", "name").stdout.split()
        assert "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-healthcheck-own-node" in vap

        def installed() -> tuple[dict[str, Any], str]:
            cm = own.kubectl("-n", "gpuhc", "get", "configmap", "gpu-healthcheck-config", "-o", "yaml").stdout
            policy = own.kubectl("get", "validatingadmissionpolicy", "gpu-healthcheck-own-node", "-o", "yaml")
            doc = yaml_safe.load(policy.stdout)
            types = next(v["expression"] for v in doc["spec"]["variables"] if v["name"] == "conditionTypes")
            return yaml_safe.load(yaml_safe.load(cm)["data"]["config.yaml"]), str(types)

        cfg, types = installed()
        assert cfg["intervals"]["gpu"] == 45 and cfg["node"]["conditionType"] == "example.com/GPUOk"
        assert types == "['example.com/GPUOk', 'AcceleratedHardwareReady']"
        # An upgrade that changes one key keeps the others set through Helm, and the policy follows.
        argv = [helm, "upgrade", "ghc", str(CHART), "--namespace", "gpuhc", "--reuse-values"]
        argv += ["--set", "config.intervals.gpu=50"]
        argv += ["--set", "config.node.remediationConditions[0].type=NodeGPUFailed"]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        cfg, types = installed()
        assert cfg["intervals"]["gpu"] == 50 and cfg["timeouts"]["nvidiaSmi"] == 7
        assert cfg["node"]["mode"] == "label" and cfg["node"]["conditionType"] == "example.com/GPUOk"
        assert cfg["node"]["remediationConditions"] == [{"type": "NodeGPUFailed"}]
        assert types == "['example.com/GPUOk', 'NodeGPUFailed']"
        proc = subprocess.run(
            [helm, "uninstall", "ghc", "--namespace", "gpuhc"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
    finally:
        own.stop()


def test_scheduling_and_the_embedded_operator_mode(helm: str) -> None:
    docs = render(helm, "scheduling.nodeSelector.pool=gpu", "dcgm.engine=operator-embedded")
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    spec = by[("DaemonSet", "gpu-healthcheck-agent")]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu"} and "tolerations" not in spec
    assert affinity_terms(by[("DaemonSet", "gpu-healthcheck-agent")]) == [[{**TRACK, "operator": "NotIn"}]]
    engine_spec = by[("DaemonSet", "nvidia-dcgm")]["spec"]["template"]["spec"]
    assert engine_spec["nodeSelector"] == {"pool": "gpu"} and "affinity" not in engine_spec  # as given
    assert ("DaemonSet", "dcgm-exporter") not in by  # the operator's exporter reads our engine
    (engine,) = by[("DaemonSet", "nvidia-dcgm")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["HOSTENGINE_GUARD_NAMESPACES"] == "gpu-healthcheck,gpu-operator"
    assert "app=nvidia-dcgm-exporter" in env["HOSTENGINE_GUARD_SELECTOR"]
    ingress = by[("NetworkPolicy", "nvidia-dcgm")]["spec"]["ingress"][0]["from"]
    assert {"app": "nvidia-dcgm-exporter"} in [f.get("podSelector", {}).get("matchLabels") for f in ingress]
