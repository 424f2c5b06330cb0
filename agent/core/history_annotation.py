"""The Node's own history (the `<prefix>/history` annotation): its last transitions, each with when,
the status, the worst finding's key, the boot, our taint and remediation marks as they then stood,
and what was done and by whom.

Why on the Node: the API server drops Events after an hour, and peers keep this in a database
(NVSentinel) or sqlite (gpud). An annotation of its own lives as long as the Node object does (a
new Node starts empty), is read back by a restarted agent (it is on the Node, not in the process),
and never crowds the results annotation's 16 KiB.

Why it costs no write: an entry is added only when the state it records (status, key, boot, taint,
mark) differs from the last entry's, or a `clear` was acted on, and the writer sends it in the Node
PATCH of that change (reporters/history_entry.py). Bounded: MAX_ENTRIES entries, each field shortened,
the whole under MAX_BYTES.

Beside the entries, first in the list, one element counts failure episodes and repairs per UTC day
(`{"days": {"2026-11-24": [1, 0]}}`, core/node_risk.py), for the risk label: it outlives the
entries (MAX_DAYS days). Under per-GPU isolation it also counts them per GPU (`"gpus": {"0000:86:00.0":
{"2026-11-24": [1, 0]}}`, at most MAX_GPU_DAYS days in all) and names the GPUs our device taints
hold now (`"isolated"`). An older agent reads the entries and drops that element when it writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import unique
from typing import Any

from agent.core.text import shorten
from agent.core.vocabulary import Vocabulary

MAX_ENTRIES = 20
KEY_MAX, BY_MAX, DID_MAX = 96, 64, 64  # the longest entry is under ENTRY_MAX_BYTES
ENTRY_MAX_BYTES = 400
MAX_BYTES = MAX_ENTRIES * ENTRY_MAX_BYTES  # 8000 bytes: the annotation's bound
BOOT_CHARS = 8  # a boot id's first characters tell boots apart
# The per-day counts of failure episodes and repairs (core/node_risk.py), an element of their own
# before the entries: at most MAX_DAYS days (about 2 KB beside the entries' MAX_BYTES).
DAYS = "days"
MAX_DAYS = 90
DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Per GPU (core/node_risk.py), in the same element: its counts by day, at most MAX_GPU_DAYS (GPU, day)
# pairs in all (about 2.5 KB; the oldest days go first), and the GPUs our device taints hold now.
GPUS, ISOLATED = "gpus", "isolated"
MAX_GPU_DAYS = 128
MAX_GPUS, GPU_MAX = 32, 40  # GPUs named in "isolated", and a GPU's name (a PCI address) at most


@unique
class HistoryTaint(Vocabulary):
    """Our taint as an entry records it (its `taint`)."""

    ON = "on"
    HELD = "held"  # wanted, the brake holds it back
    DISABLED = "disabled"  # wanted, the label <prefix>/taint=disabled refuses it
    OFF = ""


@unique
class HistoryMark(Vocabulary):
    """The remediation marks as an entry records them (its `mark`)."""

    MARK_ON = "on"
    HELD_BY_BUDGET = "budget"
    HELD_BY_WAVE = "wave"
    MARK_OFF = ""  # none wanted, or wanted without our taint


@unique
class HistoryAction(Vocabulary):
    """What was done (an entry's `did`, joined with "+")."""

    TAINT = "taint"
    UNTAINT = "untaint"
    TAINT_HELD_BY_BRAKE = "brake-held"
    TAINT_OFF_BY_LABEL = "taint-disabled"
    MARK = "mark"
    UNMARK = "unmark"
    MARK_HELD_BY_BUDGET = "budget-held"
    MARK_HELD_BY_WAVE = "wave-held"
    CLEAR = "clear"
    CLEAR_KEPT = "clear-kept"  # an agent met kernel-log lines a clear of this boot covered: no failure
    OPERATOR_DIAG = "diag"  # an operator's `gpu-healthcheck diag` started (its requester in `by`)
    REBOOT = "reboot"


@unique
class HistoryActor(Vocabulary):
    """Who did it (an entry's `by`), but for a clear's requester, who is named as they asked."""

    AGENT = "agent"
    BRAKE = "brake"
    REPAIR_BUDGET = "repair budget"
    WAVE_HOLD = "wave hold"
    LABEL = "label"


_TAINT_DID: dict[str, HistoryAction] = {
    HistoryTaint.ON: HistoryAction.TAINT,
    HistoryTaint.HELD: HistoryAction.TAINT_HELD_BY_BRAKE,
    HistoryTaint.DISABLED: HistoryAction.TAINT_OFF_BY_LABEL,
}
_MARK_DID: dict[str, HistoryAction] = {
    HistoryMark.MARK_ON: HistoryAction.MARK,
    HistoryMark.HELD_BY_BUDGET: HistoryAction.MARK_HELD_BY_BUDGET,
    HistoryMark.HELD_BY_WAVE: HistoryAction.MARK_HELD_BY_WAVE,
}
_BY = {
    HistoryAction.TAINT_HELD_BY_BRAKE: HistoryActor.BRAKE,
    HistoryAction.MARK_HELD_BY_BUDGET: HistoryActor.REPAIR_BUDGET,
    HistoryAction.MARK_HELD_BY_WAVE: HistoryActor.WAVE_HOLD,
    HistoryAction.TAINT_OFF_BY_LABEL: HistoryActor.LABEL,
}
FIELDS = ("at", "status", "key", "boot", "taint", "mark", "did", "by")


@dataclass(frozen=True)
class Entry:
    """One transition. `taint` and `mark` are the state after it; `did` what changed them."""

    at: str  # RFC 3339 UTC
    status: str  # pass | warn | fail | unknown
    key: str = ""  # the worst finding's key (fail, warn)
    boot: str = ""  # the boot id's first BOOT_CHARS characters
    taint: str = ""  # a HistoryTaint (as read: an older or newer agent's word stays a str)
    mark: str = ""  # a HistoryMark
    did: str = ""  # "taint+mark", "untaint", "clear", "diag", "reboot", ... ("" = the status changed alone)
    by: str = ""  # a HistoryActor, the clear's or diag's requester, or "-"

    @property
    def state(self) -> tuple[str, str, str, str, str]:
        return (self.status, self.key, self.boot, self.taint, self.mark)

    @property
    def marked(self) -> bool:
        """Our taint or a remediation mark was on: an engine or a human had reason to repair."""
        return self.taint == HistoryTaint.ON or self.mark == HistoryMark.MARK_ON

    @property
    def cleared(self) -> bool:
        return HistoryAction.CLEAR in self.did.split("+")

    @property
    def diagnosed(self) -> bool:
        """An operator's diag started here (`by` names who asked)."""
        return HistoryAction.OPERATOR_DIAG in self.did.split("+")

    def as_dict(self) -> dict[str, str]:
        """Compact: empty fields are left out (at and status never are)."""
        doc = {f: getattr(self, f) for f in FIELDS}
        return {k: v for k, v in doc.items() if v or k in ("at", "status")}


def short_boot(boot: str | None) -> str:
    return (boot or "")[:BOOT_CHARS]


def _items(raw: str | None) -> list[Any]:
    try:
        doc = json.loads(raw) if raw else []
    except ValueError:
        return []
    return doc if isinstance(doc, list) else []


def parse(raw: str | None) -> list[Entry]:
    """The entries of the annotation, oldest first; what does not parse is left out (the counts
    element too: an agent of an older version reads the entries and drops the counts)."""
    out = []
    for item in _items(raw):
        if isinstance(item, dict) and isinstance(item.get("at"), str) and isinstance(item.get("status"), str):
            out.append(Entry(**{f: str(item.get(f) or "") for f in FIELDS}))
    return out[-MAX_ENTRIES:]


def _days(days: Any) -> dict[str, tuple[int, int]]:
    """`{"YYYY-MM-DD": [failure episodes, repairs]}`, what parses of it."""
    out: dict[str, tuple[int, int]] = {}
    for day, pair in days.items() if isinstance(days, dict) else ():
        if (
            isinstance(day, str)
            and DAY.match(day)
            and isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair)
        ):
            out[day] = (pair[0], pair[1])
    return out


