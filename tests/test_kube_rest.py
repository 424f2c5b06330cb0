"""KubeRest: raw JSON over the official client's transport, against the real API server; the agent in a
pod (its service account's token and CA, the client's in-cluster loader) and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.core.node_keys import Keys
from agent.reporters.kube_rest import MERGE_PATCH, USER_AGENT, KubeRest, node_path, query_params

ROOT = Path(__file__).resolve().parent.parent
# What an agent in a pod never uses, and what importing any part of the client used to load with it.
HEAVY = ("pydantic", "requests", "oauthlib", "requests_oauthlib", "kubernetes.dynamic", "kubernetes.stream",
         "kubernetes.leaderelection", "kubernetes.informer", "kubernetes.client.api_client",
         "kubernetes.config.kube_config")  # fmt: skip


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


def test_an_agent_in_a_pod_imports_only_the_clients_transport(tmp_path: Path) -> None:
    """In a pod the agent loads the client's configuration, REST layer and in-cluster loader, and
    none of the parts that importing `kubernetes` used to load (~17 MiB of RSS, bench/footprint)."""
    (tmp_path / "token").write_text("not-a-real-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    code = (
        "import sys, agent.cli.agent, agent.reporters.node_writer, agent.reporters.brake;"
        "import agent.reporters.fence, agent.cli.dcgm_engines;"
        "from pathlib import Path;"
        f"rest = agent.cli.agent.kube_core(None, Path({str(tmp_path)!r}));"
        "from agent.reporters.kube_rest import api_exception; api_exception();"
        "print(rest.configuration.host, rest.configuration.api_key);"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    )
    env = dict(os.environ, KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    ).stdout.splitlines()
    assert out[0] == "https://10.0.0.1:443 {'BearerToken': 'bearer not-a-real-token'}"
    assert out[1] == "[]"


def test_the_clients_package_init_runs_when_a_name_it_defines_is_asked_for() -> None:
    """The deferred packages stay the client's: code asking for a name their __init__ defines gets
    it (and then the whole client), as if the package had been imported the usual way."""
    code = (
        "import sys; from agent.reporters.kube_rest import client_modules; client_modules();"
        "from kubernetes.client.configuration import Configuration;"
        "from kubernetes.config.incluster_config import InClusterConfigLoader;"
        "print('pydantic' in sys.modules);"
        "from kubernetes import config; print(callable(config.list_kube_config_contexts));"
        "import kubernetes; print(kubernetes.__version__ == kubernetes.client.__version__);"
        "print('kubernetes.config.kube_config' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "True", "True", "True"]


@pytest.mark.kube
def test_the_agent_in_a_pod_writes_its_node_with_its_service_account(
    kube: Any, kube_namespace: str, gpu_node: Any, tmp_path: Path
) -> None:
    """The agent as a pod runs it: KUBERNETES_SERVICE_HOST/PORT and the service account's token and
    CA in a directory (the kubelet's mount), read by the client's in-cluster loader."""
    name = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    binding = {
        "metadata": {"name": f"agent-{kube_namespace}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": kube_namespace}],
    }
    kube.create_service_account(kube_namespace, "agent")
    status, body = kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    assert status == 201, body
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(kube.token_for(kube_namespace, "agent", bound_node=name, expiration=600))
    (sa / "ca.crt").write_bytes(Path(kube.ca_cert).read_bytes())
    host, port = kube.url.removeprefix("https://").rsplit(":", 1)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HOME")}
    env |= {"KUBERNETES_SERVICE_HOST": host.strip("[]"), "KUBERNETES_SERVICE_PORT": port, "NO_PROXY": "*"}
    snap = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
    argv = [sys.executable, "-m", "agent.cli", "agent", "--node", name, "--from-snapshot", str(snap)]
    argv += ["--service-account-dir", str(sa), "--metrics-port", "0", "--once", "--state-dir", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status, node = kube.request("GET", f"/api/v1/nodes/{name}")
    assert status == 200
    assert node["metadata"]["labels"][Keys().status] == "fail"
    assert json.loads(node["metadata"]["annotations"][Keys().results])["status"] == "fail"
    assert "API error" not in proc.stdout + proc.stderr


def test_a_watch_error_event_raises_with_its_code() -> None:
    """An ERROR event in the stream (410 Gone: the resourceVersion is too old; list again) raises the
    client's ApiException with its code, as kubernetes.watch.Watch does. A real HTTP server on
    loopback sends what the API server sends."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kubernetes.client.configuration import Configuration

    lines = [
        {"type": "ADDED", "object": {"kind": "Node", "metadata": {"name": "n", "resourceVersion": "7"}}},
        {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
        },
    ]
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            asked.append(self.path + " " + self.headers.get("User-Agent", ""))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for line in lines:
                data = (json.dumps(line) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = Configuration()
        cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
        cfg.proxy = None
        rest = KubeRest(cfg)
        stream = rest.watch("/api/v1/nodes", query={"resourceVersion": "5", "timeoutSeconds": 5}, timeout=5)
        seen = []
        with pytest.raises(ApiException) as exc:
            for ev in stream:
                seen.append(ev)
        assert exc.value.status == 410 and "Expired" in str(exc.value.reason)
        assert seen == [lines[0]]
        assert asked == [f"/api/v1/nodes?resourceVersion=5&timeoutSeconds=5&watch=true {USER_AGENT}"]
    finally:
        server.shutdown()


@pytest.mark.kube
def test_a_watch_streams_events_and_stops_at_once(kube: Any, gpu_node: Any) -> None:
    name = gpu_node().metadata.name
    with kube.api_client() as api:
        rest = KubeRest.of(api)
        rv = rest.json("GET", node_path(name))["metadata"]["resourceVersion"]
        stream = rest.watch(
            "/api/v1/nodes",
            query={"fieldSelector": f"metadata.name={name}", "resourceVersion": rv, "timeoutSeconds": 60},
            timeout=(5, 75),
        )
        seen: list[dict[str, Any]] = []

        def read() -> None:
            for ev in stream:
                seen.append(ev)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for value in ("a", "b"):
            rest.json(
                "PATCH",
                node_path(name),
                body={"metadata": {"labels": {"test.example/w": value}}},
                content_type=MERGE_PATCH,
            )
        deadline = threading.Event()
        for _ in range(100):
            if len(seen) >= 2:
                break
            deadline.wait(0.1)
        assert [ev["type"] for ev in seen[:2]] == ["MODIFIED", "MODIFIED"]
        assert [ev["object"]["metadata"]["labels"]["test.example/w"] for ev in seen[:2]] == ["a", "b"]
        stream.stop()
        reader.join(10)
        assert not reader.is_alive()  # a blocked read returns when the stream is stopped


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
