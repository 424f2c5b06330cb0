"""The `<prefix>/results` annotation: its schema, how a verdict becomes one, and its codec (compact JSON
kept under a size limit)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from agent import __version__
from agent.core.clear_cover import CLEAR_COVER_FIELD
from agent.core.findings import CheckResult, Verdict
from agent.core.severity import Severity
from agent.core.text import shorten
from agent.core.trend_history import TRENDS_FIELD, drop_oldest_read

RESULTS_VERSION = 1
MAX_RESULTS_BYTES = 16 * 1024
TAINT_FIELD = "taint"  # {"severity", "passes"} while the taint is wanted; absent otherwise
GPUS_FIELD = "gpus"  # one verdict per GPU (engine/gpu_verdicts.py)
HISTORY_FIELD = "history"  # failing findings per GPU, the boots each was seen in: engine/reboot_escalation.py
# TRENDS_FIELD ("trends", core/trend_history.py): the kept reads the trend warnings judge
STALE_AFTER_FIELD = "staleAfterSeconds"  # the agent is unready (and unlive) past this without a check
REMEDIATION_FIELD = "remediation"  # {type: {"severity", "passes", "cause"}} while an entry is unhealthy
LAST_CLEAR_FIELD = "lastClear"  # the last clear-latched request the agent acted on (ClearRequest + at)
# CLEAR_COVER_FIELD ("clearCover", core/clear_cover.py): the kernel-log lines this boot's clears covered
# The last `gpu-healthcheck diag` request whose diag started: {by, reason, requestedAt, level,
# outcome (started | completed | aborted), startedAt[, endedAt, abortReason]} (core/active_checks.py)
LAST_DIAG_FIELD = "lastDiag"
CONFIG_FIELD = "config"  # {"source", "digest", "mode"}: the config in force (engine/rollout.py)
IN_SERVICE_FIELD = "inService"  # a degraded node: {"gpus", "serving", "isolated"} (engine/degraded.py)
WOULD_FIELD = "would"  # {"taint", "mark"}: what mode taint does, in any mode (engine/rollout.py)
VALIDATED_FIELD = "validated"  # {"bootId", "at"}: the last complete pass (engine/validation.py)
# {"since", "bootId", "waitingFor"}: while the Node carries the validating taint and has not passed
VALIDATING_FIELD = "validating"


def stale_after_s(gpu_interval_s: float) -> int:
    """How long the agent may go without a check before /healthz and /readyz fail: its readiness
    then means "checked within this", which `status` turns into the age of the last check."""
    return int(max(60.0, 3 * gpu_interval_s))


def now_iso() -> str:
    """RFC 3339 UTC, seconds: every time the agent writes (results, conditions, Events)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def results_document(
    verdict: Verdict,
    *,
    checked_at: str,
    boot_id: str | None,
    instance_type: str | None,
    latched: Sequence[dict[str, Any]] | None = None,
    check_times: dict[str, str] | None = None,
    taint: dict[str, Any] | None = None,
    stale_after: int | None = None,
    gpus: Sequence[dict[str, Any]] | None = None,
    history: Sequence[dict[str, Any]] | None = None,
    trends: dict[str, Any] | None = None,
    remediation: dict[str, Any] | None = None,
    last_clear: dict[str, Any] | None = None,
    clear_cover: dict[str, Any] | None = None,
    last_diag: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
    validated: dict[str, Any] | None = None,
    validating: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `<prefix>/results` JSON object. `latched` defaults to this run's latched findings."""
    checks = [
        {
            "name": r.name,
            "status": r.status.value,
            "severity": r.severity.label,
            "message": r.message,
            "at": (check_times or {}).get(r.name, checked_at),
            "durationMs": round(r.duration_ms, 2),
            "entities": list(r.all_entities()),
            **_next_step(r),
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
                **f.recommendation.as_dict(),
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
    if taint is not None:
        doc[TAINT_FIELD] = taint
    if stale_after is not None:
        doc[STALE_AFTER_FIELD] = stale_after
    if gpus is not None:
        doc[GPUS_FIELD] = list(gpus)
    if history:
        doc[HISTORY_FIELD] = list(history)
    if trends:
        doc[TRENDS_FIELD] = trends
    if remediation:
        doc[REMEDIATION_FIELD] = remediation
    if last_clear:
        doc[LAST_CLEAR_FIELD] = last_clear
    if clear_cover:
        doc[CLEAR_COVER_FIELD] = clear_cover
    if last_diag:
        doc[LAST_DIAG_FIELD] = last_diag
    doc.update(rollout or {})  # CONFIG_FIELD, WOULD_FIELD
    if validated:
        doc[VALIDATED_FIELD] = validated
    if validating:
        doc[VALIDATING_FIELD] = validating
    return fit(doc)


def _next_step(result: CheckResult) -> dict[str, Any]:
    """{"action", "escalation"} of a check's worst finding (core/actions.py); {} without one."""
    worst = max(result.findings, key=lambda f: f.severity, default=None)
    if worst is None or worst.severity <= Severity.NONE:
        return {}
    return worst.recommendation.as_dict()


def encode(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def steady_results(raw: str) -> str:
    """What of the annotation makes a write necessary: all but its timestamps, durations and trend
    reads (those stand as Marks.trends_digest: a read whose counters did not move rides along with
    the next write)."""
    doc = json.loads(raw)
    doc.pop("checkedAt", None)
    doc.pop(TRENDS_FIELD, None)
    for c in doc.get("checks", []):
        c.pop("at", None)
        c.pop("durationMs", None)
    return encode(doc)


def decode_results(raw: str | None) -> dict[str, Any] | None:
    """The parsed results annotation; None when absent or not a JSON object."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def fit(doc: dict[str, Any], limit: int = MAX_RESULTS_BYTES) -> dict[str, Any]:
    """Keep the annotation under its size limit: shorten messages, then entities, never drop a check."""
    for msg_len, ent_len in ((400, 32), (200, 8), (100, 2), (60, 0)):
        if len(encode(doc).encode()) <= limit:
            return doc
        for item in (*doc["checks"], *doc["latched"]):
            item["message"] = shorten(item["message"], msg_len)
            if "entities" in item and len(item["entities"]) > ent_len:
                item["entities"] = [*item["entities"][:ent_len], f"+{len(item['entities']) - ent_len} more"]
    for entry in doc.get(GPUS_FIELD) or ():  # pods are a courtesy: they go before any latch
        if len(encode(doc).encode()) <= limit:
            break
        entry.pop("pods", None)
    while len(encode(doc).encode()) > limit and TRENDS_FIELD in doc:
        # The oldest trend reads go next (warnings already judged stay in their checks), then all.
        if not drop_oldest_read(doc[TRENDS_FIELD]):
            del doc[TRENDS_FIELD]
    while len(encode(doc).encode()) > limit and len(doc["latched"]) > 1:
        # Latched findings are ordered oldest first; keep the most severe when something must go.
        doc["latched"].sort(key=lambda x: Severity.parse(x["severity"]))
        doc["latched"].pop(0)
    return doc