def _head(raw: str | None, field: str) -> Any:
    return next((i[field] for i in _items(raw) if isinstance(i, dict) and field in i), None)


def parse_counts(raw: str | None) -> dict[str, tuple[int, int]]:
    """The per-day counts (core/node_risk.py): the annotation's `{"days": {"YYYY-MM-DD": [failure
    episodes, repairs]}}` element; what does not parse is left out."""
    out: dict[str, tuple[int, int]] = {}
    for item in _items(raw):
        out.update(_days(item.get(DAYS)) if isinstance(item, dict) else {})
    return dict(sorted(out.items())[-MAX_DAYS:])


GpuCounts = Mapping[str, Mapping[str, tuple[int, int]]]  # GPU → day → (failure episodes, repairs)


def parse_gpu_counts(raw: str | None) -> dict[str, dict[str, tuple[int, int]]]:
    """The per-GPU counts (`"gpus": {GPU: {"YYYY-MM-DD": [episodes, repairs]}}`), bounded."""
    gpus = _head(raw, GPUS)
    out = {str(g): _days(days) for g, days in gpus.items()} if isinstance(gpus, dict) else {}
    return bound_gpus(out)


def bound_gpus(gpus: GpuCounts) -> dict[str, dict[str, tuple[int, int]]]:
    """At most MAX_GPU_DAYS (GPU, day) pairs: the oldest days go first; a GPU left with none goes."""
    pairs = sorted(((d, g) for g, days in gpus.items() for d in days if len(g) <= GPU_MAX), reverse=True)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for d, g in sorted(pairs[:MAX_GPU_DAYS]):
        out.setdefault(g, {})[d] = gpus[g][d]
    return dict(sorted(out.items()))


