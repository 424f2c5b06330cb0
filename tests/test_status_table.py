"""`gpu-healthcheck status` table: pure row building, and the real thing read from an API server."""

from __future__ import annotations

import contextlib
import io
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.cli.status import (
    HEADER,
    age,
    exit_code,
    render,
    render_status,
    status_list,
    status_rows,
)
from agent.cli.status_findings import worst_finding
from agent.config import yaml_safe
from agent.core.marks import Marks
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.core.severity import Severity, Status
from agent.reporters.node_writer import NodeWriter
from tests.conftest import shipped
from tests.kubeenv.env import unique_name

P = DEFAULT_PREFIX
K = Keys(P)
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
XID79 = Path(__file__).parent.parent / "examples" / "snapshots" / "p5.48xlarge-xid79"


def _results(
    status: str,
    severity: str,
    checks: list[tuple[str, str, str, str]],
    checked: str,
    latched: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "version": 1,
        "status": status,
        "severity": severity,
        "checkedAt": checked,
        "checks": [{"name": n, "status": s, "severity": v, "message": m} for n, s, v, m in checks],
        "latched": latched or [],
    }


def _node(name: str, doc: dict[str, Any] | None) -> dict[str, Any]:
    labels = {K.status: doc["status"], K.severity: doc["severity"]} if doc else {}
    ann = {K.results: json.dumps(doc)} if doc else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": ann}}


def test_worst_finding_is_the_most_severe_check() -> None:
    doc = _results(
        "fail",
        "isolate",
        [
            ("gpu", "warn", "monitor", "GPU 1: 3 retired pages"),
            ("xid", "fail", "isolate", "GPU 5: Xid 79 GPU has fallen off the bus"),
            ("efa", "fail", "reset", "rdmap0s1: link down"),
            ("topology", "pass", "none", "ok"),
        ],
        "2026-01-01T11:55:00Z",
    )
    assert worst_finding(doc) == "xid: GPU 5: Xid 79 GPU has fallen off the bus"
    assert worst_finding(None) == "-"
    assert worst_finding(_results("pass", "none", [("gpu", "pass", "none", "fine")], "x")) == "-"
    unknown = _results("unknown", "none", [("xid", "unknown", "none", "kernel log unreadable")], "x")
    assert worst_finding(unknown) == "xid: kernel log unreadable"
    latched = _results(
        "fail", "reboot", [], "x", [{"check": "xid", "severity": "reboot", "message": "Xid 48"}]
    )
    assert worst_finding(latched) == "xid: Xid 48 (latched)"


@pytest.mark.parametrize(
    ("checked", "want"),
    [
        ("2026-01-01T11:59:18Z", "42s"),
        ("2026-01-01T11:53:00Z", "7m"),
        ("2026-01-01T09:00:00+00:00", "3h"),
        ("2025-12-30T12:00:00Z", "2d"),
        ("garbage", "-"),
        (None, "-"),
        ("2026-01-01T12:00:05Z", "0s"),
    ],
)
def test_age(checked: Any, want: str) -> None:
    assert age(checked, NOW) == want


def test_rows_sorted_fail_first() -> None:
    nodes = [
        _node("a-pass", _results("pass", "none", [("gpu", "pass", "none", "ok")], "2026-01-01T11:59:00Z")),
        _node(
            "b-fail-reset",
            _results("fail", "reset", [("efa", "fail", "reset", "link down")], "2026-01-01T11:58:00Z"),
        ),
        _node("c-unmarked", None),
        _node(
            "d-warn", _results("warn", "monitor", [("gpu", "warn", "monitor", "hot")], "2026-01-01T11:00:00Z")
        ),
        _node(
            "e-fail-isolate",
            _results("fail", "isolate", [("xid", "fail", "isolate", "Xid 79")], "2026-01-01T11:59:30Z"),
        ),
        _node(
            "f-unknown",
            _results(
                "unknown", "none", [("dcgm-health", "unknown", "none", "no engine")], "2026-01-01T11:59:30Z"
            ),
        ),
    ]
    rows = status_rows(nodes, prefix=P, now=NOW)  # pods None: not readable, AGENT "?"
    assert [r[0] for r in rows] == [
        "e-fail-isolate",
        "b-fail-reset",
        "f-unknown",
        "d-warn",
        "a-pass",
        "c-unmarked",
    ]
    assert rows[0] == ("e-fail-isolate", "fail", "isolate", "≤30s", "?", "-", "-", "-", "-", "xid: Xid 79")
    assert rows[-1] == ("c-unmarked", "-", "-", "-", "?", "-", "-", "-", "-", "-")


