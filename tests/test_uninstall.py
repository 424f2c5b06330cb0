"""`gpu-healthcheck uninstall` (production review 3, L1 and K1): every mark of ours off every Node,
nothing else touched.

Pure: what counts as ours on a Node (keys under the prefix, the track label, taints under the prefix,
conditions of a configured type or with a reason of ours). On the real API server: a node in the
middle of validation, a node of the image canary and an untouched one, with foreign keys beside
ours; refused while an agent pod is listed; --dry-run writes nothing; a second run finds nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.cli.status import AGENT_SELECTOR
from agent.cli.uninstall import metadata_patch, plan
from agent.config import yaml_safe
from agent.core.node_keys import TRACK_LABEL, Keys
from agent.core.record_kind import RecordKind
from agent.core.remediation_types import RemediationReason
from agent.core.repair_budget import RecordKeys

ROOT = Path(__file__).parent.parent
K = Keys()
TAINT, SLOT = RecordKind.TAINT, RecordKind.SLOT
FOREIGN_LABEL = ("team.example.com/owner", "ml")
FOREIGN_ANNOTATION = ("example.com/ticket", "OPS-1")
FOREIGN_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FOREIGN_CONDITION = {"type": "NetworkReady", "status": "True", "reason": "RouteCreated"}
EKS_CONDITION = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error"}


def node(
    labels: dict[str, str], annotations: dict[str, str], taints: list[dict[str, str]], conds: list[Any]
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "resourceVersion": "9", "labels": labels, "annotations": annotations},
        "spec": {"taints": taints},
        "status": {"conditions": conds},
    }


# ------------------------------------------------------------------------------------------ pure


def test_everything_under_the_prefix_is_ours_and_nothing_else() -> None:
    n = node(
        {K.status: "fail", K.risk: "high", TRACK_LABEL: "canary", FOREIGN_LABEL[0]: "ml"},
        {K.history: "[]", f"{K.prefix}/quarantine-result": "{}", FOREIGN_ANNOTATION[0]: "x"},
        [{"key": K.validating, "effect": "NoSchedule"},
         {"key": K.taint, "value": "reboot", "effect": "NoSchedule"}, FOREIGN_TAINT],
        [{"type": "GPUHealthy", "status": "Unknown", "reason": "CouldNotCheck"}, FOREIGN_CONDITION,
         {"type": "AcceleratedHardwareReady", "status": "True", "reason": RemediationReason.COULD_NOT_CHECK},
         {"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    )  # fmt: skip
    got = plan(n, K.prefix, ["GPUHealthy"])
    assert got.labels == (K.risk, K.status, TRACK_LABEL)
    assert got.annotations == (K.history, f"{K.prefix}/quarantine-result")
    assert got.taints == (f"{K.validating}:NoSchedule", f"{K.taint}=reboot:NoSchedule")
    assert got.conditions == ("GPUHealthy", "AcceleratedHardwareReady")  # a type of ours; a reason of ours
    patch = metadata_patch(n, K.prefix)
    assert patch["metadata"]["resourceVersion"] == "9"  # the taint list is replaced: on this Node only
    assert patch["spec"]["taints"] == [FOREIGN_TAINT]
    assert patch["metadata"]["labels"] == {K.risk: None, K.status: None, TRACK_LABEL: None}
    # Another prefix: the track label is still the install's; the default prefix's keys are not ours.
    other = plan(n, "acme-gpu", ["GPUHealthy"])
    assert other.labels == (TRACK_LABEL,) and other.annotations == () and other.taints == ()
    # An EKS-style reason is not ours: only a configured type finds it.
    eks = node({}, {}, [], [EKS_CONDITION])
    assert plan(eks, K.prefix, ["GPUHealthy"]).empty
    assert plan(eks, K.prefix, ["GPUHealthy", "AcceleratedHardwareReady"]).conditions == (
        "AcceleratedHardwareReady",
    )


# ------------------------------------------------------------------------------------------ kube


def uninstall_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "uninstall", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def set_conditions(kube: Any, name: str, conds: list[dict[str, str]]) -> None:
    body = {"status": {"conditions": [{**c, "message": "set by the test"} for c in conds]}}
    code, answer = kube.request(
        "PATCH", f"/api/v1/nodes/{name}/status", body, content_type="application/strategic-merge-patch+json"
    )
    assert code == 200, answer


def set_metadata(kube: Any, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
    body = {"metadata": {"labels": labels, "annotations": annotations}}
    code, answer = kube.request(
        "PATCH", f"/api/v1/nodes/{name}", body, content_type="application/merge-patch+json"
    )
    assert code == 200, answer


def view(kube: Any, name: str) -> dict[str, Any]:
    code, n = kube.request("GET", f"/api/v1/nodes/{name}")
    assert code == 200, n
    meta = n["metadata"]
    return {
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "taints": [(t["key"], t.get("value"), t["effect"]) for t in n["spec"].get("taints") or ()],
        "conditions": {c["type"]: c.get("reason") for c in n["status"].get("conditions") or ()},
    }


def ours_left(v: dict[str, Any]) -> list[str]:
    keys = [*v["labels"], *v["annotations"], *(t[0] for t in v["taints"])]
    left = [k for k in keys if K.ours(k) or k == TRACK_LABEL]
    return left + [t for t in v["conditions"] if t in ("GPUHealthy", "AcceleratedHardwareReady")]


@pytest.mark.kube
def test_uninstall_takes_every_mark_of_ours_off_every_node_and_nothing_else(
    kube: Any, gpu_node: Callable[..., Any], kube_namespace: str
) -> None:
    ns = kube_namespace
    # The install's ConfigMap names an EKS-style remediation condition: its type is read from it.
    config = "node:\n  remediationConditions:\n    - type: AcceleratedHardwareReady\n      reasonStyle: eks\n"
    code, body = kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        {"metadata": {"name": "gpu-healthcheck-config"}, "data": {"config.yaml": config}},
    )
    assert code == 201, body
    foreign_labels, foreign_ann = dict([FOREIGN_LABEL]), dict([FOREIGN_ANNOTATION])
    validating = gpu_node(
        labels=foreign_labels, taints=[{"key": K.validating, "effect": "NoSchedule"}, FOREIGN_TAINT]
    ).metadata.name
    set_metadata(
        kube,
        validating,
        {K.status: "unknown", K.severity: "none", K.risk: "normal"},
        {**foreign_ann, K.history: "[]", K.diag_requested: json.dumps({"by": "alice"})},
    )
    set_conditions(
        kube,
        validating,
        [{"type": "GPUHealthy", "status": "Unknown", "reason": "CouldNotCheck"}, FOREIGN_CONDITION,
         {"type": "AcceleratedHardwareReady", "status": "True", "reason": RemediationReason.COULD_NOT_CHECK}],
    )  # fmt: skip
    canary = gpu_node(
        labels={**foreign_labels, TRACK_LABEL: "canary", K.config_channel: "canary",
                K.taint_opt_out: "disabled"},
        taints=[{"key": K.taint, "value": "reboot", "effect": "NoSchedule"},
                {"key": K.testing, "effect": "NoSchedule"}, FOREIGN_TAINT],
    ).metadata.name  # fmt: skip
    set_metadata(
        kube,
        canary,
        {K.tainted: "true", K.status: "fail", K.severity: "reboot"},
        {**foreign_ann, K.results: "{}", K.clear_latched: "all", K.clear_latched_by: "{}"},
    )
    set_conditions(
        kube, canary, [{"type": "GPUHealthy", "status": "False", "reason": "ChecksFailed"}, EKS_CONDITION]
    )
    untouched = gpu_node(labels=foreign_labels, taints=[FOREIGN_TAINT]).metadata.name
    ours = (validating, canary)
    before = {n: view(kube, n) for n in (*ours, untouched)}
    assert all(ours_left(before[n]) for n in ours) and not ours_left(before[untouched])
    kcfg = kube.kubeconfig
    args = ("--namespace", ns, "--agent-selector", f"app.kubernetes.io/name=gpu-healthcheck-agent,test={ns}")

    # An agent pod still listed: refused, nothing written.
    kube.create_service_account(ns, "default")  # pods are admitted with it (no controller)
    pod = {
        "metadata": {
            "name": "agent-0",
            "labels": {"app.kubernetes.io/name": "gpu-healthcheck-agent", "test": ns},
        },
        "spec": {"containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]},
    }
    code, body = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, body
    refused = uninstall_cli(kcfg, *args)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (
        f"agent pods still run (1: {ns}/agent-0)" in refused.stdout
        and "stop the agents first" in refused.stdout
    )
    assert {n: view(kube, n) for n in before} == before
    code, body = kube.request(
        "DELETE", f"/api/v1/namespaces/{ns}/pods/agent-0", query={"gracePeriodSeconds": "0"}
    )
    assert code == 200, body

    # --dry-run: per node, what it would remove; nothing written.
    dry = uninstall_cli(kcfg, "--dry-run", *args)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    lines = {line.split(":", 1)[0]: line for line in dry.stdout.splitlines()}
    assert f"taints {K.validating}:NoSchedule" in lines[validating]
    assert "conditions GPUHealthy, AcceleratedHardwareReady" in lines[validating]
    assert TRACK_LABEL in lines[canary] and f"{K.testing}:NoSchedule" in lines[canary]
    assert lines[untouched] == f"{untouched}: nothing of ours"
    assert "dry run: 2 of" in dry.stdout
    assert {n: view(kube, n) for n in before} == before

    done = uninstall_cli(kcfg, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{validating}: removed labels" in done.stdout and "all removed" in done.stdout
    for n in (*ours, untouched):
        after = view(kube, n)
        assert ours_left(after) == [], (n, after)
        # the foreign label, annotation, taint and conditions stay, the kubelet's too
        assert after["labels"][FOREIGN_LABEL[0]] == FOREIGN_LABEL[1]
        assert ("nvidia.com/gpu", "present", "NoSchedule") in after["taints"]
        assert after["conditions"].get("Ready") == "KubeletReady"
        if n != untouched:
            assert after["annotations"][FOREIGN_ANNOTATION[0]] == FOREIGN_ANNOTATION[1]
    assert view(kube, validating)["conditions"]["NetworkReady"] == "RouteCreated"
    assert view(kube, untouched) == before[untouched]

    # Again, with the ConfigMaps gone (another namespace): the shipped config's condition type.
    again = uninstall_cli(kcfg, *args, "--namespace", f"{ns}-gone")
    assert again.returncode == 0 and f"{canary}: nothing of ours" in again.stdout, again.stdout
    assert f"conditions GPUHealthy and any with a reason of ours (no ConfigMap in {ns}-gone" in again.stdout
    assert uninstall_cli(Path("/nonexistent/kubeconfig")).returncode == 69


# ------------------------------------------------------------------------------------------ the docs


def readme_section(title: str) -> str:
    """The section *title* of docs/guides/upgrade.md, where the README's "Uninstall" went."""
    text = (ROOT / "docs" / "guides" / "upgrade.md").read_text()
    section = text[text.index(title) + len(title) :]
    return section[: section.index("\n#")]


