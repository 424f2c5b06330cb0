"""A write the API server refused (DESIGN.md §4): what it was, and the Event that says so, once.

A refusal is an answer, not an outage: the server read the request and said no (a 4xx: the
admission fence, RBAC, validation). It is loud: the log line and the `NodeWriteRefused` Event carry
the server's own message, the metric counts it by kind and code, and the agent keeps retrying with
its write policy's backoff. No answer, a 5xx, a throttled (429) or timed-out (408) request, a Node
that is gone (404) or one that kept changing (409) are failed writes as before, not refusals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import WARNING, EventReason
from agent.reporters.kube_rest import api_message, api_status

NOT_REFUSALS = frozenset({404, 408, 409, 429})
REPEAT_S = 3600.0  # the API server's default Event TTL: a refusal that lasts keeps an Event

WHAT = {
    "status": "status write (conditions)",
    "node": "Node write (labels, annotation, taint)",
}


@dataclass(frozen=True)
class Refusal:
    """One refused write: which request, the HTTP code and reason, and the server's own words."""

    kind: str  # "status" or "node"
    code: int
    reason: str
    message: str

    @property
    def summary(self) -> str:
        head = f"{self.code} {self.reason}".strip()
        return f"{head}: {self.message}" if self.message else head


def refusal_of(exc: BaseException, kind: str) -> Refusal | None:
    """The refusal *exc* is, for a write of *kind*; None when it is not one (see the docstring)."""
    code = api_status(exc)
    if code is None or not 400 <= code <= 499 or code in NOT_REFUSALS:
        return None
    return Refusal(kind, code, str(getattr(exc, "reason", "") or ""), api_message(exc))


class WriteRefused(Exception):
    """Raised inside the writer when the API server refused one of its writes."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.summary)
        self.refusal = refusal
        self.kept = ""  # what the Node shows meanwhile, when the writer knows better than "nothing"


class RefusalNotices:
    """Says each refusal once: one Event per distinct (kind, code, message) in a refusal episode (from
    the first refusal to the next apply that goes through), and again after REPEAT_S while it lasts;
    never one per retry."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._said: dict[tuple[str, int, str], float] = {}
        self.refusals = 0  # in this episode

    def notice(self, refusal: Refusal, *, kept: str, wanted: str) -> NodeEvent | None:
        """The Event for *refusal*, or None when this episode said it already. *kept*: what the Node
        shows meanwhile; *wanted*: what the agent tried to write."""
        self.refusals += 1
        key = (refusal.kind, refusal.code, refusal.message)
        now = self._clock()
        said = self._said.get(key)
        if said is not None and now - said < REPEAT_S:
            return None
        self._said[key] = now
        return NodeEvent(
            EventReason.NODE_WRITE_REFUSED,
            f"The API server refused the {WHAT.get(refusal.kind, refusal.kind)} ({refusal.summary}). "
            f"{kept}; wanted: {wanted}. Retrying with backoff.",
            WARNING,
        )

    def refused(self, refusal: Refusal, *, kept: str, marks: Marks) -> NodeEvent | None:
        """notice()'s Event for a refused write of *marks*."""
        taint = f", taint {marks.taint_value}:{marks.taint_effect}" if marks.taint else ", no taint"
        return self.notice(refusal, kept=kept, wanted=f"{marks.status.value}/{marks.severity.label}{taint}")

    def accepted(self) -> int:
        """A write went through: the episode ends. Returns how many refusals it had."""
        had, self.refusals = self.refusals, 0
        self._said.clear()
        return had


__all__ = ["NOT_REFUSALS", "REPEAT_S", "Refusal", "RefusalNotices", "WriteRefused", "refusal_of"]
