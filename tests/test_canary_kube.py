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

from agent.config import CONFIG_FILES, yaml_safe
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
        rejected = sum(r == "ConfigRejected" for r, _ in config_events(world))  # before: it can be quick
        label(world, CANARY)
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


# ----------------------------------------------------------------------------- the docs' recipe

DAY2 = Path(__file__).resolve().parent.parent / "docs" / "guides" / "day-2-config.md"
SHIPPED_CM = Path(__file__).resolve().parent.parent / "manifests" / "20-configmap.yaml"


def recipe() -> tuple[str, str]:
    """The docs' canary recipe (the sh block of "The canary ConfigMap"), split at its promote step."""
    import re

    text = DAY2.read_text()
    section = text[text.index("### The canary ConfigMap") :]
    section = section[: section.index("\n### ", 10)]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    head, promote = block.split("# promote", 1)
    return head, "# promote" + promote


class ConfigMapVolume:
    """What the kubelet does for the DaemonSet's ConfigMap volumes (none runs here): each file of
    ConfigMap *name* in *ns* in *directory*, an empty directory while it does not exist."""

    def __init__(self, kube: Any, ns: str, name: str, directory: Path) -> None:
        import threading

        self.kube, self.path, self.dir = kube, f"/api/v1/namespaces/{ns}/configmaps/{name}", directory
        directory.mkdir(exist_ok=True)
        self.stop = threading.Event()
        self.sync()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sync(self) -> None:
        status, doc = self.kube.request("GET", self.path)
        data = dict(doc.get("data") or {}) if status == 200 else {}
        for old in self.dir.iterdir():
            if old.name not in data:
                old.unlink()
        for name, text in data.items():
            if not (self.dir / name).is_file() or (self.dir / name).read_text() != text:
                (self.dir / f".{name}.tmp").write_text(text)
                (self.dir / f".{name}.tmp").rename(self.dir / name)

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            self.sync()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def test_the_readme_canary_recipe_as_written_starts_from_the_live_configmap(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    """The SRE's finding: the recipe copied the repository's files (mode taint), so an install in
    observe that followed it put its canary nodes into taint. The docs' block, run by bash as
    written (only the namespace, the node names and $EDITOR are the test's) against an install in
    observe: the canary is the live config with the one edit (observe kept), the real agent on
    NODE1 runs it, and the promote leaves the live ConfigMap equal to the canary, labels kept."""
    import subprocess
    import sys

    import yaml

    from tests.kubeenv.env import unique_name

    ns = unique_name("gpuhc-recipe", max_len=40)
    kube.ensure_namespace(ns)
    shipped = yaml_safe.load(SHIPPED_CM.read_text())
    live_config = (
        shipped["data"]["config.yaml"]
        .replace("\n  gpu: 60 ", "\n  gpu: 30 ")
        .replace("\n  mode: taint\n", "\n  mode: observe\n")
        .replace("\nconfigPollSeconds: 2 ", "\nconfigPollSeconds: 0.5 ")
    )
    assert live_config.count("mode: observe") == 1 and "gpu: 30 " in live_config
    cm = dict(shipped, metadata={**shipped["metadata"], "namespace": ns})
    cm["data"] = {
        **shipped["data"],
        "config.yaml": live_config,
    }  # an install in observe (Helm --set mode=observe)
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(cm))
    node1, node2 = (gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name for _ in range(2))

    main, canary = tmp_path / "config", tmp_path / "config-canary"
    volumes = [
        ConfigMapVolume(kube, ns, "gpu-healthcheck-config", main),
        ConfigMapVolume(kube, ns, "gpu-healthcheck-config-canary", canary),
    ]
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    agent = AgentProcess(kube, node1, snap, main, tmp_path / "agent.log", "--canary-config-dir", str(canary))
    world = {"node": node1, "kube": kube, "core": kube.api_client(), "agent": agent}

    work = tmp_path / "work"
    work.mkdir()
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's/^  gpu: 30 /  gpu: 20 /' \"$1\"\n")  # the one change to try
    editor.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "kubectl").symlink_to(kube.binaries.kubectl)
    env = {
        "PATH": f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "KUBECONFIG": str(kube.kubeconfig),
        "HOME": str(tmp_path),
        "EDITOR": str(editor),
    }

    def run(script: str) -> tuple[str, list[str]]:
        text = script.replace("-n gpu-healthcheck ", f"-n {ns} ").replace("NODE1 NODE2", f"{node1} {node2}")
        trap = "trap 'echo \"FAILED($?): $BASH_COMMAND\" >&2' ERR\n"
        proc = subprocess.run(
            ["bash", "-c", trap + text], cwd=work, env=env, capture_output=True, text=True, timeout=180
        )
        failed = [line for line in proc.stderr.splitlines() if line.startswith("FAILED(")]
        return proc.stdout + proc.stderr, failed

    def data(name: str) -> dict[str, str] | None:
        status, doc = kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{name}")
        return dict(doc["data"]) if status == 200 else None

    try:
        first = wait_for(lambda: config_in_force(world), what="the agent on the live config")
        assert (first["source"], first["mode"]) == ("main", "observe")
        head, promote = recipe()
        out, failed = run(head)
        # diff says the one change (exit 1); status exits 2 (nodes no agent judged): not failures
        assert all(f.split(": ", 1)[1].startswith(("diff ", "gpu-healthcheck status")) for f in failed), out
        assert "+  gpu: 20 " in out and "-  gpu: 30 " in out, out  # diff -ru live/ canary/
        assert "valid" in out, out  # gpu-healthcheck config validate canary/
        live, made = data("gpu-healthcheck-config"), data("gpu-healthcheck-config-canary")
        assert live is not None and made is not None
        assert set(made) == set(live) == set(CONFIG_FILES)  # a whole config: every file
        assert made["config.yaml"] == live["config.yaml"].replace("\n  gpu: 30 ", "\n  gpu: 20 ")
        assert {k: v for k, v in made.items() if k != "config.yaml"} == {
            k: v for k, v in live.items() if k != "config.yaml"
        }
        assert "\n  mode: observe\n" in made["config.yaml"]  # never the repository's taint
        on = wait_for(
            lambda: config_in_force(world).get("source") == "canary" and config_in_force(world),
            what="the agent on the canary",
        )
        assert on["mode"] == "observe" and on["digest"] != first["digest"]
        assert node_dict(world)["metadata"]["labels"][K.config_channel] == CANARY

        out, failed = run(promote)
        assert not failed, out
        promoted = data("gpu-healthcheck-config")
        assert promoted == made and data("gpu-healthcheck-config-canary") is None
        _, doc = kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/gpu-healthcheck-config")
        assert doc["metadata"]["labels"] == shipped["metadata"]["labels"]  # the install's labels kept
        # The main ConfigMap's volume can show the promoted files a moment after the canary is gone:
        # the agent may first reload the main config it had, then the promoted one.
        back = wait_for(
            lambda: (
                (c := config_in_force(world)).get("source") == "main"
                and c.get("digest") == on["digest"]
                and c
            ),
            what="the agent back on the main ConfigMap, with the promoted files",
        )
        assert back == on | {"source": "main"}  # the same files: the same digest, observe
        assert K.config_channel not in node_dict(world)["metadata"]["labels"]
    finally:
        agent.stop(signal.SIGKILL)
        for volume in volumes:
            volume.close()
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
