"""Coexistence with the NVIDIA GPU Operator: one DCGM engine per node, both ways.

The overlays build with the real kubectl and are accepted by the real API server; the engine's entrypoint
refuses to start when another pod on its node runs an engine (the operator's nvidia-dcgm, or a
dcgm-exporter that embeds one), and the agent reports a second engine as a dcgm-health finding."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.checks.dcgm import check_dcgm_health
from agent.config import load_config_dir, yaml_safe
from agent.core.dcgm_report import HealthReport
from agent.core.facts import NodeFacts
from agent.core.severity import Severity, Status
from agent.probes.dcgm.engines import engine_kind, engines_in
from tests.conftest import cfg
from tests.test_hostengine_guard import FAKE_ENGINE, add_pod, engine_rbac

ROOT = Path(__file__).parent.parent
OVERLAYS = ROOT / "overlays"
CFG = cfg()
OPERATOR_ENGINE = {"name": "nvidia-dcgm-ctr", "image": "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"}
EMBEDDED_EXPORTER = {
    "name": "nvidia-dcgm-exporter",
    "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
}
REMOTE_EXPORTER = {
    **EMBEDDED_EXPORTER,
    "env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": "nvidia-dcgm.gpu-healthcheck.svc:5555"}],
}


def test_what_counts_as_an_engine() -> None:
    assert engine_kind(OPERATOR_ENGINE) == "nv-hostengine"
    assert engine_kind({"image": "ghcr.io/gpu-healthcheck/hostengine:0.1.0"}) == "nv-hostengine"
    assert engine_kind({"image": "nvcr.io/nvidia/cloud-native/dcgm@sha256:ab", "command": ["nv-hostengine"]})
    assert engine_kind(EMBEDDED_EXPORTER) == "dcgm-exporter with an embedded engine"
    assert engine_kind(REMOTE_EXPORTER) is None
    assert engine_kind({**EMBEDDED_EXPORTER, "args": ["-r", "nvidia-dcgm:5555"]}) is None
    assert engine_kind({"image": "ghcr.io/gpu-healthcheck/agent:0.1.0"}) is None  # a client on DCGM's image
    probe = {"image": "nvcr.io/nvidia/cloud-native/dcgm:4.6.0", "command": ["dcgmi", "diag", "-r", "1"]}
    assert engine_kind(probe) is None

    def pod(ns: str, name: str, phase: str = "Running") -> dict[str, Any]:
        meta = {"namespace": ns, "name": name}
        return {"metadata": meta, "spec": {"containers": [OPERATOR_ENGINE]}, "status": {"phase": phase}}

    listing = {
        "items": [pod("gpu-operator", "nvidia-dcgm-x"), pod("gpu-healthcheck", "me"), pod("a", "b", "Failed")]
    }
    assert engines_in(listing, exclude=["gpu-healthcheck/me"]) == [
        "gpu-operator/nvidia-dcgm-x (nv-hostengine)"
    ]


def test_the_agent_reports_a_second_engine_and_never_one_alone() -> None:
    ours = "gpu-healthcheck/nvidia-dcgm-a (nv-hostengine)"
    theirs = "gpu-operator/nvidia-dcgm-exporter-b (dcgm-exporter with an embedded engine)"
    two = HealthReport(engines_on_node=(ours, theirs))
    res = check_dcgm_health(NodeFacts(dcgm_health=two), CFG)
    (f,) = res.findings
    assert (
        f.rule == "dcgm-health.second-engine" and f.severity is Severity.MONITOR and res.status is Status.WARN
    )
    assert "2 DCGM host engines" in f.message and "nvidia-dcgm-exporter-b" in f.message
    for engines in ((), ("gpu-healthcheck/nvidia-dcgm-a (nv-hostengine)",), None):
        assert (
            check_dcgm_health(NodeFacts(dcgm_health=HealthReport(engines_on_node=engines)), CFG).findings
            == ()
        )


def test_the_health_poller_carries_the_engines_it_was_told(fake_dcgm: Any) -> None:
    from agent.probes.dcgm.client import DcgmClient
    from agent.probes.dcgm.health import HealthPoller

    listed = HealthPoller(
        DcgmClient("127.0.0.1:5555", 1.0, 0.0), engines_on_node=lambda: ["a (x)", "b (y)"]
    ).poll()
    assert isinstance(listed, HealthReport) and listed.engines_on_node == ("a (x)", "b (y)")

    def broken() -> list[str]:
        raise RuntimeError("API down")

    unknown = HealthPoller(DcgmClient("127.0.0.1:5555", 1.0, 0.0), engines_on_node=broken).poll()
    assert isinstance(unknown, HealthReport) and unknown.engines_on_node is None  # a missing signal


def kustomize(kube_bins: Path, overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(kube_bins / "kubectl"), "kustomize", str(OVERLAYS / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml_safe.load_all(out) if d]


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_operator_engine_overlay_config_differs_only_in_the_address() -> None:
    ours = (ROOT / "config" / "config.yaml").read_text().splitlines()
    theirs = (OVERLAYS / "gpu-operator-dcgm" / "config.yaml").read_text().splitlines()
    diff = [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b]
    assert len(diff) == 1 and "nvidia-dcgm.gpu-operator.svc:5555" in diff[0][1]


@pytest.mark.kube
def test_overlays_build_and_the_api_server_accepts_them(kube: Any, tmp_path: Path) -> None:
    bins = Path(kube.binaries.kubectl).parent
    standalone = kustomize(bins, "gpu-operator-dcgm")
    gone = {
        ("DaemonSet", "nvidia-dcgm"),
        ("Service", "nvidia-dcgm"),
        ("NetworkPolicy", "nvidia-dcgm"),
        ("DaemonSet", "dcgm-exporter"),
        ("Service", "dcgm-exporter"),
        ("ClusterRole", "nvidia-dcgm"),
    }
    assert not kinds(standalone) & gone and ("DaemonSet", "gpu-healthcheck-agent") in kinds(standalone)
    cm = next(d for d in standalone if d["kind"] == "ConfigMap")
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    assert (
        load_config_dir(tmp_path).dcgm.address == "nvidia-dcgm.gpu-operator.svc:5555"
    )  # the agent's validator
    embedded = kustomize(bins, "gpu-operator-embedded")
    assert ("DaemonSet", "nvidia-dcgm") in kinds(embedded) and ("DaemonSet", "dcgm-exporter") not in kinds(
        embedded
    )
    ds = next(d for d in embedded if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "nvidia-dcgm")
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HOSTENGINE_GUARD_NAMESPACES"] == "gpu-healthcheck,gpu-operator"
    assert env["HOSTENGINE_GUARD_SELECTOR"].endswith(";app=nvidia-dcgm-exporter")
    kube.ensure_namespace("gpu-healthcheck")  # a server dry run does not create it for the rest
    for overlay in ("gpu-operator-dcgm", "gpu-operator-embedded"):
        out = kube.kubectl("apply", "--dry-run=server", "-k", str(OVERLAYS / overlay)).stdout
        assert "(server dry run)" in out and "error" not in out.lower()


def run_entrypoint(kube: Any, ns: str, node: str, tmp_path: Path) -> tuple[int, str]:
    binary = tmp_path / "nv-hostengine"
    binary.write_text(FAKE_ENGINE.format(py=sys.executable))
    binary.chmod(0o755)
    sa = tmp_path / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(kube.token_for(ns, "nvidia-dcgm", expiration=600))
    (sa / "ca.crt").write_bytes(Path(kube.ca_cert).read_bytes())
    (tmp_path / "proc").mkdir(exist_ok=True)
    host, port = kube.url.removeprefix("https://").rsplit(":", 1)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "KUBERNETES_SERVICE_HOST": host.strip("[]"),
        "KUBERNETES_SERVICE_PORT": port,
        "NODE_NAME": node,
        "POD_NAME": "ours",
        "POD_NAMESPACE": ns,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "hostengine", "--binary", str(binary), "--port", "1",
         "--proc", str(tmp_path / "proc"), "--sa-dir", str(sa)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "fake nv-hostengine args" in line:
            proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    return proc.returncode, "".join(lines) + rest


@pytest.mark.kube
def test_the_engine_refuses_to_start_next_to_an_engine_in_another_pod(
    kube: Any, kube_namespace: str, gpu_node: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    kube.create_service_account(ns, "default")
    engine_rbac(kube, ns)
    node = gpu_node().metadata.name
    add_pod(
        kube,
        ns,
        "ours",
        node,
        "10.9.0.1",
        {},
        {"name": "e", "image": "ghcr.io/gpu-healthcheck/hostengine:0.1.0"},
    )
    add_pod(kube, ns, "exporter", node, "10.9.0.2", {}, REMOTE_EXPORTER)  # a client: fine
    rc, out = run_entrypoint(kube, ns, node, tmp_path)
    assert rc == 0 and "fake nv-hostengine args" in out  # only itself and a remote exporter: starts

    add_pod(kube, ns, "operator-exporter", node, "10.9.0.3", {}, EMBEDDED_EXPORTER)
    rc, out = run_entrypoint(kube, ns, node, tmp_path)
    assert rc == 3 and "fake nv-hostengine args" not in out
    assert (
        f"another DCGM engine runs on this node: {ns}/operator-exporter (dcgm-exporter with an embedded"
        in out
    )

    from kubernetes import client

    from agent.cli.dcgm_engines import dcgm_engines_on_node

    engines = dcgm_engines_on_node(client.CoreV1Api(kube.api_client()), node)()
    assert sorted(engines) == [f"{ns}/operator-exporter (dcgm-exporter with an embedded engine)",
                               f"{ns}/ours (nv-hostengine)"]  # fmt: skip

    # The agent lists its node's pods at most every 10 minutes: an engine that appears is seen then.
    now = [0.0]
    throttled = dcgm_engines_on_node(client.CoreV1Api(kube.api_client()), node, clock=lambda: now[0])
    first = throttled()
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/operator-exporter", {"gracePeriodSeconds": 0})
    assert throttled() == first  # within the refresh: no new list
    now[0] += 601
    deadline = time.monotonic() + 10
    while len(throttled()) != 1 and time.monotonic() < deadline:
        now[0] += 601
        time.sleep(0.2)
    assert throttled() == [f"{ns}/ours (nv-hostengine)"]