def test_the_next_step_comes_from_the_agents_own_annotation() -> None:
    """What the engine writes for the xid79 snapshot: the worst finding's step and escalation."""
    from agent.cli.main import main as cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli(["check", "--json", "--from-snapshot", str(XID79)])
    doc = json.loads(buf.getvalue())
    (row,) = status_rows([_node("broken", doc)], prefix=P, now=NOW)
    assert row[2] == "reboot" and row[8] == "reboot (then: service)"
    assert row[6:8] == ("8/8", "-")  # GPUS: no taint of ours on the Node; DEVICE TAINTS: none


def test_corrupt_annotation_does_not_break_the_table() -> None:
    node = {"metadata": {"name": "n", "labels": {K.status: "fail"}, "annotations": {K.results: "{"}}}
    assert status_rows([node], prefix=P, now=NOW) == [("n", "fail", "-", "-", "?", "-", "-", "-", "-", "-")]


def _pod(node: str, ready: bool, period: int = 10, failures: int = 3) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/readyz"}, "periodSeconds": period, "failureThreshold": failures}
    return {
        "metadata": {"name": f"agent-{node}"},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "readinessProbe": probe}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_last_check_is_the_age_of_the_last_check_not_of_the_last_change() -> None:
    """A healthy node last changed 3 days ago: with a Ready agent (Ready = checked within
    staleAfterSeconds), the last check is less than that plus the probe's lag ago, not 3 days."""
    doc = _results("pass", "none", [("gpu", "pass", "none", "ok")], "2025-12-29T12:00:00Z")
    doc["staleAfterSeconds"] = 180
    fresh = dict(doc, checkedAt="2026-01-01T11:59:50Z")
    nodes = [_node("a", doc), _node("b", doc), _node("c", doc), _node("d", fresh)]
    pods = [_pod("a", True), _pod("b", False), _pod("d", True)]
    rows = {r[0]: r for r in status_rows(nodes, prefix=P, now=NOW, pods=pods)}
    assert rows["a"][3:5] == ("<3m", "ready")  # 180 s + 10 s x 3 = 210 s
    assert rows["b"][3:5] == ("≤3d", "not-ready")  # only the last change bounds it
    assert rows["c"][3:5] == ("≤3d", "none")
    assert rows["d"][3:5] == ("<10s", "ready")  # changed 10 s ago: checked at or after that
    statuses = {s.node: s for s in status_list(nodes, pods, prefix=P, now=NOW)}
    assert statuses["a"].lastCheckMaxSeconds == 210 and statuses["a"].changedAt == doc["checkedAt"]
    assert exit_code([statuses["a"], statuses["d"]]) == 0
    assert exit_code(list(statuses.values())) == 2  # b and c were not checked lately: not judged
    failing = _node("e", _results("fail", "reboot", [("xid", "fail", "reboot", "Xid 79")], "x"))
    assert exit_code(status_list([*nodes, failing], pods, prefix=P, now=NOW)) == 1


def test_json_yaml_and_wide_output() -> None:

    doc = _results("fail", "reboot", [("xid", "fail", "reboot", "Xid 79")], "2026-01-01T11:59:00Z")
    doc.update(staleAfterSeconds=180, instanceType="p5.48xlarge", agentVersion="0.1.0")
    node = _node("n1", doc)
    node["spec"] = {"taints": [{"key": K.taint, "value": "reboot", "effect": "NoExecute"}]}
    statuses = status_list([node], [_pod("n1", True)], prefix=P, now=NOW)
    (item,) = json.loads(render(statuses, "json", NOW))
    assert item["node"] == "n1" and item["taint"] == "reboot:NoExecute" and item["lastCheck"] == "<1m"
    assert item["lastCheckMaxSeconds"] == 60 and item["agent"] == "ready"
    assert yaml_safe.load(render(statuses, "yaml", NOW)) == [item]
    wide = render(statuses, "wide", NOW).splitlines()
    head = [
        "NODE",
        "STATUS",
        "SEVERITY",
        "LAST",
        "CHECK",
        "AGENT",
        "WARN",
        "GPUS",
        "DEVICE",
        "TAINTS",
        "TAINT",
    ]
    assert wide[0].split()[:11] == head
    assert "reboot:NoExecute" in wide[1] and "p5.48xlarge" in wide[1] and "0.1.0" in wide[1]


