"""A clear made under an older agent survives the upgrade to this one (issue 44 item 3, review 3 U3),
on the real API server: the old agent's own code (its tree from git, `git archive` of the commit, run
with this venv as the review ran it) fails the node on an Xid, `gpu-healthcheck clear` clears it, the
old agent stops and this one starts in the same boot on the same kernel log: the node stays pass
(the old agent recorded only `lastClear`; core/clear_cover.py adopt), the cover is written, and a
new Xid still fails the node."""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from agent.core.clear_cover import CLEAR_COVER_FIELD
from agent.core.node_keys import Keys
from tests.test_agent_kube import (
    XID_LINE,
    AgentProcess,
    agent_argv,
    node_dict,
    our_taint,
    start_agent,
    wait_for,
)
from tests.test_clear import clear_cli
from tests.test_clear_sticks_kube import OTHER, OTHER_LINE, SAID, XID, failing, results
from tests.test_remediation_kube import ONE_ENTRY

pytestmark = pytest.mark.kube

ROOT = Path(__file__).parent.parent
K = Keys()
BASIC = "intervals:\n  gpu: 1\nnode:\n  maxTaintedFraction: 1\n"
OLD = {  # version: (commit, config.yaml it accepts)
    "0.2.0": ("a8b8806", ONE_ENTRY),  # main before this fix, node repair on
    "0.1.0": ("666ba1c", BASIC),  # the previous release
}


def has_commit(commit: str) -> bool:
    """Is `commit` in this repository (a shallow clone lacks the older releases)?"""
    try:
        got = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    except OSError:  # no git
        return False
    return got.returncode == 0


def old_tree(commit: str, dest: Path) -> Path:
    """The agent's files at `commit` (no git worktree: the repository's metadata stays untouched).
    Skips the test when the commit is not in this clone (a shallow one: `git fetch --unshallow`)."""
    if not has_commit(commit):
        pytest.skip(f"commit {commit} is not in this clone (a shallow one?): `git fetch --unshallow`")
    blob = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


class OldAgent(AgentProcess):
    """The old agent's process: its own tree as the working directory (`python -m agent.cli`)."""

    def __init__(self, world: dict[str, Any], tree: Path, log: Path) -> None:
        self.log = log
        argv = agent_argv(
            world["kube"].kubeconfig, world["node"], world["snap"], "--config-dir", str(world["cfg"])
        )
        self.proc = subprocess.Popen(
            [*argv, "--state-dir", str(log.parent / "old-state")],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=tree,
            env=dict(
                os.environ, PYTHONUNBUFFERED="1", GPU_HEALTHCHECK_LOG_LEVEL="debug", PYTHONPATH=str(tree)
            ),
        )


@pytest.mark.parametrize("version", list(OLD))
def test_a_clear_made_under_an_older_agent_survives_the_upgrade(
    version: str, kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    commit, config = OLD[version]
    tree = old_tree(commit, tmp_path / "old")
    assert f'__version__ = "{version}"' in (tree / "agent" / "__init__.py").read_text()
    world = start_agent(kube, gpu_node, tmp_path, config)
    world["agent"].stop(signal.SIGKILL)  # only for its node, snapshot and config: the old one runs first
    world["agent"] = OldAgent(world, tree, tmp_path / "old.log")
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        marked = config == ONE_ENTRY
        wait_for(lambda: failing(world, XID, marked), timeout=20, what=f"{version} failing on the Xid")
        done = clear_cli(kube.kubeconfig, world["node"], "--all", "--reason", "reseated", "--wait", "30")
        assert done.returncode == 0 and "the node is now pass" in done.stdout, done.stdout + done.stderr
        wait_for(lambda: our_taint(node_dict(world)) is None, what="untainted")
        assert results(world)["agentVersion"] == version  # the old code wrote it
        assert CLEAR_COVER_FIELD not in results(world) and results(world)["lastClear"]["latches"] == [XID]
        world["agent"].stop()

        # The upgrade: this agent, same boot, the Xid still in kmsg.log.
        world["agent"] = AgentProcess(kube, world["node"], world["snap"], world["cfg"], tmp_path / "new.log")
        log = world["agent"].log
        wait_for(lambda: log.read_text().count("tier gpu:") >= 4, what="four gpu cycles of the new agent")
        node = node_dict(world)
        assert node["metadata"]["labels"][K.status] == "pass" and our_taint(node) is None, log.read_text()
        assert SAID in log.read_text()
        wait_for(lambda: CLEAR_COVER_FIELD in results(world), what="the cover written by the new agent")
        assert list(results(world)[CLEAR_COVER_FIELD]["lines"]) == [XID]

        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(OTHER_LINE)
        wait_for(lambda: failing(world, OTHER, marked=False), timeout=20, what="failed on the new Xid")
    except AssertionError:
        print(world["agent"].log.read_text()[-6000:])
        raise
    finally:
        world["agent"].stop(signal.SIGKILL)
