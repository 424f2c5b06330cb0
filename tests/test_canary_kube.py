"""The canary ConfigMap with the real agent and a real API server (issue 28 item 5): the Node's
`gpu-healthcheck/config=canary` label switches the agent to the canary directory and back, a missing
canary leaves the main config in force, an invalid canary is rejected with an Event naming the
config that stays. The directories stand for the DaemonSet's two ConfigMap volumes (the optional one
is an empty directory while its ConfigMap does not exist)."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.config import CONFIG_FILES
from agent.core.node_keys import CANARY, Keys
from agent.core.results_doc import CONFIG_FIELD
from tests.test_agent_kube import HEALTHY, AgentProcess, node_dict, wait_for

pytestmark = pytest.mark.kube

K = Keys()
MAIN_CONFIG = "intervals:\n  gpu: 30\nconfigPollSeconds: 0.5\nnode:\n  mode: taint\n"
CANARY_CONFIG = "intervals:\n  gpu: 30\nconfigPollSeconds: 0.5\nnode:\n  mode: observe\n"


def config_in_force(world: dict[str, Any]) -> dict[str, Any]:
    raw = node_dict(world)["metadata"].get("annotations", {}).get(K.results)
    return dict(json.loads(raw).get(CONFIG_FIELD) or {}) if raw else {}


def config_events(world: dict[str, Any]) -> list[tuple[str, str]]:
    out = world["kube"].kubectl(
        "get", "events", "-A", "--field-selector", f"involvedObject.name={world['node']}", "-o", "json"
    )
    # In the order they were posted: creationTimestamp has whole seconds, resourceVersion (etcd's
    # revision) grows with every write.
    items = sorted(json.loads(out.stdout)["items"], key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e["message"]) for e in items if e["reason"].startswith("Config")]


def label(world: dict[str, Any], value: str | None) -> None:
    arg = f"{K.config_channel}={value}" if value else f"{K.config_channel}-"
    world["kube"].kubectl("label", "node", world["node"], arg, "--overwrite")


def test_the_canary_label_switches_the_config_and_back(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    main, canary = tmp_path / "config", tmp_path / "config-canary"
    main.mkdir()
    canary.mkdir()  # the optional volume of a ConfigMap that does not exist yet
    (main / "config.yaml").write_text(MAIN_CONFIG)
    agent = AgentProcess(kube, node, snap, main, tmp_path / "agent.log", "--canary-config-dir", str(canary))
    world = {"node": node, "kube": kube, "core": kube.api_client(), "agent": agent}
    try:
        first = wait_for(lambda: config_in_force(world), what="the results annotation")
        assert (first["source"], first["mode"]) == ("main", "taint")

        # Labelled, but no canary ConfigMap: the main config stays, nothing is reloaded.
        label(world, CANARY)
        time.sleep(2)  # four polls
        assert config_in_force(world)["source"] == "main" and config_events(world) == []

        # The canary ConfigMap appears: the agent runs it (mode observe) and says so.
        (canary / "config.yaml").write_text(CANARY_CONFIG)
        on = wait_for(lambda: config_in_force(world).get("source") == "canary" and config_in_force(world))
        assert on["mode"] == "observe" and on["digest"] != first["digest"]
        reason, message = config_events(world)[-1]
        assert reason == "ConfigReloaded" and "the canary ConfigMap" in message and "node.mode" in message
        assert f"was the main ConfigMap ({main})" in message

        # An invalid canary edit: rejected, the canary's last good config stays, and the Event says so.
        (canary / "config.yaml").write_text(CANARY_CONFIG.replace("observe", "sometimes"))
        wait_for(lambda: config_events(world)[-1][0] == "ConfigRejected", what="ConfigRejected")
        message = config_events(world)[-1][1]
        assert message.startswith("the canary ConfigMap: ") and "node.mode" in message
        kept = f"the canary ConfigMap ({canary}), digest {on['digest']}"
        assert f"keeping the configuration in force ({kept})" in message
        assert config_in_force(world)["mode"] == "observe"

        # The label removed: back to the main config (unchanged, yet reloaded), and the agent never
        # touched the operator's label while it ran.
        label(world, None)
        wait_for(lambda: config_in_force(world).get("source") == "main", what="back to main")
        assert config_in_force(world) == first
        reason, message = config_events(world)[-1]
        assert reason == "ConfigReloaded" and "the main ConfigMap" in message
        assert "was the canary ConfigMap" in message

        # Labelled again while the canary is invalid: rejected, the main config stays in force.
        label(world, CANARY)
        rejected = sum(r == "ConfigRejected" for r, _ in config_events(world))
        wait_for(
            lambda: sum(r == "ConfigRejected" for r, _ in config_events(world)) > rejected,
            what="a second ConfigRejected",
        )
        assert f"(the main ConfigMap ({main}), digest {first['digest']})" in config_events(world)[-1][1]
        assert config_in_force(world)["source"] == "main"
        assert node_dict(world)["metadata"]["labels"][K.config_channel] == CANARY

        # Fixed, then the canary ConfigMap deleted (the kubelet empties the volume): main again.
        (canary / "config.yaml").write_text(CANARY_CONFIG)
        wait_for(lambda: config_in_force(world).get("source") == "canary", what="the fixed canary")
        for name in CONFIG_FILES:
            (canary / name).unlink(missing_ok=True)
        wait_for(lambda: config_in_force(world).get("source") == "main", what="main after the delete")
        assert agent.proc.poll() is None
    finally:
        agent.stop(signal.SIGKILL)


def test_an_agent_restarted_on_a_canary_node_starts_on_the_canary(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    """The label is read before the first verdict: a restart never writes under the main config first."""
    node = gpu_node(instance_type="p5.48xlarge", gpus=8, labels={K.config_channel: CANARY}).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    main, canary = tmp_path / "config", tmp_path / "config-canary"
    main.mkdir()
    canary.mkdir()
    (main / "config.yaml").write_text(MAIN_CONFIG)
    (canary / "config.yaml").write_text(CANARY_CONFIG)
    agent = AgentProcess(kube, node, snap, main, tmp_path / "agent.log", "--canary-config-dir", str(canary))
    world = {"node": node, "kube": kube, "core": kube.api_client(), "agent": agent}
    try:
        first = wait_for(lambda: config_in_force(world), what="the results annotation")
        assert (first["source"], first["mode"]) == ("canary", "observe")
        wait_for(lambda: config_events(world), what="the ConfigReloaded Event of the switch")
        assert "the canary ConfigMap" in config_events(world)[0][1]
    finally:
        agent.stop(signal.SIGKILL)


def test_status_counts_what_an_agent_in_observe_would_do(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    """The real agent in observe, an Xid 79: no taint, no mark, and `status` says both would come."""
    from tests.test_agent_kube import XID_LINE, our_taint, status_cli

    pool = f"observe-{time.time_ns()}"
    node = gpu_node(instance_type="p5.48xlarge", gpus=8, labels={"test.example/pool": pool}).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    main = tmp_path / "config"
    main.mkdir()
    (main / "config.yaml").write_text(
        "intervals:\n  gpu: 30\nnode:\n  mode: observe\n  remediationConditions:\n"
        "    - type: AcceleratedHardwareReady\n"
    )
    agent = AgentProcess(kube, node, snap, main, tmp_path / "agent.log")
    world = {"node": node, "kube": kube, "core": kube.api_client(), "agent": agent}
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "fail", what="fail")
        assert our_taint(node_dict(world)) is None
        out = status_cli(kube, "--selector", f"test.example/pool={pool}")
        assert out.returncode == 1, out.stderr  # a node fails
        lines = out.stdout.splitlines()
        assert "WOULD TAINT" in lines[0] and "WOULD MARK" in lines[0]
        row = next(line for line in lines if line.startswith(node))
        assert "reboot:NoSchedule" in row and "AcceleratedHardwareReady" in row
        assert "observe (1 node): 1 node would be tainted, 1 would be marked for remediation" in lines
    finally:
        agent.stop(signal.SIGKILL)