def test_wide_says_which_agents_run_which_version_and_which_are_the_canary() -> None:
    """An image rollout: VERSION per node with the canary's track (its pod's label), and a line that
    counts the nodes per version; the plain table says it only while versions differ."""
    from agent.core.node_keys import TRACK_LABEL

    def node(name: str, version: str) -> dict[str, Any]:
        return _node(name, dict(_results("pass", "none", [], "2026-01-01T11:59:00Z"), agentVersion=version))

    canary_pod = _pod("c", True)
    canary_pod["metadata"]["labels"] = {TRACK_LABEL: "canary"}
    nodes = [node("a", "0.2.0"), node("b", "0.2.0"), node("c", "0.2.1")]
    statuses = status_list(nodes, [_pod("a", True), _pod("b", True), canary_pod], prefix=P, now=NOW)
    wide = render(statuses, "wide", NOW).splitlines()
    row = {line.split()[0]: line for line in wide[1:4]}
    assert "0.2.1 (canary)" in row["c"] and "0.2.0" in row["a"] and "(canary)" not in row["a"]
    assert "agents: 0.2.0 on 2 nodes, 0.2.1 (canary) on 1 node" in wide
    assert "agents: 0.2.0 on 2 nodes, 0.2.1 (canary) on 1 node" in render(statuses, "table", NOW)
    (item,) = [i for i in json.loads(render(statuses, "json", NOW)) if i["node"] == "c"]
    assert (item["agentVersion"], item["track"]) == ("0.2.1", "canary")
    same = status_list(nodes[:2], [_pod("a", True), _pod("b", True)], prefix=P, now=NOW)
    assert "agents:" not in render(same, "table", NOW) and "agents: 0.2.0 on 2 nodes" in render(
        same, "wide", NOW
    )


def test_warn_column_counts_gpus_with_a_warning_before_a_fault() -> None:
    """WARN: the GPUs whose verdict carries trend warnings, of the GPUs listed; JSON per rule."""
    doc = _results("warn", "monitor", [("trend.memory", "warn", "monitor", "GPU 1: 2 DRAM banks low")], "x")
    remap = {"trend.memory.remap-headroom": "2 bank(s) low"}
    hot = {"trend.thermal.near-slowdown": "3 °C left"}
    doc["gpus"] = [
        {"index": 0, "status": "pass"},
        {"index": 1, "status": "warn", "warnings": {"plan-service": remap, "watch": hot}},
        {"index": 2, "status": "warn", "warnings": {"watch": hot}},
        {"index": 3, "status": "warn"},  # a warning of another kind (gpu.persistence): not a trend
    ]
    (row,) = status_rows([_node("n", doc)], prefix=P, now=NOW)
    assert row[5] == "2/4"
    (item,) = json.loads(render(status_list([_node("n", doc)], None, prefix=P, now=NOW), "json", NOW))
    assert item["warnGpus"] == 2 and item["gpus"] == 4
    assert item["warnings"] == {"trend.memory.remap-headroom": 1, "trend.thermal.near-slowdown": 2}
    healthy = _results("pass", "none", [], "x")
    healthy["gpus"] = [{"index": 0, "status": "pass"}]
    assert status_rows([_node("h", healthy)], prefix=P, now=NOW)[0][5] == "-"


