"""`gpu-healthcheck clear NODE` (issue 22 item 3): un-quarantine in one command, audited.

Pure: what `clear` makes of a Node's results annotation (refused while another check fails, a latch
that is not latched is a usage error), what `status` shows of a clear by hand; the agent's side (who
and why in its Event, a clear that holds) is in tests/test_state.py. On the real API server:
the command against a running agent (LatchesCleared names the latches, who and why; `status` shows
it), its refusals and exit codes, the requester's identity, and the fence letting an operator write.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli.clear import ClearUsageError, judge, kubeconfig_user, whoami
from agent.cli.status import node_status, render
from agent.core.node_keys import Keys
from tests.test_agent_kube import (
    XID_LINE,
    events,
    hang_nvidia_smi,
    node_dict,
    our_taint,
    start_agent,
    wait_for,
)

ROOT = Path(__file__).parent.parent
K = Keys()
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
XID = "xid/79/0000:97:00.0"
RESPONSIVE_FAILS = '"name":"gpu.responsive","status":"fail"'  # in the results annotation's JSON


def node_with(results: dict[str, Any] | None, **ann: str) -> dict[str, Any]:
    annotations = dict(ann)
    if results is not None:
        annotations[K.results] = json.dumps(results)
    return {"metadata": {"name": "n1", "resourceVersion": "7", "annotations": annotations, "labels": {}}}


def results(*checks: tuple[str, str], latched: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    return {
        "status": "fail" if any(s == "fail" for _, s in checks) else "pass",
        "checks": [{"name": n, "status": s, "severity": "reset", "message": "m"} for n, s in checks],
        "latched": [{"check": c, "key": k, "severity": "reboot", "message": "m"} for c, k in latched],
    }


# ------------------------------------------------------------------------------------------ pure


def test_a_latch_alone_may_be_cleared() -> None:
    got = judge(
        node_with(results(("xid", "fail"), ("gpu.ecc", "pass"), latched=(("xid", XID),))),
        "gpu-healthcheck",
        None,
    )
    assert (got.value, got.latches, got.failing, got.judged) == ("all", (XID,), (), True)


def test_another_failing_check_is_named() -> None:
    doc = results(("xid", "fail"), ("gpu.ecc", "fail"), ("dcgm-diag", "fail"), latched=(("xid", XID),))
    got = judge(node_with(doc), "gpu-healthcheck", [XID])
    assert got.failing == ("gpu.ecc", "dcgm-diag") and got.value == XID


def test_a_key_not_latched_is_a_usage_error() -> None:
    with pytest.raises(ClearUsageError, match=r"not latched on this node: xid/48/x \(latched: " + XID):
        judge(node_with(results(("xid", "fail"), latched=(("xid", XID),))), "gpu-healthcheck", ["xid/48/x"])


def test_without_an_agents_results_nothing_can_be_judged() -> None:
    assert not judge(node_with(None), "gpu-healthcheck", None).judged


def test_who_falls_back_to_the_kubeconfig_user(tmp_path: Path) -> None:
    """An API server that cannot answer SelfSubjectReview (older, or locked down): the kubeconfig's
    current user names the requester."""

    class NoReview:
        def json(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("404 Not Found")

    kcfg = tmp_path / "kubeconfig"
    kcfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "alice@example.com", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "alice@example.com"}}],
                "current-context": "ctx",
            }
        )
    )
    assert whoami(NoReview(), lambda: kubeconfig_user(str(kcfg))) == "alice@example.com"  # type: ignore[arg-type]
    assert whoami(NoReview(), lambda: None) == "unknown"  # type: ignore[arg-type]


def test_status_shows_a_clear_by_hand_for_24_hours() -> None:
    done = {
        "at": (NOW - timedelta(hours=3)).isoformat(),
        "by": "alice",
        "reason": "reseated",
        "latches": [XID],
    }
    fresh = node_status(
        node_with({**results(("xid", "pass")), "lastClear": done}),
        None,
        prefix="gpu-healthcheck",
        now=NOW,
        pods_known=True,
    )
    old = {**done, "at": (NOW - timedelta(hours=25)).isoformat()}
    stale = node_status(
        node_with({**results(("xid", "pass")), "lastClear": old}),
        None,
        prefix="gpu-healthcheck",
        now=NOW,
        pods_known=True,
    )
    assert fresh.clearedByHand == done and stale.clearedByHand is None
    out = render([fresh, stale], "table", NOW)
    assert "LATCHES CLEARED BY HAND (last 24 h)" in out and f"n1  3h ago by alice: reseated [{XID}]" in out
    assert json.loads(render([fresh], "json", NOW))[0]["clearedByHand"]["by"] == "alice"
    pending = node_status(
        node_with(results(("xid", "fail")), **{K.clear_latched: "all"}),
        None,
        prefix="gpu-healthcheck",
        now=NOW,
        pods_known=True,
    )
    assert pending.clearPending == {"requested": "all", "by": None, "reason": None, "at": None}
    assert "(pending: no agent acted on it yet)" in render([pending], "table", NOW)


# ------------------------------------------------------------------------------------------ kube


def clear_cli(kubeconfig: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "clear", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def event_messages(world: dict[str, Any], reason: str) -> list[str]:
    out = (
        world["kube"]
        .kubectl(
            "get", "events", "-A", "--field-selector", f"involvedObject.name={world['node']}", "-o", "json"
        )
        .stdout
    )
    return [e["message"] for e in json.loads(out)["items"] if e["reason"] == reason]


@pytest.mark.kube
def test_clear_refuses_while_a_check_fails_then_clears_audited(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    world = start_agent(kube, gpu_node, tmp_path, "intervals:\n  gpu: 1\nnode:\n  maxTaintedFraction: 1\n")
    try:
        wait_for(lambda: node_dict(world)["metadata"]["labels"].get(K.status) == "pass", what="pass")
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        hang_nvidia_smi(world["snap"])  # and a current failure beside the latch
        wait_for(
            lambda: (
                json.loads(node_dict(world)["metadata"]["annotations"][K.results])["latched"]
                and RESPONSIVE_FAILS in node_dict(world)["metadata"]["annotations"][K.results]
            ),
            what="the latch and the failing check",
        )
        kcfg = kube.kubeconfig
        refused = clear_cli(kcfg, world["node"], "--reason", "GPU 3 reseated")
        assert refused.returncode == 1 and "gpu.responsive still fails" in refused.stderr, refused.stderr
        assert K.clear_latched not in node_dict(world)["metadata"]["annotations"]  # nothing written
        usage = clear_cli(kcfg, world["node"], "--latch", "xid/48/none", "--reason", "x")
        assert usage.returncode == 64 and f"latched: {XID}" in usage.stderr
        assert clear_cli(kcfg, world["node"]).returncode == 64  # --reason is required
        assert clear_cli(kcfg, "no-such-node", "--reason", "x").returncode == 64
        assert clear_cli("/nonexistent/kubeconfig", world["node"], "--reason", "x").returncode == 69

        (world["snap"] / "errors.json").unlink()  # the GPU answers again: only the latch fails
        wait_for(
            lambda: (
                '"gpu.responsive","status":"pass"' in node_dict(world)["metadata"]["annotations"][K.results]
            ),
            what="gpu.responsive passing",
        )
        done = clear_cli(kcfg, world["node"], "--latch", XID, "--reason", "GPU 3 reseated", "--wait", "30")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "as gpuhc-test-admin: GPU 3 reseated" in done.stdout  # SelfSubjectReview's username
        assert f"the agent cleared: {XID}; the node is now pass" in done.stdout
        (msg,) = event_messages(world, "LatchesCleared")
        assert msg == f"cleared 1 latched finding(s): {XID}; by gpuhc-test-admin (reason: GPU 3 reseated)"
        ann = node_dict(world)["metadata"]["annotations"]
        assert K.clear_latched not in ann and K.clear_latched_by not in ann  # consumed, both
        wait_for(lambda: our_taint(node_dict(world)) is None, what="untainted at once (no hysteresis)")

        status = subprocess.run(
            [sys.executable, "-m", "agent.cli", "status", "--kubeconfig", str(kcfg), "-o", "json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        mine = next(s for s in json.loads(status.stdout) if s["node"] == world["node"])
        assert mine["clearedByHand"]["by"] == "gpuhc-test-admin" and mine["clearedByHand"]["latches"] == [XID]
        table = subprocess.run(
            [sys.executable, "-m", "agent.cli", "status", "--kubeconfig", str(kcfg)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        ).stdout
        assert f"{world['node']}  " in table.split("LATCHES CLEARED BY HAND (last 24 h)")[1]

        # --force: cleared although a check fails, and the Event says so.
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        hang_nvidia_smi(world["snap"])
        wait_for(
            lambda: (
                json.loads(node_dict(world)["metadata"]["annotations"][K.results])["latched"]
                and RESPONSIVE_FAILS in node_dict(world)["metadata"]["annotations"][K.results]
            ),
            what="latched and failing again",
        )
        forced = clear_cli(kcfg, world["node"], "--all", "--reason", "replacing the board", "--force")
        assert forced.returncode == 0 and "forced while gpu.responsive still fails" in forced.stdout, forced
        wait_for(lambda: len(event_messages(world, "LatchesCleared")) == 2, what="the second LatchesCleared")
        assert any(
            "forced while gpu.responsive still failed" in m for m in event_messages(world, "LatchesCleared")
        )
        assert "LatchesCleared" in events(world)
    except AssertionError:
        print(world["agent"].log.read_text()[-6000:])  # what the agent did, for the failure report
        raise
    finally:
        world["agent"].stop(signal.SIGKILL)


@pytest.mark.kube
def test_clear_without_an_agent_cannot_judge_and_an_operator_passes_the_fence(
    kube: Any, gpu_node: Callable[..., Any], kube_namespace: str
) -> None:
    """The manifests' fence is in force; an operator's identity (not the agent's) writes the request,
    named by SelfSubjectReview; without an agent's results `clear` cannot judge (2) unless --force,
    and with --wait it says no agent acted (2)."""
    kube.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests"))
    node = gpu_node().metadata.name
    rbac = "rbac.authorization.k8s.io"
    role = f"{kube_namespace}-clearer"
    kube.kubectl(
        "create",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {
                    "apiVersion": f"{rbac}/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": role},
                    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
                },
                {
                    "apiVersion": f"{rbac}/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": role},
                    "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": "sre", "namespace": kube_namespace}],
                },
            ]
        ),
    )
    try:
        token = kube.token_for(kube_namespace, "sre", expiration=600)
        kcfg = kube.kubeconfig_for_token(token)
        unjudged = clear_cli(kcfg, node, "--reason", "new board")
        assert unjudged.returncode == 2 and "--force to clear anyway" in unjudged.stderr
        waited = clear_cli(kcfg, node, "--reason", "new board", "--force", "--wait", "1")
        assert waited.returncode == 2 and "no agent acted on it within 1 s" in waited.stderr
        who = f"system:serviceaccount:{kube_namespace}:sre"
        assert f"as {who}: new board" in waited.stderr
        ann = kube.request("GET", f"/api/v1/nodes/{node}")[1]["metadata"]["annotations"]
        assert ann[K.clear_latched] == "all"
        assert (
            json.loads(ann[K.clear_latched_by])["by"] == who and json.loads(ann[K.clear_latched_by])["force"]
        )
    finally:
        kube.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)