def parse_isolated(raw: str | None) -> tuple[str, ...]:
    """The GPUs our device taints held at the last write (`"isolated": [GPU, ...]`)."""
    names = _head(raw, ISOLATED)
    return (
        tuple(sorted({str(n) for n in names if isinstance(n, str) and len(n) <= GPU_MAX}))[:MAX_GPUS]
        if isinstance(names, list)
        else ()
    )


def encode(
    entries: Sequence[Entry],
    counts: Mapping[str, tuple[int, int]] | None = None,
    gpus: GpuCounts | None = None,
    isolated: Sequence[str] = (),
) -> str:
    """The annotation's value: the counts (per day, per GPU) and the GPUs isolated first (when there
    are any), then the last MAX_ENTRIES entries, the entries under MAX_BYTES."""
    kept = list(entries)[-MAX_ENTRIES:]
    days = dict(sorted((counts or {}).items())[-MAX_DAYS:])
    per_gpu = bound_gpus(gpus or {})
    named = sorted({n for n in isolated if len(n) <= GPU_MAX})[:MAX_GPUS]
    element: dict[str, Any] = {DAYS: {d: list(v) for d, v in days.items()}} if days else {}
    if per_gpu:
        element[GPUS] = {g: {d: list(v) for d, v in c.items()} for g, c in per_gpu.items()}
    if named:
        element[ISOLATED] = named
    head: list[Any] = [element] if element else []
    while True:
        text = json.dumps([e.as_dict() for e in kept], separators=(",", ":"), ensure_ascii=False)
        if len(text.encode()) <= MAX_BYTES or len(kept) <= 1:
            break
        kept.pop(0)  # only an entry of a version with longer fields can get here
    return json.dumps([*head, *(e.as_dict() for e in kept)], separators=(",", ":"), ensure_ascii=False)


def transition(
    last: Entry | None,
    *,
    at: str,
    status: str,
    key: str,
    boot: str,
    taint: HistoryTaint | str,
    mark: HistoryMark | str,
    cleared_by: str | None = None,
    diag_by: str | None = None,
    clear_kept: bool = False,
) -> Entry | None:
    """The entry to add after *last*, or None when nothing it records changed and no clear was
    acted on (*cleared_by*: its requester, "" when unnamed) nor an operator's diag started
    (*diag_by*: likewise) nor a clear's lines were met again without failing the node (*clear_kept*:
    a restarted agent's, so that the history shows why the same Xid did not come back)."""
    boot = short_boot(boot)
    new = (status, shorten(key, KEY_MAX), boot, str(taint), str(mark))  # as parse() reads them back
    if last is not None and last.state == new and cleared_by is None and diag_by is None and not clear_kept:
        return None
    before = last or Entry(at="", status="", boot=boot)
    did: list[HistoryAction | None] = []
    if cleared_by is not None:
        did.append(HistoryAction.CLEAR)
    if diag_by is not None:
        did.append(HistoryAction.OPERATOR_DIAG)
    if clear_kept:
        did.append(HistoryAction.CLEAR_KEPT)
    if before.boot and boot and before.boot != boot:
        did.append(HistoryAction.REBOOT)
    if taint != before.taint:
        did.append(
            _TAINT_DID.get(taint) or (HistoryAction.UNTAINT if before.taint == HistoryTaint.ON else None)
        )
    if mark != before.mark:
        did.append(
            _MARK_DID.get(mark) or (HistoryAction.UNMARK if before.mark == HistoryMark.MARK_ON else None)
        )
    done = [d for d in did if d is not None]
    by: str
    asked = cleared_by if cleared_by is not None else diag_by
    if asked is not None:
        by = asked or "unnamed (kubectl annotate)"
    else:
        by = next(
            (_BY[d] for d in done if d in _BY), "-" if done == [HistoryAction.REBOOT] else HistoryActor.AGENT
        )
    return Entry(
        at=at,
        status=status,
        key=new[1],
        boot=boot,
        taint=new[3],
        mark=new[4],
        did=shorten("+".join(done), DID_MAX),
        by=shorten(str(by), BY_MAX),
    )


def append(entries: Iterable[Entry], entry: Entry) -> list[Entry]:
    return [*entries, entry][-MAX_ENTRIES:]


__all__ = [
    "MAX_BYTES",
    "MAX_ENTRIES",
    "Entry",
    "GpuCounts",
    "HistoryAction",
    "HistoryActor",
    "HistoryMark",
    "HistoryTaint",
    "append",
    "bound_gpus",
    "encode",
    "parse",
    "parse_counts",
    "parse_gpu_counts",
    "parse_isolated",
    "short_boot",
    "transition",
]
