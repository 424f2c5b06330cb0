"""Whether the agent writes its Marks at all (fingerprint: what makes a write necessary), and what it
does after writing them: back off after a failed write (1, 2, 4 … 30 s; no write at all until the
wait the log states is over, whatever the tiers find meanwhile: a refusal fleet-wide must not cost
the API server a request per tier result), and
ask again while the brake holds its taint back, or the repair budget or a wave hold a new remediation
mark (every min(30 s, intervals.gpu): they open by themselves, and only held nodes pay that list).
The agent loop and bench/fleet.py use this one object, so the fleet benchmark measures the agent's
own policy, not a copy of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from agent.config import Config
from agent.core import trend_history
from agent.core.marks import Marks
from agent.core.results_doc import encode

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0
MAX_REASK_S = 30.0


class WriteOutcome(Protocol):
    """What the Node writer says of one write (its ApplyResult)."""

    @property
    def ok(self) -> bool: ...
    @property
    def brake_open(self) -> bool: ...
    @property
    def error(self) -> str | None: ...
    @property
    def remediation_held(self) -> str: ...
    @property
    def held_key(self) -> str: ...


def brake_reask_s(cfg: Config) -> float:
    return min(MAX_REASK_S, cfg.intervals.gpu)


class WritePolicy:
    def __init__(self, reask_s: Callable[[], float]) -> None:
        self.reask_s = reask_s
        self.delay = FIRST_RETRY_S
        self.failing = False  # the last write failed: nothing is written before its retry is due

    def next_try(self, outcome: WriteOutcome) -> float | None:
        """Seconds until the same Marks must be written again; None: nothing to do until they change."""
        self.failing = not outcome.ok
        if not outcome.ok:
            wait, self.delay = self.delay, min(self.delay * 2, MAX_RETRY_S)
            return wait
        self.delay = FIRST_RETRY_S
        return self.reask_s() if outcome.brake_open or outcome.remediation_held else None


def fingerprint(marks: Marks) -> str:
    """What makes a write necessary: everything but timestamps, durations and the trend reads whose
    counters did not move (core/trend_history.counters_digest: they ride along with the next write)."""
    doc = json.loads(marks.results_json)
    doc.pop("checkedAt", None)
    doc.pop(trend_history.TRENDS_FIELD, None)  # stands as marks.trends_digest
    for c in doc.get("checks", []):
        c.pop("at", None)
        c.pop("durationMs", None)
    return "|".join(
        (
            marks.status.value,
            marks.severity.label,
            str(marks.taint),
            marks.taint_value,
            marks.taint_effect,
            str(marks.unhealthy_label),
            marks.condition_status,
            marks.condition_reason,
            marks.condition_message,
            marks.trends_digest,
            str(marks.validating),
            str(marks.testing),
            marks.risk,
            *(f"{r.type}={r.unhealthy}:{r.reason}:{r.message}" for r in marks.remediation),
            marks.scope.as_text() if marks.scope is not None else "",
            marks.warn_scope.as_text() if marks.warn_scope is not None else "",
            encode(doc),
        )
    )
