"""`gpu-healthcheck status` table: pure row building, and the real thing read from an API server."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.cli.status import HEADER, age, render_status, status_rows, worst_finding
from agent.core.contract import DEFAULT_PREFIX, Keys, Marks
from agent.core.severity import Severity, Status
from agent.reporters.node_writer import NodeWriter
from tests.kubeenv import unique_name

P = DEFAULT_PREFIX
K = Keys(P)
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


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
    rows = status_rows(nodes, prefix=P, now=NOW)
    assert [r[0] for r in rows] == [
        "e-fail-isolate",
        "b-fail-reset",
        "f-unknown",
        "d-warn",
        "a-pass",
        "c-unmarked",
    ]
    assert rows[0] == ("e-fail-isolate", "fail", "isolate", "xid: Xid 79", "30s")
    assert rows[-1] == ("c-unmarked", "-", "-", "-", "-")


def test_corrupt_annotation_does_not_break_the_table() -> None:
    node = {"metadata": {"name": "n", "labels": {K.status: "fail"}, "annotations": {K.results: "{"}}}
    assert status_rows([node], prefix=P, now=NOW) == [("n", "fail", "-", "-", "-")]


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
            assert NodeWriter(core, name).apply(marks).ok
        out = render_status(core, selectors=[selector])
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "STATUS", "SEVERITY", "WORST", "FINDING", "LAST", "CHECK", "AGE"]
    assert len(lines) == 3 and len(HEADER) == 5
    assert lines[1].startswith(broken) and "fail" in lines[1] and "reboot" in lines[1]
    assert "xid: GPU 2: Xid 48 double-bit ECC error" in lines[1]
    assert lines[2].startswith(healthy) and " pass " in lines[2]