@pytest.mark.kube
def test_render_status_from_real_nodes(kube: Any, gpu_node: Any) -> None:
    pool = unique_name("status")
    selector = f"test.example/pool={pool}"
    now = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        healthy = gpu_node(labels={"test.example/pool": pool}).metadata.name
        broken = gpu_node(labels={"test.example/pool": pool}).metadata.name
        for name, fail in ((healthy, False), (broken, True)):
            doc = _results(
                "fail" if fail else "pass",
                "reboot" if fail else "none",
                [
                    (
                        "xid",
                        "fail" if fail else "pass",
                        "reboot" if fail else "none",
                        "GPU 2: Xid 48 double-bit ECC error" if fail else "no Xid",
                    )
                ],
                now,
            )
            marks = Marks(
                status=Status.FAIL if fail else Status.PASS,
                severity=Severity.REBOOT if fail else Severity.NONE,
                results_json=json.dumps(doc),
                taint=fail,
                condition_message="x",
            )
            assert NodeWriter(core, name, cfg=shipped()).apply(marks).ok
        out, code = render_status(core, selectors=[selector])
    lines = out.splitlines()
    head = [
        "NODE",
        "STATUS",
        "SEVERITY",
        "LAST",
        "CHECK",
        "AGENT",
        "WARN",
        "GPUS",
        "DEVICE",
        "TAINTS",
        "NEXT",
        "STEP",
        "WORST",
        "FINDING",
    ]
    assert lines[0].split() == head
    table = lines[: lines.index("") if "" in lines else len(lines)]
    assert len(table) == 3 and len(HEADER) == 10
    # its taint was written without a brake slot (a writer without a brake): it counts, and is named
    brake = [line for line in lines[3:] if line.startswith("BRAKE (") or "tainted without a slot" in line]
    assert brake and brake[0].startswith("BRAKE (") and broken in brake[-1], out
    assert code == 1  # a node fails
    assert lines[1].startswith(broken) and "fail" in lines[1] and "reboot" in lines[1]
    assert "xid: GPU 2: Xid 48 double-bit ECC error" in lines[1]
    assert lines[2].startswith(healthy) and " pass " in lines[2]


def test_status_lists_the_nodes_waiting_for_validation_and_for_how_long() -> None:
    """The startup taint is never silent in `status`: each node that carries it, longest wait first,
    with what its agent says it waits for, or, where no agent reported in this boot, since the
    Node's creation and why (the agent column)."""
    from agent.core.results_doc import VALIDATING_FIELD

    taint = {"taints": [{"key": K.validating, "effect": "NoSchedule"}]}
    boot = {"nodeInfo": {"bootID": "b-1"}}
    waiting = _results(
        "unknown", "none", [("dcgm-diag", "unknown", "none", "engine down")], "2026-01-01T11:00:00Z"
    )
    waiting[VALIDATING_FIELD] = {
        "since": "2026-01-01T11:18:00Z",
        "bootId": "b-1",
        "waitingFor": ["dcgm-diag"],
    }
    a = {**_node("gpu-a", waiting), "spec": taint, "status": boot}
    silent = _node("gpu-b", None)  # its agent never started: no annotation at all
    silent["metadata"]["creationTimestamp"] = "2026-01-01T09:00:00Z"
    silent.update(spec=taint, status=boot)
    stale = _results("pass", "none", [], "2026-01-01T08:00:00Z")  # written in an earlier boot
    stale[VALIDATING_FIELD] = {"since": "2026-01-01T07:00:00Z", "bootId": "b-0", "waitingFor": ["gpu"]}
    c = {**_node("gpu-c", stale), "spec": taint, "status": boot}
    c["metadata"]["creationTimestamp"] = "2026-01-01T11:50:00Z"
    done = {**_node("gpu-d", _results("pass", "none", [], "2026-01-01T11:00:00Z")), "spec": {}}
    statuses = status_list([a, silent, c, done], [], prefix=P, now=NOW)
    out = render(statuses, "table", NOW)
    section = out[out.index("WAITING FOR VALIDATION") :].splitlines()
    assert "3 node(s)" in section[0]
    assert section[1].split()[:3] == ["gpu-b", "for", "3h"] and "no report from an agent" in section[1]
    assert "(agent: none)" in section[1]
    assert section[2].split()[:3] == ["gpu-a", "for", "42m"] and section[2].endswith("waiting for dcgm-diag")
    assert section[3].split()[:3] == ["gpu-c", "for", "10m"] and "no report" in section[3]
    (item,) = [i for i in json.loads(render(statuses, "json", NOW)) if i["node"] == "gpu-a"]
    assert item["validating"] == {
        "since": "2026-01-01T11:18:00Z",
        "seconds": 2520,
        "waitingFor": ["dcgm-diag"],
    }
    assert "WAITING FOR VALIDATION" not in render([x for x in statuses if x.node == "gpu-d"], "table", NOW)
