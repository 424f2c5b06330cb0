"""Active checks that never collide with work (docs/guides/active-checks.md): the DCGM diag stresses every
GPU for minutes, so it runs only in an idle window (probes/dcgm/idle.py), and three things keep it
apart from work:

- the node is held while it runs: the taint `<prefix>/testing:NoSchedule` goes on before the diag
  starts and is lifted when it ends (the engine writes it like our other taints: Marks.testing);
- a fleet-wide bound: at most `node.activeChecks.maxConcurrent` GPU nodes run one at once (a count,
  or a share of the GPU nodes, at least 1), coordinated through the API server as the repair budget
  is: a `slot` record (a Lease in the agent's namespace) per node while it runs, each node counting
  the other nodes with a live slot written before its own (by resourceVersion, the API server's
  write order; distinct nodes, not records: a node counts once) and taking its own back when the
  bound is reached;
- a pod that arrives anyway (tolerating the taint) aborts the diag. An aborted diag did not run: the
  last completed diag's verdict stays in force (core/dcgm_report.kept_after_abort; with none yet the
  check is skipped, "not run yet", never `unknown`), and it runs again once the GPUs are idle, at
  the pace of ActivePolicy.retry_after (Retry), in the fleet bound and under the taint as any diag.

An operator asks for a diag at the next idle window with `gpu-healthcheck diag NODE` (the annotation
`<prefix>/diag-requested`: who, why, when; audited as `clear` is: the ActiveCheckStarted Event names
them, and the results annotation's `lastDiag` keeps the request with its outcome: started, then
completed or aborted; a request aborted for work is retried as a routine diag is, its record saying
when (`retryAt`) and which try it is (`attempt`, from the second on)).

This module holds the pure parts (the bound, the count, the request, the record of the last request,
the states and abort reasons the metrics count) and ActiveState, the one place the diag thread and
the engine share (a lock, no I/O).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from agent.core.marks import NodeEvent
from agent.core.metric_labels import ActiveCheckAbort
from agent.core.node_keys import DIAG_ABORTED, DIAG_OUTCOMES, DIAG_STARTED
from agent.core.record_kind import RecordKind
from agent.core.repair_budget import Record
from agent.core.results_doc import decode_results, encode
from agent.core.text import shorten

PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")

RECORD_TEXT_MAX = 200  # each text of lastDiag (the results annotation stays under its 16 KiB)
RESTARTED = "the agent restarted during the diag"


@dataclass(frozen=True)
class Abort:
    """Why to stop a running diag: the metric's word, and in words (the result, the Event)."""

    reason: ActiveCheckAbort
    text: str


@dataclass(frozen=True)
class ActivePolicy:
    """node.activeChecks."""

    max_concurrent: str = "5%"  # a count ("2") or a share of the GPU nodes ("5%"), at least 1
    retry_s: float = 300.0  # a postponed diag asks again after this long (an idle window, a slot)

    def retry_after(self, aborts: int, cap_s: float) -> float:
        """How long after the *aborts*-th diag in a row aborted for work the next one waits before
        it tries: retrySeconds after the first abort, doubling with each further one, at most
        *cap_s* (intervals.dcgmDiag, the schedule's own pace), never under retrySeconds. Then it
        waits for idle GPUs and a slot as any due diag does, asking every retrySeconds: a node that
        stays busy only asks its kubelet; one whose jobs keep arriving mid-diag costs a few
        aborted diags, fewer and fewer, not one every retrySeconds."""
        doubled = self.retry_s * 2.0 ** (min(max(aborts, 1), 32) - 1)
        return max(self.retry_s, min(cap_s, doubled))

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
    """The other nodes whose live slot was written before *own* (by resourceVersion), one record per
    node (its earliest live one): a node's slots count once, however many its token wrote, so one
    identity takes at most one slot. A slot older than *expire_s* (an agent that died while it held
    one) no longer counts."""
    first: dict[str, Record] = {}
    for r in sorted(records, key=lambda r: r.rv):
        if r.kind == RecordKind.SLOT and r.node != own.node and now - r.at <= expire_s:
            first.setdefault(r.node, r)
    return [r for r in first.values() if r.rv < own.rv]


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


def diag_record(request: DiagRequest, level: int, at: str, attempt: int = 1) -> dict[str, Any]:
    """The results annotation's `lastDiag` for a request whose diag started at *at*: who asked (None:
    unnamed, a `kubectl annotate`), why, when they asked, the level run, the outcome; from the
    second try on (the first ones aborted for work), which try it is."""
    record: dict[str, Any] = {
        "by": shorten(request.by, RECORD_TEXT_MAX) or None,
        "reason": shorten(request.reason, RECORD_TEXT_MAX) or None,
        "requestedAt": shorten(request.at, RECORD_TEXT_MAX) or None,
        "level": level,
        "outcome": DIAG_STARTED,
        "startedAt": at,
    }
    if attempt > 1:
        record["attempt"] = attempt
    return record


