"""KubeRest: raw JSON over the official ApiClient, against the real API server."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.reporters.kube_rest import MERGE_PATCH, KubeRest, node_path, query_params


def test_query_params_names_and_values() -> None:
    got = query_params(
        {
            "field_selector": "metadata.name=a",
            "watch": True,
            "allow_watch_bookmarks": False,
            "limit": 5,
            "_continue": None,
            "includeObject": "None",
        }
    )
    assert got == [
        ("fieldSelector", "metadata.name=a"),
        ("watch", "true"),
        ("allowWatchBookmarks", "false"),
        ("limit", "5"),
        ("includeObject", "None"),
    ]


def test_node_path_quotes_the_name() -> None:
    assert node_path("gpu-1") == "/api/v1/nodes/gpu-1"
    assert node_path("a/b", "status") == "/api/v1/nodes/a%2Fb/status"


def test_the_agent_does_not_import_the_generated_models() -> None:
    """The reason KubeRest exists: CoreV1Api and its models cost ~22 MiB RSS on every node."""
    code = (
        "import sys, agent.cli.agent, agent.reporters.node_writer, agent.reporters.brake;"
        "import agent.cli.status, agent.probes.dcgm.tiers, kubernetes.watch, kubernetes.config;"
        "from kubernetes.client import ApiClient;"
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes.client.api.')"
        " or m.startswith('kubernetes.client.models.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.kube
def test_requests_errors_and_the_pool(kube: Any, gpu_node: Any) -> None:
    name = gpu_node().metadata.name
    with kube.api_client() as api:
        rest = KubeRest.of(api)
        assert KubeRest.of(rest) is rest
        node = rest.json("GET", node_path(name))
        assert node["kind"] == "Node" and node["metadata"]["name"] == name
        patched = rest.json(
            "PATCH",
            node_path(name),
            body={"metadata": {"labels": {"test.example/k": "v"}}},
            content_type=MERGE_PATCH,
            query={"fieldManager": "kube-rest-test"},
        )
        assert patched["metadata"]["labels"]["test.example/k"] == "v"
        with pytest.raises(ApiException) as exc:
            rest.json("GET", node_path("no-such-node-" + name))
        assert exc.value.status == 404 and "not found" in (exc.value.body or "")
        # the failed request drained its connection: the pool still serves many requests
        for _ in range(20):
            assert rest.json("GET", node_path(name))["metadata"]["name"] == name
        with pytest.raises(ApiException) as conflict:
            rest.json(
                "PATCH",
                node_path(name),
                body={"metadata": {"resourceVersion": "1", "labels": {"test.example/k": "w"}}},
                content_type=MERGE_PATCH,
            )
        assert conflict.value.status == 409
