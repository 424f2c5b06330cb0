"""A clear sticks, on the real API server (issue 44 item 3, production review 3 U3).

`gpu-healthcheck clear` with node repair on (a remediation condition), then the agent restarted in
the same boot with the Xid line still in its kernel log: the node stays pass, untainted and not
marked for repair, and its history shows no resurrection; a new Xid on another GPU fails it; a
restart in a new boot (another boot id, the same line in the new boot's log) fails it again. The
pure rule and the engine's side: tests/test_clear_cover.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.core.clear_cover import CLEAR_COVER_FIELD
from agent.core.node_keys import Keys
from tests.test_agent_kube import (
    XID_LINE,
    AgentProcess,
    condition,
    node_dict,
    our_taint,
    start_agent,
    wait_for,
)
from tests.test_clear import clear_cli, event_messages
from tests.test_remediation_kube import AHR, ONE_ENTRY

pytestmark = pytest.mark.kube

ROOT = Path(__file__).parent.parent
K = Keys()
XID = "xid/79/0000:97:00.0"
OTHER = "xid/79/0000:53:00.0"
STATUS = (sys.executable, "-m", "agent.cli", "status")
SAID = "were cleared in this boot"  # the agent's log, when a restart meets lines a clear covered
OTHER_LINE = XID_LINE.replace("03:12:44", "04:00:01").replace("PCI:0000:97:00", "PCI:0000:53:00")


def results(world: dict[str, Any]) -> dict[str, Any]:
    return json.loads(node_dict(world)["metadata"]["annotations"][K.results])  # type: ignore[no-any-return]


def history(kubeconfig: Path | str, node: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [*STATUS, node, "--history", "-o", "json", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def failing(world: dict[str, Any], key: str, marked: bool = True) -> Any:
    """Failed on `key` alone and tainted; *marked*: AHR=False too (a second mark in the repair
    budget's window is held, which is the budget's business, not this test's)."""
    node = node_dict(world)
    doc = json.loads(node["metadata"]["annotations"].get(K.results) or "{}")
    ahr = next((c for c in node["status"].get("conditions") or [] if c["type"] == AHR), {})
    return (
        node["metadata"]["labels"].get(K.status) == "fail"
        and our_taint(node)
        and (ahr.get("status") == "False" or not marked)
        and [x["key"] for x in doc.get("latched") or []] == [key]
    )


def restart(world: dict[str, Any], tmp_path: Path, name: str) -> None:
    world["agent"].stop()
    assert world["agent"].proc.returncode == 0
    world["agent"] = AgentProcess(
        world["kube"], world["node"], world["snap"], world["cfg"], tmp_path / f"{name}.log"
    )


@pytest.mark.kube
def test_a_clear_survives_restarts_and_only_new_lines_fail_the_node(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    world = start_agent(kube, gpu_node, tmp_path, ONE_ENTRY)
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        wait_for(lambda: failing(world, XID), timeout=20, what="failed, tainted, AHR=False on the Xid")
        done = clear_cli(kube.kubeconfig, world["node"], "--all", "--reason", "GPU reseated", "--wait", "30")
        assert done.returncode == 0 and "the node is now pass" in done.stdout, done.stdout + done.stderr
        wait_for(lambda: our_taint(node_dict(world)) is None, what="untainted")
        wait_for(lambda: (condition(world, AHR) or {}).get("status") == "True", what="AHR=True")
        cover = results(world)[CLEAR_COVER_FIELD]
        assert (
            list(cover["lines"]) == [XID]
            and cover["bootId"] == (world["snap"] / "boot_id").read_text().strip()
        )

        # Restarted in the same boot (a rollout, a rollback, a crash): kmsg.log still holds the line.
        for n in (1, 2):
            restart(world, tmp_path, f"restart-{n}")
            log: Path = world["agent"].log
            wait_for(lambda log=log: log.read_text().count("tier gpu:") >= 4, what="four gpu cycles")
            wait_for(lambda log=log: "tier xid:" in log.read_text(), what="the xid tier's first run")
            node = node_dict(world)
            assert node["metadata"]["labels"][K.status] == "pass" and our_taint(node) is None, log.read_text()
            assert (condition(world, AHR) or {}).get("status") == "True"
            assert results(world)["latched"] == [] and results(world)[CLEAR_COVER_FIELD] == cover
            assert SAID in log.read_text()  # it met the line, and said why it is no failure
        assert len(event_messages(world, "LatchedFinding")) == 1  # the Xid's own, never again
        since_clear = [
            e for e in history(kube.kubeconfig, world["node"]) if "clear" in e.get("did", "").split("+")
        ]
        assert since_clear, "the clear is in the history"
        after = history(kube.kubeconfig, world["node"])
        tail = after[after.index(since_clear[-1]) + 1 :]
        assert all(e["status"] != "fail" for e in tail), tail  # no resurrection
        kept = [(e["status"], e["did"], e["by"]) for e in tail if e.get("did") == "clear-kept"]
        assert kept == [("pass", "clear-kept", "agent")] * 2, after  # one per restart says why

        # A new Xid on another GPU after the clear fails the node (only that one is latched).
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(OTHER_LINE)
        wait_for(lambda: failing(world, OTHER, marked=False), timeout=20, what="failed on the new Xid alone")
        # its Event is posted after the Node's PATCH, and listed a moment later
        wait_for(lambda: len(event_messages(world, "LatchedFinding")) >= 2, timeout=15, what="its Event")
        assert len(event_messages(world, "LatchedFinding")) == 2

        # A new boot: the clear of the old one covers nothing, the same line fails again.
        world["agent"].stop()
        (world["snap"] / "boot_id").write_text("a-new-boot-0000\n")
        kmsg = (world["snap"] / "kmsg.log").read_text().replace(OTHER_LINE, "")
        (world["snap"] / "kmsg.log").write_text(kmsg)  # the new boot's log: the old Xid's line, no other
        restart(world, tmp_path, "rebooted")
        wait_for(lambda: failing(world, XID, marked=False), timeout=30, what="failed again in the new boot")
        assert CLEAR_COVER_FIELD not in results(world)
    except AssertionError:
        print(world["agent"].log.read_text()[-6000:])
        raise
    finally:
        world["agent"].stop(signal.SIGKILL)
