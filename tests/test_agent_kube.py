"""The agent process end to end against a real kube-apiserver, on a snapshot-backed node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.config import yaml_safe
from agent.core.node_keys import CLEAR_ALL, CONDITIONS, DEFAULT_CONDITION_TYPE, Keys
from agent.core.severity import Status

pytestmark = pytest.mark.kube

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)
K = Keys()
TAINT = K.taint
COND = DEFAULT_CONDITION_TYPE


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def agent_argv(kubeconfig: Path, node: str, snapshot: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agent.cli",
        "agent",
        "--node",
        node,
        "--from-snapshot",
        str(snapshot),
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port",
        "0",
        *extra,
    ]


def run_agent_once(kube: Any, node: str, snapshot: str, *extra: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as state:
        argv = agent_argv(
            kube.kubeconfig,
            node,
            ROOT / "examples" / "snapshots" / snapshot,
            "--once",
            "--state-dir",
            state,
            *extra,
        )
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)


class AgentProcess:
    def __init__(self, kube: Any, node: str, snap: Path, config_dir: Path, log: Path, *extra: str) -> None:
        self.log = log
        state = log.parent / "state"  # the last good config: this test's own, never /tmp's
        kube.ensure_namespace("gpu-healthcheck")  # the repair budget's records, as manifests/ creates it
        self.proc = subprocess.Popen(
            agent_argv(
                kube.kubeconfig, node, snap, "--config-dir", str(config_dir), "--state-dir", str(state)
            )
            + list(extra),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            # debug: tests count tier runs in the log (a run that changes nothing logs at debug)
            env=dict(os.environ, PYTHONUNBUFFERED="1", GPU_HEALTHCHECK_LOG_LEVEL="debug"),
        )

    def stop(self, sig: int = signal.SIGTERM) -> float:
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - started


@pytest.fixture
def world(kube: Any, gpu_node: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.yaml").write_text("intervals:\n  gpu: 30\n")
    agent = AgentProcess(kube, node, snap, cfg, tmp_path / "agent.log")
    yield {"node": node, "snap": snap, "cfg": cfg, "agent": agent, "core": kube.api_client(), "kube": kube}
    agent.stop(signal.SIGKILL)
    if agent.proc.returncode not in (0, -9):
        print((tmp_path / "agent.log").read_text()[-4000:])


def node_dict(world: dict[str, Any]) -> dict[str, Any]:
    from kubernetes import client

    core = client.CoreV1Api(world["core"])
    obj = core.read_node(world["node"])
    return world["core"].sanitize_for_serialization(obj)  # type: ignore[no-any-return]


def our_taint(node: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in node["spec"].get("taints") or [] if t["key"] == TAINT), None)


def events(world: dict[str, Any]) -> list[str]:
    out = (
        world["kube"]
        .kubectl(
            "get", "events", "-A", "--field-selector", f"involvedObject.name={world['node']}", "-o", "json"
        )
        .stdout
    )
    return [e["reason"] for e in json.loads(out)["items"]]


def test_contract_xid_taint_sigterm(world: dict[str, Any]) -> None:
    labels = wait_for(
        lambda: (
            node_dict(world)["metadata"]["labels"].get(K.status) == "pass"
            and node_dict(world)["metadata"]["labels"]
        ),
        what="status=pass",
    )
    assert labels[K.severity] == "none"
    node = node_dict(world)
    assert our_taint(node) is None
    doc = json.loads(node["metadata"]["annotations"][K.results])
    assert doc["status"] == "pass" and doc["instanceType"] == "p5.48xlarge"
    # The condition is a second request (nodes/status) after the labels: wait for it too.
    cond = wait_for(
        lambda: next((c for c in node_dict(world)["status"]["conditions"] if c["type"] == COND), None),
        what=f"{COND} condition",
    )
    assert cond["status"] == CONDITIONS[Status.PASS].status
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"  # the fixture's labels survive

    # A kernel Xid 79 line taints the node without waiting for the 30 s tier interval.
    with (world["snap"] / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    taint = wait_for(lambda: our_taint(node_dict(world)), timeout=15, what="taint after Xid 79")
    assert taint["value"] == "reboot" and taint["effect"] == "NoSchedule"
    node = node_dict(world)
    assert node["metadata"]["labels"][K.status] == "fail"
    cond = wait_for(
        lambda: next(
            (
                c
                for c in node_dict(world)["status"]["conditions"]
                if c["type"] == COND and c["status"] == CONDITIONS[Status.FAIL].status
            ),
            None,
        ),
        what=f"{COND}={CONDITIONS[Status.FAIL].status}",
    )
    assert "Xid 79" in cond["message"]
    wait_for(lambda: "LatchedFinding" in events(world), what="LatchedFinding event")

    # SIGTERM: the agent exits quickly and leaves the taint in place.
    seconds = world["agent"].stop()
    assert world["agent"].proc.returncode == 0 and seconds < 5
    assert our_taint(node_dict(world)) is not None


def test_config_reload_and_rejection(world: dict[str, Any]) -> None:
    wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status), what="first verdict")
    (world["cfg"] / "config.yaml").write_text("intervals:\n  gpu: 5\n")
    wait_for(lambda: "ConfigReloaded" in events(world), what="ConfigReloaded")
    (world["cfg"] / "config.yaml").write_text("intervals:\n  gpu: soon\n")
    wait_for(lambda: "ConfigRejected" in events(world), what="ConfigRejected")
    assert world["agent"].proc.poll() is None  # a bad edit never stops the agent
    log = world["agent"].log.read_text()
    assert "config rejected" in log and "intervals.gpu" in log


def test_an_api_outage_mid_run_converges_after_it_ends(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    from urllib.parse import urlparse

    import yaml

    from tests.tcp_proxy import CuttableProxy

    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    url = urlparse(kube.url)
    proxy = CuttableProxy(url.hostname or "127.0.0.1", url.port or 443)
    kubeconfig = yaml_safe.load(Path(kube.kubeconfig).read_text())
    for cluster in kubeconfig["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "proxied.kubeconfig"
    proxied.write_text(yaml.safe_dump(kubeconfig))
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    cfg = tmp_path / "config"
    cfg.mkdir()
    proxy_kube = SimpleNamespace(kubeconfig=proxied, ensure_namespace=kube.ensure_namespace)
    agent = AgentProcess(proxy_kube, node, snap, cfg, tmp_path / "agent.log")
    world = {"node": node, "core": kube.api_client(), "kube": kube}
    try:
        wait_for(
            lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass",
            what="first verdict",
        )
        proxy.cut()
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        time.sleep(3)  # the agent sees the Xid while the API server is unreachable
        assert agent.proc.poll() is None, "the agent must survive an API outage"
        assert our_taint(node_dict(world)) is None
        proxy.resume()
        taint = wait_for(lambda: our_taint(node_dict(world)), timeout=60, what="taint after the outage")
        assert taint["value"] == "reboot"
        assert "Node write failed" in agent.log.read_text()
    finally:
        agent.stop(signal.SIGKILL)
        proxy.close()


def test_dry_run_writes_nothing(kube: Any, gpu_node: Callable[..., Any], tmp_path: Path) -> None:
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    proc = run_agent_once(kube, node, "p5.48xlarge-xid79", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    world = {"node": node, "core": kube.api_client(), "kube": kube}
    current = node_dict(world)
    assert not any(K.ours(k) for k in current["metadata"]["labels"])
    assert our_taint(current) is None
    assert "dry" in proc.stdout.lower()


def test_an_operator_clears_a_latched_xid(world: dict[str, Any]) -> None:
    wait_for(
        lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass",
        what="first verdict",
    )
    with (world["snap"] / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    wait_for(lambda: our_taint(node_dict(world)), timeout=15, what="taint after Xid 79")
    world["kube"].kubectl("annotate", "node", world["node"], f"{K.clear_latched}={CLEAR_ALL}")
    wait_for(
        lambda: K.clear_latched not in node_dict(world)["metadata"]["annotations"],
        what="the agent to consume the request",
    )
    wait_for(lambda: "LatchesCleared" in events(world), what="LatchesCleared event")
    node = node_dict(world)
    assert node["metadata"]["labels"][K.status] == "pass"
    assert json.loads(node["metadata"]["annotations"][K.results])["latched"] == []
    wait_for(lambda: our_taint(node_dict(world)) is None, what="the taint to go with the cleared finding")
    # The same Xid line is still in the kernel log: cleared means it does not come back by itself...
    time.sleep(1.5)
    assert node_dict(world)["metadata"]["labels"][K.status] == "pass"
    # ...but a new Xid does.
    with (world["snap"] / "kmsg.log").open("a") as fh:
        fh.write(XID_LINE)
    wait_for(
        lambda: node_dict(world)["metadata"]["labels"][K.status] == "fail",
        timeout=15,
        what="fail after a new Xid",
    )


def status_cli(kube: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "status", "--kubeconfig", str(kube.kubeconfig), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_status_command_shows_the_fleet(kube: Any, gpu_node: Callable[..., Any]) -> None:
    from kubernetes import client

    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    run = run_agent_once(kube, node, "p5.48xlarge-xid79")
    assert run.returncode == 0, run.stdout + run.stderr
    status = status_cli(kube)
    assert status.returncode == 1, status.stderr  # a node fails: `check`'s exit code for fail
    line = next(row for row in status.stdout.splitlines() if row.startswith(node))
    assert "fail" in line and "reboot" in line and "0000:97:00.0" in line and " none " in line

    # An agent pod on the node, Ready (the kubelet's word: checked within staleAfterSeconds).
    core = client.CoreV1Api(kube.api_client())
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            generate_name="agent-", labels={"app.kubernetes.io/name": "gpu-healthcheck-agent"}
        ),
        spec=client.V1PodSpec(
            node_name=node, containers=[client.V1Container(name="agent", image="agent:test")]
        ),
    )
    try:  # no controller-manager here: the ServiceAccount admission needs the account to exist
        core.create_namespaced_service_account(
            "default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        )
    except client.ApiException as exc:
        assert exc.status == 409
    made = core.create_namespaced_pod("default", pod)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    core.patch_namespaced_pod_status(made.metadata.name, "default", {"status": {"conditions": [ready]}})
    items = json.loads(status_cli(kube, "-o", "json").stdout)
    mine = next(i for i in items if i["node"] == node)
    assert mine["agent"] == "ready" and mine["agentPod"] == made.metadata.name
    assert mine["lastCheck"].startswith("<") and mine["lastCheckMaxSeconds"] <= 180 + 30
    assert mine["taint"] == "reboot:NoSchedule"
    wide = status_cli(kube, "-o", "wide")
    assert "TAINT" in wide.stdout.splitlines()[0] and "p5.48xlarge" in wide.stdout
    assert status_cli(kube, "-o", "yaml").stdout.startswith("- node:")

    broken = subprocess.run(
        [sys.executable, "-m", "agent.cli", "status", "--kubeconfig", "/nonexistent/kubeconfig"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert (
        broken.returncode == 69
        and "Traceback" not in broken.stderr
        and "cannot read the cluster" in broken.stderr
    )
    assert status_cli(kube, "-o", "xml").returncode == 64


def start_agent(kube: Any, gpu_node: Callable[..., Any], tmp_path: Path, config: str) -> dict[str, Any]:
    """An agent process on a copy of the healthy snapshot, with this config.yaml."""
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    cfg = tmp_path / "config"
    cfg.mkdir(exist_ok=True)
    (cfg / "config.yaml").write_text(config)
    agent = AgentProcess(kube, node, snap, cfg, tmp_path / "agent.log")
    return {"node": node, "snap": snap, "cfg": cfg, "agent": agent, "core": kube.api_client(), "kube": kube}


def condition(world: dict[str, Any], ctype: str = COND) -> dict[str, Any] | None:
    return next((c for c in node_dict(world)["status"].get("conditions") or [] if c["type"] == ctype), None)


def hang_nvidia_smi(snap: Path) -> None:
    """A recorded nvidia-smi timeout: a GPU failure (reboot) that is not latched."""
    (snap / "errors.json").write_text(
        json.dumps({"nvidia-smi-q.txt": {"kind": "timeout", "message": "no answer after 30 s; killed"}})
    )


def test_a_tainted_node_whose_nvidia_smi_output_turns_unreadable_stays_tainted(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    world = start_agent(kube, gpu_node, tmp_path, "intervals:\n  gpu: 1\nnode:\n  recoverAfter: 3\n")
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        hang_nvidia_smi(world["snap"])
        taint = wait_for(lambda: our_taint(node_dict(world)), timeout=20, what="taint")
        assert taint["value"] == "reboot"
        (world["snap"] / "nvidia-smi-q.txt").write_bytes(b"\x00\x01 not nvidia-smi output")
        (world["snap"] / "errors.json").unlink()
        wait_for(
            lambda: "recovery paused" in ((condition(world) or {}).get("message") or ""),
            timeout=20,
            what="the condition to say recovery is paused",
        )
        runs_before = world["agent"].log.read_text().count("tier gpu:")
        wait_for(
            lambda: world["agent"].log.read_text().count("tier gpu:") >= runs_before + 6,
            timeout=30,
            what="six more gpu cycles",
        )
        node = node_dict(world)
        assert node["metadata"]["labels"][K.status] == "unknown"
        assert our_taint(node) == taint, "an unknown cycle never clears the taint nor changes its value"
        assert (condition(world) or {}).get("status") == CONDITIONS[Status.UNKNOWN].status
        # Readable and healthy again: the taint goes after recoverAfter passing cycles.
        shutil.copy(HEALTHY / "nvidia-smi-q.txt", world["snap"] / "nvidia-smi-q.txt")
        wait_for(lambda: our_taint(node_dict(world)) is None, timeout=30, what="untaint after 3 passes")
        assert "TaintRemoved" in events(world)
    finally:
        world["agent"].stop(signal.SIGKILL)


def reload_config(world: dict[str, Any], text: str) -> None:
    """Edit config.yaml and wait until the agent applied it (one more ConfigReloaded Event)."""
    before = events(world).count("ConfigReloaded")
    (world["cfg"] / "config.yaml").write_text(text)
    wait_for(lambda: events(world).count("ConfigReloaded") > before, timeout=20, what="ConfigReloaded")


def test_modes_observe_label_taint_and_an_effect_change_moves_the_taint(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    base = "intervals:\n  gpu: 30\nnode:\n  maxTaintedFraction: 0\n"
    world = start_agent(kube, gpu_node, tmp_path, base + "  mode: observe\n")
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "fail", what="fail")
        wait_for(lambda: "GPUHealthChanged" in events(world), what="GPUHealthChanged")
        time.sleep(2)
        node = node_dict(world)
        assert our_taint(node) is None and K.unhealthy not in node["metadata"]["labels"]
        assert (condition(world) or {}).get("status") == "False"
        assert not {"BrakeOpen", "TaintAdded"} & set(events(world)), "observe: no taint, no brake"

        reload_config(world, base + "  mode: label\n")
        wait_for(
            lambda: node_dict(world)["metadata"]["labels"].get(K.unhealthy) == "reboot",
            what="the unhealthy label in label mode",
        )
        assert our_taint(node_dict(world)) is None and "BrakeOpen" not in events(world)

        taint_mode = "intervals:\n  gpu: 30\nnode:\n  mode: taint\n"
        reload_config(world, taint_mode + "  taintEffectBySeverity: {reboot: NoExecute}\n")
        taint = wait_for(lambda: our_taint(node_dict(world)), what="the taint in taint mode")
        assert (taint["value"], taint["effect"]) == ("reboot", "NoExecute")
        assert K.unhealthy not in node_dict(world)["metadata"]["labels"]

        reload_config(world, taint_mode + "  taintEffect: PreferNoSchedule\n")
        wait_for(
            lambda: (
                [t["effect"] for t in node_dict(world)["spec"]["taints"] if t["key"] == TAINT]
                == ["PreferNoSchedule"]
            ),
            what="exactly one taint of ours, with the new effect",
        )
    finally:
        world["agent"].stop(signal.SIGKILL)


def test_brake_limits_condition_type_and_prefix_after_a_reload(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    base = "intervals:\n  gpu: 30\n"
    world = start_agent(kube, gpu_node, tmp_path, base + "node:\n  maxTaintedFraction: 0\n")
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        wait_for(lambda: "BrakeOpen" in events(world), what="BrakeOpen under maxTaintedFraction 0")
        assert our_taint(node_dict(world)) is None

        reload_config(world, base + "node:\n  maxTaintedFraction: 1\n")  # the brake takes it at once
        wait_for(lambda: our_taint(node_dict(world)), what="the taint under the new limit")

        new_type = "AcceleratedHardwareReady"
        reload_config(world, base + f"node:\n  maxTaintedFraction: 1\n  conditionType: {new_type}\n")
        wait_for(
            lambda: condition(world, new_type) is not None and condition(world, COND) is None,
            what="the condition under its new type, the old one gone",
        )
        assert (condition(world, new_type) or {})["status"] == "False"

        reload_config(
            world, base + f"prefix: other\nnode:\n  maxTaintedFraction: 1\n  conditionType: {new_type}\n"
        )
        wait_for(lambda: "ConfigRestartRequired" in events(world), what="ConfigRestartRequired")
        node = node_dict(world)
        assert node["metadata"]["labels"][K.status] == "fail" and our_taint(node) is not None
        assert not any(k.startswith("other/") for k in node["metadata"]["labels"])
        assert world["agent"].proc.poll() is None
    finally:
        world["agent"].stop(signal.SIGKILL)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(port: int, name: str) -> float | None:
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_an_agent_started_under_an_invalid_config_runs_and_says_why(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.yaml").write_text("intervals:\n  gpu: 30\nnode:\n  futureKnob: true\n")  # a newer key
    port = free_port()
    world = {"node": node, "snap": snap, "cfg": cfg, "core": kube.api_client(), "kube": kube}
    agent = AgentProcess(kube, node, snap, cfg, tmp_path / "agent.log", "--metrics-port", str(port))
    world["agent"] = agent
    try:
        cond = wait_for(lambda: condition(world), what="the condition under the shipped defaults")
        assert cond["status"] == "True" and cond["reason"] == "ConfigRejected"
        assert "node.futureKnob" in cond["message"] and "shipped default" in cond["message"]
        # The status PATCH goes first: the labels follow in the Node PATCH right after.
        wait_for(
            lambda: (node_dict(world)["metadata"].get("labels") or {}).get(K.status) == "pass",
            what="the status label",
        )
        wait_for(lambda: "ConfigRejected" in events(world), what="ConfigRejected Event")
        assert wait_for(lambda: metric(port, "gpu_healthcheck_config_rejected") == 1.0, what="metric")
        assert agent.proc.poll() is None

        # The ConfigMap is fixed: the agent applies it and the condition says so.
        (cfg / "config.yaml").write_text("intervals:\n  gpu: 30\nnode:\n  conditionType: GPUOk\n")
        wait_for(
            lambda: (condition(world, "GPUOk") or {}).get("reason") == "AllChecksPassed",
            what="the fixed config in force",
        )
        assert metric(port, "gpu_healthcheck_config_rejected") == 0.0
        agent.stop(signal.SIGKILL)

        # A restart under a bad edit: the last good config (conditionType GPUOk) stays in force.
        (cfg / "config.yaml").write_text("intervals:\n  gpu: soon\n")
        agent = AgentProcess(kube, node, snap, cfg, tmp_path / "agent2.log")
        world["agent"] = agent
        wait_for(
            lambda: (condition(world, "GPUOk") or {}).get("reason") == "ConfigRejected",
            what="the last good config in force, rejected reason",
        )
        message = (condition(world, "GPUOk") or {})["message"]
        assert "intervals.gpu" in message and "last good configuration" in message
        assert agent.proc.poll() is None
    finally:
        world["agent"].stop(signal.SIGKILL)


def test_an_xid79_after_a_storm_taints_and_the_storm_is_one_finding_per_gpu_and_code(
    world: dict[str, Any],
) -> None:
    """20,000 Xid 13/31 lines appended at once, then an Xid 79: the taint comes (the follower reads
    the storm once and wakes the engine for the new code), and the storm is two latched findings."""
    wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="status=pass")
    lines = [
        f"kern  :warn  : 2025-01-21T03:12:{i * 50 // 20000:02d},{i % 1000:06d}+00:00 "
        "NVRM: Xid (PCI:0000:53:00): "
        + (
            "13, pid='4821', name=python3, Graphics SM Warp Exception"
            if i % 2
            else "31, pid=4821, name=python3, MMU Fault"
        )
        for i in range(20000)
    ]
    fd = os.open(world["snap"] / "kmsg.log", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.write(fd, XID_LINE.encode())
    finally:
        os.close(fd)
    wait_for(lambda: our_taint(node_dict(world)), timeout=60, what="taint after the storm's Xid 79")
    doc = json.loads(node_dict(world)["metadata"]["annotations"][K.results])
    keys = [latch["key"] for latch in doc["latched"] if latch["check"] == "xid"]
    assert sorted(keys) == ["xid/13/0000:53:00.0", "xid/31/0000:53:00.0", "xid/79/0000:97:00.0"]
    storm = next(latch for latch in doc["latched"] if latch["key"] == "xid/13/0000:53:00.0")
    assert storm["severity"] == "monitor" and "(storm)" in storm["message"]
