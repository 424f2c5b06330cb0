"""hostengine/guard.py: only allowed pods on this node reach the engine, whatever the CNI enforces.

The allowlist is read from the real API server (pods with their status.podIP set through the status
subresource, as a kubelet would); the guard forwards real TCP connections to a stand-in engine (an echo
server), telling clients apart by their source address on the loopback network (127.0.0.2, .3, ...)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.config import yaml_safe
from hostengine.guard import DEFAULT_SELECTOR, Allowlist, Api, Guard, allowed_pod_ips

REPO = Path(__file__).parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_allowlist_refreshes_on_an_unknown_peer_at_most_every_min_refresh_and_fails_closed() -> None:
    answers: list[Any] = [RuntimeError("API down"), {"10.0.0.5"}, RuntimeError("API down"), {"10.0.0.6"}]
    calls = []

    def fetch() -> set[str]:
        calls.append(1)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    clock = Clock()
    allow = Allowlist(fetch, max_age_s=60, min_refresh_s=2, clock=clock)
    assert not allow.allows("10.0.0.5") and "API down" in allow.last_error  # nothing known: closed
    assert not allow.allows("10.0.0.5") and len(calls) == 1  # no second try within 2 s
    clock.now += 2
    assert allow.allows("10.0.0.5") and len(calls) == 2
    assert allow.allows("10.0.0.5") and len(calls) == 2  # known and fresh: no API call
    clock.now += 60
    assert allow.allows("10.0.0.5") and len(calls) == 3  # stale: asked, failed, last good list kept
    clock.now += 2
    assert not allow.allows("10.0.0.5") and allow.allows("10.0.0.6") and len(calls) == 4


def echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(b"engine:" + data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, int(srv.getsockname()[1])


def talk(port: int, source: str) -> bytes:
    with socket.socket() as s:
        s.bind((source, 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        try:
            s.sendall(b"hello")
            return s.recv(1024)
        except OSError:
            return b""


def engine_rbac(kube: Any, ns: str) -> None:
    """The engine's ClusterRole as 40-hostengine.yaml grants it, bound to ServiceAccount ns/nvidia-dcgm."""
    role = next(
        d
        for d in yaml_safe.load_all((REPO / "manifests" / "40-hostengine.yaml").read_text())
        if d["kind"] == "ClusterRole"
    )
    name = f"nvidia-dcgm-{ns}"
    status, body = kube.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {"metadata": {"name": name}, "rules": role["rules"]},
    )
    assert status == 201, body
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "nvidia-dcgm", "namespace": ns}],
    }
    status, body = kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    assert status == 201, body


def add_pod(
    kube: Any, ns: str, name: str, node: str, ip: str, labels: dict[str, str], container: Any = None
) -> None:
    """A pod on `node`, Running with `ip` (set through the status subresource, as a kubelet would)."""
    status, body = kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [container or {"name": "c", "image": "busybox"}]},
        },
    )
    assert status == 201, body
    status, body = kube.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body


AGENT = {"app.kubernetes.io/name": "gpu-healthcheck-agent"}
EXPORTER = {"app.kubernetes.io/name": "dcgm-exporter"}


@pytest.fixture
def guard_api(kube: Any, kube_namespace: str, gpu_node: Any) -> dict[str, Any]:
    """Pods on two nodes, and the engine's ServiceAccount with the Role 40-hostengine.yaml grants."""
    ns = kube_namespace
    kube.create_service_account(ns, "default")  # no controller-manager makes it here
    node, other = gpu_node().metadata.name, gpu_node().metadata.name
    add_pod(kube, ns, "agent", node, "127.0.0.2", AGENT)
    add_pod(kube, ns, "exporter", node, "127.0.0.4", EXPORTER)
    add_pod(kube, ns, "intruder", node, "127.0.0.3", {"app.kubernetes.io/name": "something-else"})
    add_pod(kube, ns, "agent-elsewhere", other, "127.0.0.5", AGENT)
    engine_rbac(kube, ns)
    token = kube.token_for(ns, "nvidia-dcgm", expiration=600)
    api = Api(kube.url, lambda: token, str(kube.ca_cert))
    return {"kube": kube, "ns": ns, "node": node, "api": api, "token": token}


@pytest.mark.kube
def test_only_allowed_pods_on_this_node_are_listed(guard_api: dict[str, Any]) -> None:
    g = guard_api
    assert allowed_pod_ips(g["api"], g["node"], [g["ns"]], DEFAULT_SELECTOR) == {"127.0.0.2", "127.0.0.4"}


@pytest.mark.kube
def test_guard_forwards_allowed_pods_and_refuses_the_rest(guard_api: dict[str, Any]) -> None:
    g = guard_api
    engine, engine_port = echo_server()
    allow = Allowlist(lambda: allowed_pod_ips(g["api"], g["node"], [g["ns"]], DEFAULT_SELECTOR))
    guard = Guard("127.0.0.1", 0, "127.0.0.1", engine_port, allow)
    guard.start()
    try:
        assert talk(guard.port, "127.0.0.2") == b"engine:hello"  # the agent
        assert talk(guard.port, "127.0.0.4") == b"engine:hello"  # dcgm-exporter
        assert talk(guard.port, "127.0.0.3") == b""  # a pod with other labels on the node
        assert talk(guard.port, "127.0.0.5") == b""  # an agent of another node
        assert talk(guard.port, "127.0.0.9") == b""  # not a pod at all
        assert guard.refused == 3 and guard.accepted == 2
        add_pod(g["kube"], g["ns"], "agent-2", g["node"], "127.0.0.6", AGENT)  # a new agent pod
        allow.min_refresh_s = 0.0
        assert talk(guard.port, "127.0.0.6") == b"engine:hello"  # let in at its first knock
    finally:
        guard.stop()
        engine.close()


FAKE_ENGINE = """#!{py}
import sys, time, signal
print("fake nv-hostengine args: " + " ".join(sys.argv[1:]), flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(0.05)
"""


@pytest.mark.kube
def test_entrypoint_binds_the_engine_to_loopback_behind_the_guard(
    guard_api: dict[str, Any], tmp_path: Path
) -> None:
    g = guard_api
    binary = tmp_path / "nv-hostengine"
    binary.write_text(FAKE_ENGINE.format(py=sys.executable))
    binary.chmod(0o755)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(g["token"])
    (sa / "ca.crt").write_bytes(Path(g["kube"].ca_cert).read_bytes())
    (tmp_path / "proc").mkdir()
    host, port = g["kube"].url.removeprefix("https://").rsplit(":", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "KUBERNETES_SERVICE_HOST": host.strip("[]"),
        "KUBERNETES_SERVICE_PORT": port,
        "NODE_NAME": g["node"],
        "HOSTENGINE_GUARD_LISTEN": "127.0.0.1",
        "HOSTENGINE_GUARD_NAMESPACES": g["ns"],
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "hostengine", "--binary", str(binary), "--port", str(free),
         "--proc", str(tmp_path / "proc"), "--sa-dir", str(sa)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "fake nv-hostengine args" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    out = "".join(lines) + rest
    assert f"-n -b 127.0.0.1 -p {free}" in out  # the engine itself is reachable only inside the pod
    assert f"guard on 127.0.0.1:{free}" in out and "allowed clients on this node: 127.0.0.2, 127.0.0.4" in out


def test_entrypoint_refuses_a_guard_without_its_node() -> None:
    from hostengine import entrypoint

    rc = entrypoint.main(
        ["--guard-listen", "127.0.0.1", "--port", "1", "--node", "", "--proc", "/nonexistent"]
    )
    assert rc == 2