def test_the_readme_uninstall_stops_the_agents_then_cleans_the_nodes_then_deletes() -> None:
    text = readme_section("## Uninstall\n")
    steps = [
        "delete daemonset gpu-healthcheck-agent gpu-healthcheck-agent-canary",
        "wait --for=delete pod -l app.kubernetes.io/name=gpu-healthcheck-agent",
        "gpu-healthcheck uninstall --dry-run",
        "gpu-healthcheck uninstall\n",
        "kubectl delete -f manifests/ ",
        "kubectl delete devicetaintrules -l gpu-healthcheck/node",
    ]
    at = [text.index(step) for step in steps]
    assert at == sorted(at), steps
    for code in ("Exit 0", "1 agent pods still run", "2 a\nNode could not be cleaned", "64 usage", "69 the"):
        assert code in text, code
    agents = [
        doc["metadata"]
        for path in ("manifests/60-agent.yaml", "manifests/optional/agent-canary.yaml")
        for doc in [yaml_safe.load((ROOT / path).read_text())]
    ]
    assert [m["name"] for m in agents] == ["gpu-healthcheck-agent", "gpu-healthcheck-agent-canary"]
    assert {m["labels"]["app.kubernetes.io/name"] for m in agents} == {AGENT_SELECTOR.split("=")[1]}


def test_the_readme_rollback_deletes_objects_the_manifests_have_and_the_slots_by_their_kinds() -> None:
    text = readme_section("## Upgrade and roll back\n")
    docs = list(yaml_safe.load_all((ROOT / "manifests/30-admission-policy.yaml").read_text()))
    names = {(d["kind"], d["metadata"]["name"]) for d in docs if d}
    for name in ("gpu-healthcheck-own-records", "gpu-healthcheck-own-slots"):
        assert name in text
        assert {("ValidatingAdmissionPolicy", name), ("ValidatingAdmissionPolicyBinding", name)} <= names
    assert f"-l '{RecordKeys(K.prefix).kind} in ({TAINT},{SLOT})'" in text
    assert "kubectl apply -f OLD/manifests/" in text
