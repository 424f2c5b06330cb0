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
entries (MAX_DAYS days). An older agent reads the entries and drops that element when it writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.text import shorten

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

# Our taint as an entry records it ("" = off).
TAINT_ON, TAINT_HELD, TAINT_DISABLED = "on", "held", "disabled"
# The remediation marks ("" = none wanted, or wanted without our taint).
MARK_ON, MARK_BUDGET, MARK_WAVE = "on", "budget", "wave"

# What was done (an entry's `did`, joined with "+") and by whom.
TAINT, UNTAINT, BRAKE_HELD, TAINT_OFF_BY_LABEL = "taint", "untaint", "brake-held", "taint-disabled"
MARK, UNMARK, BUDGET_HELD, WAVE_HELD = "mark", "unmark", "budget-held", "wave-held"
CLEAR, REBOOT = "clear", "reboot"
AGENT, BRAKE, BUDGET, WAVE, LABEL = "agent", "brake", "repair budget", "wave hold", "label"

_TAINT_DID = {TAINT_ON: TAINT, TAINT_HELD: BRAKE_HELD, TAINT_DISABLED: TAINT_OFF_BY_LABEL}
_MARK_DID = {MARK_ON: MARK, MARK_BUDGET: BUDGET_HELD, MARK_WAVE: WAVE_HELD}
_BY = {BRAKE_HELD: BRAKE, BUDGET_HELD: BUDGET, WAVE_HELD: WAVE, TAINT_OFF_BY_LABEL: LABEL}
FIELDS = ("at", "status", "key", "boot", "taint", "mark", "did", "by")


@dataclass(frozen=True)
class Entry:
    """One transition. `taint` and `mark` are the state after it; `did` what changed them."""

    at: str  # RFC 3339 UTC
    status: str  # pass | warn | fail | unknown
    key: str = ""  # the worst finding's key (fail, warn)
    boot: str = ""  # the boot id's first BOOT_CHARS characters
    taint: str = ""  # TAINT_ON | TAINT_HELD | TAINT_DISABLED | ""
    mark: str = ""  # MARK_ON | MARK_BUDGET | MARK_WAVE | ""
    did: str = ""  # "taint+mark", "untaint", "clear", "reboot", ... ("" = the status changed alone)
    by: str = ""  # agent | brake | repair budget | wave hold | label | the clear's requester | "-"

    @property
    def state(self) -> tuple[str, str, str, str, str]:
        return (self.status, self.key, self.boot, self.taint, self.mark)

    @property
    def marked(self) -> bool:
        """Our taint or a remediation mark was on: an engine or a human had reason to repair."""
        return self.taint == TAINT_ON or self.mark == MARK_ON

    @property
    def cleared(self) -> bool:
        return CLEAR in self.did.split("+")

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


def parse_counts(raw: str | None) -> dict[str, tuple[int, int]]:
    """The per-day counts (core/node_risk.py): the annotation's `{"days": {"YYYY-MM-DD": [failure
    episodes, repairs]}}` element; what does not parse is left out."""
    out: dict[str, tuple[int, int]] = {}
    for item in _items(raw):
        days = item.get(DAYS) if isinstance(item, dict) else None
        for day, pair in (days or {}).items() if isinstance(days, dict) else ():
            if (
                isinstance(day, str)
                and DAY.match(day)
                and isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair)
            ):
                out[day] = (pair[0], pair[1])
    return dict(sorted(out.items())[-MAX_DAYS:])


def encode(entries: Sequence[Entry], counts: Mapping[str, tuple[int, int]] | None = None) -> str:
    """The annotation's value: the per-day counts first (when there are any), then the last
    MAX_ENTRIES entries, the entries under MAX_BYTES."""
    kept = list(entries)[-MAX_ENTRIES:]
    days = dict(sorted((counts or {}).items())[-MAX_DAYS:])
    head: list[Any] = [{DAYS: {d: list(v) for d, v in days.items()}}] if days else []
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
    taint: str,
    mark: str,
    cleared_by: str | None = None,
) -> Entry | None:
    """The entry to add after *last*, or None when nothing it records changed and no clear was
    acted on (*cleared_by*: its requester, "" when unnamed)."""
    boot = short_boot(boot)
    new = (status, shorten(key, KEY_MAX), boot, taint, mark)
    if last is not None and last.state == new and cleared_by is None:
        return None
    before = last or Entry(at="", status="", boot=boot)
    did = []
    if cleared_by is not None:
        did.append(CLEAR)
    if before.boot and boot and before.boot != boot:
        did.append(REBOOT)
    if taint != before.taint:
        did.append(_TAINT_DID.get(taint) or (UNTAINT if before.taint == TAINT_ON else ""))
    if mark != before.mark:
        did.append(_MARK_DID.get(mark) or (UNMARK if before.mark == MARK_ON else ""))
    did = [d for d in did if d]
    if cleared_by is not None:
        by = cleared_by or "unnamed (kubectl annotate)"
    else:
        by = next((_BY[d] for d in did if d in _BY), "-" if did == [REBOOT] else AGENT)
    return Entry(
        at=at,
        status=status,
        key=new[1],
        boot=boot,
        taint=taint,
        mark=mark,
        did=shorten("+".join(did), DID_MAX),
        by=shorten(by, BY_MAX),
    )


def append(entries: Iterable[Entry], entry: Entry) -> list[Entry]:
    return [*entries, entry][-MAX_ENTRIES:]


__all__ = [
    "MAX_BYTES",
    "MAX_ENTRIES",
    "Entry",
    "append",
    "encode",
    "parse",
    "parse_counts",
    "short_boot",
    "transition",
]
