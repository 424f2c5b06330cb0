"""Whether the agent writes its Marks at all (fingerprint: what makes a write necessary, derived from
the fields of core/marks.NodeWrite), and what it does after writing them: back off after a failed
write (1, 2, 4 … 30 s; no write at all until the wait the log states is over, whatever the tiers
find meanwhile: a refusal fleet-wide must not cost the API server a request per tier result), and
ask again while the brake holds its taint back, or the repair budget or a wave hold a new remediation
mark (every min(30 s, intervals.gpu): they open by themselves, and only held nodes pay that list).
The agent loop and bench/fleet.py use this one object, so the fleet benchmark measures the agent's
own policy, not a copy of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, Literal, Protocol

from agent.config import Config
from agent.core.marks import EXEMPT, TERM, NodeWrite
from agent.core.repair_budget import HoldReason

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
    def remediation_held(self) -> HoldReason | Literal[""]: ...
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


def _terms(write: type[NodeWrite]) -> tuple[tuple[str, Callable[[Any], str]], ...]:
    """(name, how its value stands) of every field of the write that is not exempt."""
    return tuple((f.name, f.metadata.get(TERM, str)) for f in fields(write) if EXEMPT not in f.metadata)


TERMS = _terms(NodeWrite)


def fingerprint(write: NodeWrite) -> str:
    """What makes a write necessary: every field of the write (core/marks.NodeWrite), each as its
    term says (the results annotation without timestamps, durations and trend reads, whose counters
    stand as trends_digest); a Marks' context (Events, annotations to drop, the history entry's key
    and boot) is not in it."""
    return "|".join(text(getattr(write, name)) for name, text in TERMS)


def unaccounted(marks: type[Any]) -> list[str]:
    """The fields of a Marks type that are neither in the fingerprint nor exempt with a reason: a
    field the Node would never see once the node is steady."""
    terms = {name for name, _ in TERMS}
    return [f.name for f in fields(marks) if f.name not in terms and not f.metadata.get(EXEMPT)]
