"""The API server's own audit log, for tests that must prove who wrote (or never wrote) what.

``audit_args(dir)`` writes a policy and returns the kube-apiserver flags that enable the log backend;
``read_audit(path)`` parses the log (one JSON event per line). The policy records the writes to
pods, pods/eviction, nodes, nodes/status, DeviceTaintRules and ResourceSlices at ``Request`` level
(the request body is in the event, so a test can find the PATCH that added a taint) and nothing
else. Timestamps are the server's, with microseconds: figures measured from them carry no client or
watch latency.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["AUDIT_POLICY", "AuditEvent", "audit_args", "read_audit"]

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Request",
            "verbs": list(WRITE_VERBS),
            "resources": [
                {"group": "", "resources": ["pods", "pods/eviction", "nodes", "nodes/status"]},
                {"group": "resource.k8s.io", "resources": ["devicetaintrules", "resourceslices"]},
            ],
        },
        {"level": "None"},
    ],
}


def audit_args(directory: Path) -> list[str]:
    """Write the policy into *directory*; the flags that log to ``directory/audit.log``."""
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "audit-policy.json"  # JSON is YAML
    policy.write_text(json.dumps(AUDIT_POLICY, indent=2))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={directory / 'audit.log'}",
        "--audit-log-mode=blocking",  # each event is written before the request completes
        "--audit-log-format=json",
        "--audit-log-maxbackup=1",
    ]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class AuditEvent:
    """One ResponseComplete audit event (the fields tests read)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.user: str = raw.get("user", {}).get("username", "")
        self.verb: str = raw.get("verb", "")
        ref = raw.get("objectRef", {})
        self.resource: str = ref.get("resource", "")
        self.subresource: str = ref.get("subresource", "")
        self.namespace: str = ref.get("namespace", "")
        self.name: str = ref.get("name", "")
        self.code: int = int(raw.get("responseStatus", {}).get("code", 0))
        self.request: Any = raw.get("requestObject")
        self.received: float = _ts(raw["requestReceivedTimestamp"])
        self.completed: float = _ts(raw["stageTimestamp"])

    @property
    def what(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.verb} {self.resource}{sub} {where}{self.name} by {self.user} -> {self.code}"

    def __repr__(self) -> str:
        return f"AuditEvent({self.what})"


def read_audit(path: Path) -> list[AuditEvent]:
    """Every ResponseComplete event in the log at *path* (empty when it does not exist yet)."""
    return list(_events(path.read_text().splitlines() if path.exists() else ()))


def _events(lines: Iterable[str]) -> Iterator[AuditEvent]:
    for line in lines:
        if not line.strip():
            continue
        raw = json.loads(line)
        if raw.get("stage") == "ResponseComplete":
            yield AuditEvent(raw)
