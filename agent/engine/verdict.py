"""The node verdict (DESIGN.md §3) and the `results` annotation JSON (DESIGN.md §4)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from agent import __version__
from agent.core.findings import CheckResult, Finding
from agent.core.severity import Severity, Status

RESULTS_VERSION = 1
MAX_RESULTS_BYTES = 16 * 1024


@dataclass(frozen=True)
class Verdict:
    status: Status
    severity: Severity
    results: tuple[CheckResult, ...]

    @property
    def worst(self) -> Finding | None:
        findings = [f for r in self.results for f in r.findings]
        return max(findings, key=lambda f: f.severity, default=None)


def decide(results: Iterable[CheckResult]) -> Verdict:
    """Highest severity wins and is never masked by a milder finding; unknown only when nothing failed."""
    results = tuple(results)
    severity = max((r.severity for r in results), default=Severity.NONE)
    if severity >= Severity.RESET:
        status = Status.FAIL
    elif any(r.status is Status.UNKNOWN for r in results):
        status = Status.UNKNOWN
    elif severity == Severity.MONITOR:
        status = Status.WARN
    else:
        status = Status.PASS
    return Verdict(status=status, severity=severity, results=results)


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def results_document(
    verdict: Verdict,
    *,
    checked_at: str,
    boot_id: str | None,
    instance_type: str | None,
    latched: Sequence[dict[str, Any]] | None = None,
    check_times: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `gpu-healthcheck/results` JSON object. `latched` defaults to this run's latched findings."""
    checks = [
        {
            "name": r.name,
            "status": r.status.value,
            "severity": r.severity.label,
            "message": r.message,
            "at": (check_times or {}).get(r.name, checked_at),
            "durationMs": round(r.duration_ms, 2),
            "entities": list(r.all_entities()),
        }
        for r in verdict.results
    ]
    if latched is None:
        latched = [
            {
                "check": f.check,
                "key": f.key,
                "severity": f.severity.label,
                "since": checked_at,
                "message": f.message,
            }
            for r in verdict.results
            for f in r.findings
            if f.latched
        ]
    doc: dict[str, Any] = {
        "version": RESULTS_VERSION,
        "status": verdict.status.value,
        "severity": verdict.severity.label,
        "checkedAt": checked_at,
        "bootId": boot_id,
        "instanceType": instance_type,
        "agentVersion": __version__,
        "checks": checks,
        "latched": list(latched),
    }
    return fit(doc)


def encode(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def fit(doc: dict[str, Any], limit: int = MAX_RESULTS_BYTES) -> dict[str, Any]:
    """Keep the annotation under its size limit: shorten messages, then entities, never drop a check."""
    for msg_len, ent_len in ((400, 32), (200, 8), (100, 2), (60, 0)):
        if len(encode(doc).encode()) <= limit:
            return doc
        for item in (*doc["checks"], *doc["latched"]):
            if len(item["message"]) > msg_len:
                item["message"] = item["message"][: msg_len - 1] + "…"
            if "entities" in item and len(item["entities"]) > ent_len:
                item["entities"] = [*item["entities"][:ent_len], f"+{len(item['entities']) - ent_len} more"]
    while len(encode(doc).encode()) > limit and len(doc["latched"]) > 1:
        # Latched findings are ordered oldest first; keep the most severe when something must go.
        doc["latched"].sort(key=lambda x: Severity.parse(x["severity"]))
        doc["latched"].pop(0)
    return doc
