"""Proof that the ``kube`` fixture is a real Kubernetes API server, not a mock that agrees with us."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.core.node_keys import Keys
from tests.kubeenv.env import KubeEnv, unique_name

pytestmark = pytest.mark.kube

STATUS_LABEL = Keys().status


def _jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


def test_unknown_field_is_rejected(kube: KubeEnv, kube_node_name: str) -> None:
    body: Any = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": kube_node_name, "labels": {STATUS_LABEL: "healthy"}},
        "spec": {"gpuHealth": "fine"},  # no such field in NodeSpec
    }
    # Raw request: the Python client (>= 37) would refuse the field before the server sees it.
    status, reply = kube.request("POST", "/api/v1/nodes", body, query={"fieldValidation": "Strict"})
    assert status == 400, reply
    assert reply["reason"] == "BadRequest"
    assert 'unknown field "spec.gpuHealth"' in reply["message"]

    # kubectl validates strictly by default, as users see it.
    proc = kube.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert proc.returncode != 0
    assert 'unknown field "spec.gpuHealth"' in proc.stderr

    # Schema validation too: a label value may not contain spaces.
    bad: Any = {"metadata": {"name": kube_node_name, "labels": {STATUS_LABEL: "not healthy"}}}
    status, reply = kube.request("POST", "/api/v1/nodes", bad)
    assert status == 422, reply
    assert reply["reason"] == "Invalid"
    assert kube.request("GET", f"/api/v1/nodes/{kube_node_name}")[0] == 404


def test_service_account_without_role_is_forbidden(
    kube: KubeEnv, kube_namespace: str, gpu_node: Callable[..., Any]
) -> None:
    node = gpu_node()
    name = node.metadata.name
    token = kube.token_for(kube_namespace, "no-rights")
    with kube.api_client_for_token(token) as api:
        core: Any = k8s.CoreV1Api(api)
        with pytest.raises(k8s.ApiException) as err:
            core.read_node(name)
        assert err.value.status == 403
        assert f"system:serviceaccount:{kube_namespace}:no-rights" in str(err.value.body)
        with pytest.raises(k8s.ApiException) as err:
            core.patch_node(name, {"metadata": {"labels": {STATUS_LABEL: "healthy"}}})
        assert err.value.status == 403

    kubeconfig = kube.kubeconfig_for_token(token)
    proc = kube.kubectl("get", "nodes", kubeconfig=kubeconfig, check=False)
    assert proc.returncode != 0
    assert "Forbidden" in proc.stderr

    # Granting a ClusterRole through RBAC makes the same token work: authn is real, authz is RBAC.
    role = unique_name("node-reader")
    kube.kubectl("create", "clusterrole", role, "--verb=get,list", "--resource=nodes")
    kube.kubectl(
        "create",
        "clusterrolebinding",
        role,
        f"--clusterrole={role}",
        f"--serviceaccount={kube_namespace}:no-rights",
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            proc = kube.kubectl("get", "node", name, "-o", "name", kubeconfig=kubeconfig, check=False)
            if proc.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert proc.stdout.strip() == f"node/{name}", proc.stderr
        can_patch = kube.kubectl("auth", "can-i", "patch", "nodes", kubeconfig=kubeconfig, check=False)
        assert can_patch.stdout.strip() == "no"
    finally:
        kube.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)


def test_stale_resource_version_conflicts(kube: KubeEnv, gpu_node: Callable[..., Any]) -> None:
    stale = gpu_node()
    name = stale.metadata.name
    with kube.api_client() as api:
        core: Any = k8s.CoreV1Api(api)
        fresh = core.patch_node(name, {"metadata": {"labels": {STATUS_LABEL: "unhealthy"}}})
        assert fresh.metadata.resource_version != stale.metadata.resource_version

        stale.metadata.labels[STATUS_LABEL] = "healthy"
        with pytest.raises(k8s.ApiException) as err:
            core.replace_node(name, stale)
        assert err.value.status == 409
        assert json.loads(str(err.value.body))["reason"] == "Conflict"

        # The loser re-reads and retries, as the agent must.
        current = core.read_node(name)
        current.metadata.labels[STATUS_LABEL] = "healthy"
        assert core.replace_node(name, current).metadata.labels[STATUS_LABEL] == "healthy"


def test_validating_admission_policy_is_enforced(kube: KubeEnv, gpu_node: Callable[..., Any]) -> None:
    policy = unique_name("gpuhc-status-values")
    scope = {"gpuhc-test/vap": policy}
    name = gpu_node(labels=scope).metadata.name
    manifest = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": policy},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["nodes"],
                            }
                        ]
                    },
                    "validations": [
                        {
                            "expression": f"!has(object.metadata.labels) || "
                            f"!('{STATUS_LABEL}' in object.metadata.labels) || "
                            f"object.metadata.labels['{STATUS_LABEL}'] in ['healthy', 'unhealthy']",
                            "message": f"{STATUS_LABEL} must be healthy or unhealthy",
                        }
                    ],
                },
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": policy},
                "spec": {
                    "policyName": policy,
                    "validationActions": ["Deny"],
                    "matchResources": {"objectSelector": {"matchLabels": scope}},
                },
            },
        ],
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        # Policies are loaded asynchronously: retry a forbidden write until it is refused.
        # Each try writes a new value: kubectl sends nothing for a label it already has, so a try
        # that landed before the policy was loaded would make every later one a no-op.
        deadline = time.monotonic() + 20
        for attempt in itertools.count():
            value = f"maybe-{attempt}"
            proc = kube.kubectl("label", "node", name, f"{STATUS_LABEL}={value}", "--overwrite", check=False)
            if proc.returncode != 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert proc.returncode != 0, "the ValidatingAdmissionPolicy never took effect"
        assert f"ValidatingAdmissionPolicy '{policy}'" in proc.stderr
        assert f"{STATUS_LABEL} must be healthy or unhealthy" in proc.stderr

        kube.kubectl("label", "node", name, f"{STATUS_LABEL}=unhealthy", "--overwrite")
        with kube.api_client() as api, pytest.raises(k8s.ApiException) as err:
            k8s.CoreV1Api(api).patch_node(name, {"metadata": {"labels": {STATUS_LABEL: "meh"}}})
        assert err.value.status == 422
    finally:
        kube.kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            policy,
            "--ignore-not-found",
            check=False,
        )


def test_kubectl_prints_status_label_column(kube: KubeEnv, gpu_node: Callable[..., Any]) -> None:
    name = gpu_node(labels={STATUS_LABEL: "unhealthy"}).metadata.name
    out = kube.kubectl("get", "nodes", name, "-L", STATUS_LABEL).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    # NAME STATUS ROLES AGE VERSION STATUS — the second STATUS is the label column.
    assert header[0] == "NAME" and header[-1] == "STATUS" and header.count("STATUS") == 2, out
    assert row[0] == name and row[1] == "Ready" and row[-1] == "unhealthy", out


def test_node_bound_service_account_token(
    kube: KubeEnv, kube_namespace: str, gpu_node: Callable[..., Any]
) -> None:
    node = gpu_node(instance_type="p4d.24xlarge", gpus=8)
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"

    token = kube.token_for(kube_namespace, "agent", bound_node=node.metadata.name, expiration=600)
    claims = _jwt_claims(token)["kubernetes.io"]
    assert claims["node"] == {"name": node.metadata.name, "uid": node.metadata.uid}
    assert claims["serviceaccount"]["name"] == "agent"

    # `kubectl create token` goes through the same TokenRequest API.
    proc = kube.kubectl(
        "create",
        "token",
        "agent",
        "-n",
        kube_namespace,
        "--bound-object-kind=Node",
        f"--bound-object-name={node.metadata.name}",
    )
    assert _jwt_claims(proc.stdout.strip())["kubernetes.io"]["node"]["name"] == node.metadata.name

    with kube.api_client_for_token(token) as api:  # authenticates: refused by RBAC, not by authn
        with pytest.raises(k8s.ApiException) as err:
            k8s.CoreV1Api(api).read_node(node.metadata.name)
        assert err.value.status == 403


def test_controller_manager_creates_default_service_account(kube_controllers: KubeEnv) -> None:
    ns = unique_name("kcm")
    kube_controllers.ensure_namespace(ns)
    deadline = time.monotonic() + 30
    while True:  # the serviceaccount and root-CA publisher controllers fill the new namespace
        sa = kube_controllers.kubectl("get", "serviceaccount", "default", "-n", ns, check=False)
        cm = kube_controllers.kubectl(
            "get", "configmap", "kube-root-ca.crt", "-n", ns, "-o", "json", check=False
        )
        if (sa.returncode == 0 and cm.returncode == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sa.returncode == 0, sa.stderr
    assert cm.returncode == 0, cm.stderr
    assert "BEGIN CERTIFICATE" in json.loads(cm.stdout)["data"]["ca.crt"]
    # The namespace controller finalises deletion (without it the namespace stays Terminating).
    kube_controllers.kubectl("delete", "namespace", ns, "--timeout=60s")
