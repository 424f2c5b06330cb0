"""Active checks that never collide with work (README "Active checks"): the DCGM diag stresses every
GPU for minutes, so it runs only in an idle window (probes/dcgm/idle.py), and three things keep it
apart from work:

- the node is held while it runs: the taint `<prefix>/testing:NoSchedule` goes on before the diag
  starts and is lifted when it ends (the engine writes it like our other taints: Marks.testing);
- a fleet-wide bound: at most `node.activeChecks.maxConcurrent` GPU nodes run one at once (a count,
  or a share of the GPU nodes, at least 1), coordinated through the API server as the repair budget
  is: a `slot` record (a Lease in the agent's namespace) per node while it runs, each node counting
  the live slots written before its own (by resourceVersion, the API server's write order) and
  taking its own back when the bound is reached;
- a pod that arrives anyway (tolerating the taint) aborts the diag: its result is `unknown`.

An operator asks for a diag at the next idle window with `gpu-healthcheck diag NODE` (the annotation
`<prefix>/diag-requested`: who, why, when; audited as `clear` is).

This module holds the pure parts (the bound, the count, the request) and ActiveState, the one place
the diag thread and the engine share (a lock, no I/O).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from agent.core.marks import NodeEvent
from agent.core.repair_budget import Record
from agent.core.results_doc import decode_results, encode

SLOT = "slot"  # the record kind (label `<prefix>/record=slot`)
PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


@dataclass(frozen=True)
class ActivePolicy:
    """node.activeChecks."""

    max_concurrent: str = "5%"  # a count ("2") or a share of the GPU nodes ("5%"), at least 1
    retry_s: float = 300.0  # a postponed diag asks again after this long (an idle window, a slot)

    def limit(self, gpu_nodes: int) -> int:
        """How many GPU nodes may run an active check at once."""
        m = PERCENT.match(self.max_concurrent.strip())
        if m is None:
            return max(1, int(self.max_concurrent))
        return max(1, math.floor(float(m.group(1)) * gpu_nodes / 100 + 1e-9))


def parse_max_concurrent(value: object) -> str:
    """node.activeChecks.maxConcurrent: a whole number >= 1, or a percentage "N%" (0 < N <= 100)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a count or a percentage")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} is below 1")
        return str(value)
    if isinstance(value, str):
        m = PERCENT.match(value.strip())
        if m is not None and 0 < float(m.group(1)) <= 100:
            return value.strip()
        if value.strip().isdigit() and int(value) >= 1:
            return value.strip()
    raise ValueError(f"{value!r} is not a count (>= 1) or a percentage such as 5%")


def slots_before(records: Iterable[Record], own: Record, now: float, expire_s: float) -> list[Record]:
    """The live slots written before *own* (by resourceVersion) by other nodes: a slot older than
    *expire_s* (an agent that died while it held one) no longer counts."""
    return sorted(
        (
            r
            for r in records
            if r.kind == SLOT and r.rv < own.rv and r.node != own.node and now - r.at <= expire_s
        ),
        key=lambda r: r.rv,
    )


@dataclass(frozen=True)
class DiagRequest:
    """`gpu-healthcheck diag NODE`: who asked (SelfSubjectReview, else the kubeconfig user), why,
    when, and the level (None: the configured one). The annotation's JSON; a value that is not one
    (a `kubectl annotate … =now`) is an unnamed request."""

    by: str
    reason: str
    at: str = ""
    level: int | None = None

    def encode(self) -> str:
        doc: dict[str, object] = {"by": self.by, "reason": self.reason, "at": self.at}
        if self.level is not None:
            doc["level"] = self.level
        return encode(doc)

    @classmethod
    def decode(cls, raw: str | None) -> DiagRequest:
        doc = decode_results(raw)
        if doc is None or not isinstance(doc.get("by"), str):
            return cls(by="", reason="", at=str(raw or ""))
        level = doc.get("level")
        return cls(
            by=doc["by"],
            reason=str(doc.get("reason") or ""),
            at=str(doc.get("at") or ""),
            level=level if isinstance(level, int) and 1 <= level <= 4 else None,
        )

    def who(self) -> str:
        named = self.by or "unnamed (kubectl annotate)"
        return f"{named} (reason: {self.reason})" if self.reason else named


class ActiveState:
    """What the diag thread and the engine share: whether the node is held (the testing taint is
    wanted), the operator's request (seen on the Node, then started), and Events to post."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holding = False
        self._pending: DiagRequest | None = None  # seen on the Node, not started yet
        self._started: DiagRequest | None = None  # started: its annotation may go
        self._events: list[NodeEvent] = []

    @property
    def holding(self) -> bool:
        with self._lock:
            return self._holding

    def hold(self, on: bool) -> None:
        with self._lock:
            self._holding = on

    def ask(self, request: DiagRequest) -> bool:
        """The request on the Node; True when it is new (the diag becomes due now)."""
        with self._lock:
            if request in (self._pending, self._started):
                return False
            self._pending = request
            return True

    @property
    def pending(self) -> DiagRequest | None:
        with self._lock:
            return self._pending

    def start(self) -> DiagRequest | None:
        """The diag starts: the pending request (if any) is acted on."""
        with self._lock:
            request, self._pending = self._pending, None
            if request is not None:
                self._started = request
            return request

    def done_with(self, request: DiagRequest) -> bool:
        """Whether the Node's annotation is a request already acted on (it may be removed)."""
        with self._lock:
            return request == self._started

    def say(self, event: NodeEvent) -> None:
        with self._lock:
            self._events.append(event)

    def take_events(self) -> tuple[NodeEvent, ...]:
        with self._lock:
            out, self._events = tuple(self._events), []
            return out


class Slots(Protocol):
    """The fleet-wide bound (reporters/active_checks.FleetSlots)."""

    def acquire(self) -> str | None:
        """Take a slot: None when granted, else why not (in words)."""

    def release(self) -> None: ...


__all__ = [
    "SLOT",
    "ActivePolicy",
    "ActiveState",
    "DiagRequest",
    "Slots",
    "parse_max_concurrent",
    "slots_before",
]