def ended(record: dict[str, Any], outcome: str, at: str, why: str = "", retry_at: str = "") -> dict[str, Any]:
    """*record* once its diag ended (*outcome* completed or aborted, *why* aborted; *retry_at*: it
    runs again once the GPUs are idle, not before then)."""
    done = {**record, "outcome": outcome, "endedAt": at}
    if why:
        done["abortReason"] = shorten(why, RECORD_TEXT_MAX)
    if retry_at:
        done["retryAt"] = retry_at
    return done


def restored_record(raw: object) -> dict[str, Any] | None:
    """`lastDiag` as a restarting agent finds it in its results annotation; a diag still `started`
    there died with the agent that ran it (the engine stops a diag whose heartbeats stop): aborted."""
    if not isinstance(raw, dict) or raw.get("outcome") not in DIAG_OUTCOMES:
        return None
    if raw["outcome"] == DIAG_STARTED:
        return ended(raw, DIAG_ABORTED, str(raw.get("startedAt") or ""), RESTARTED)
    return dict(raw)


@dataclass(frozen=True)
class Retry:
    """A diag aborted for work runs again: the aborts in a row so far, not before *due* (monotonic
    seconds; *at*, the same in RFC 3339 for the messages), for the operator's *request* it ran
    for (None: a routine diag)."""

    aborts: int
    due: float
    at: str
    request: DiagRequest | None = None


class ActiveState:
    """What the diag thread and the engine share: whether the node is held (the testing taint is
    wanted), the operator's request (seen on the Node, then started), the record of the last one
    (lastDiag), the retry of a diag aborted for work, and Events to post."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holding = False
        self._pending: DiagRequest | None = None  # seen on the Node, not started yet
        self._started: DiagRequest | None = None  # started: its annotation may go
        self._attempt = 0  # which try of the started request this is
        self._record: dict[str, Any] | None = None  # the last started request and its outcome
        self._retry: Retry | None = None  # the last diag was aborted for work: it runs again
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
        """The diag starts: the pending request (if any) is acted on, else the request whose diag
        was aborted for work (its next try)."""
        with self._lock:
            request, self._pending = self._pending, None
            again = request is None and self._retry is not None and self._retry.request is not None
            if again:
                request = self._retry.request if self._retry is not None else None
            if request is not None:
                self._attempt = self._attempt + 1 if again and request == self._started else 1
                self._started = request
            return request

    def done_with(self, request: DiagRequest) -> bool:
        """Whether the Node's annotation is a request already acted on (it may be removed)."""
        with self._lock:
            return request == self._started

    def began(self, request: DiagRequest, level: int, at: str) -> None:
        """The requested diag started at *at* (lastDiag: started)."""
        with self._lock:
            self._record = diag_record(request, level, at, self._attempt)

    def end(self, outcome: str, at: str, why: str = "", retry_at: str = "") -> None:
        """The requested diag ended; nothing when none is started (a routine diag, or already ended)."""
        with self._lock:
            if self._record is not None and self._record.get("outcome") == DIAG_STARTED:
                self._record = ended(self._record, outcome, at, why, retry_at)

    def retry_later(
        self, request: DiagRequest | None, wait_s: Callable[[int], float], now: float, wall: float
    ) -> Retry:
        """The diag that ran for *request* (None: routine) was aborted for work at *now* (monotonic;
        *wall*: the same in wall seconds): it runs again, not before wait_s(aborts in a row)."""
        with self._lock:
            aborts = (self._retry.aborts if self._retry is not None else 0) + 1
            wait = wait_s(aborts)
            at = datetime.fromtimestamp(int(wall + wait), timezone.utc).isoformat().replace("+00:00", "Z")
            self._retry = Retry(aborts, now + wait, at, request)
            return self._retry

    def settled(self) -> None:
        """A diag ended otherwise (completed, or could not run): no retry is due."""
        with self._lock:
            self._retry = None

    @property
    def retry(self) -> Retry | None:
        """The retry due of a diag aborted for work (None: none)."""
        with self._lock:
            return self._retry

    @property
    def record(self) -> dict[str, Any] | None:
        """lastDiag as this agent made it (None: no request started since the agent started)."""
        with self._lock:
            return dict(self._record) if self._record is not None else None

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
    "Abort",
    "ActivePolicy",
    "ActiveState",
    "DiagRequest",
    "Retry",
    "Slots",
    "diag_record",
    "ended",
    "parse_max_concurrent",
    "restored_record",
    "slots_before",
]
