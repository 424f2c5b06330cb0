"""What an operator's clear covers, kept on the Node so that it outlives the agent process.

A clear (`gpu-healthcheck clear`) hides the latched findings it names. Their kernel-log lines stay in
the ring (or the file) until the next reboot, and every agent start reads this boot's log from its
start: without a record of what was cleared, a restart, an upgrade or a rollback found the same
lines again and failed the node again (production review 3, U3). The cover is that record: the boot
of the clear and, per cleared finding key, the newest line its evidence rested on (LinePos: the
kmsg sequence number, or the record's ordinal in a log without one). A finding is covered while its
own newest line is at or before that: a new line on the same GPU and code, or any line of another
key, is new evidence and fails the node. A clear of another boot covers nothing (the new boot's
log starts again; sequence numbers too).

It lives in the results annotation (field CLEAR_COVER_FIELD), which the agent restores at start and
rewrites in the same PATCH that consumes the clear request: the request is never gone without its
cover. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.core.findings import Finding
from agent.core.kernel import LinePos

CLEAR_COVER_FIELD = "clearCover"  # {"bootId": ..., "lines": {key: {"kind": "seq"|"line", "n": int}}}
MAX_KEYS = 32  # cleared keys kept per boot, the oldest clear's first to go (about 2 KB at most)


@dataclass(frozen=True)
class ClearCover:
    """The kernel-log lines this boot's clears covered: per finding key, the newest one."""

    boot: str
    lines: Mapping[str, LinePos] = field(default_factory=dict)


def covers(cover: ClearCover | None, boot: str | None, finding: Finding) -> bool:
    """Whether a clear of this boot covered every line the finding rests on. A finding without a
    line position (not kernel-log evidence), or whose position is of another kind than the cover's
    (the log read another way), is never covered: when in doubt the node fails."""
    if cover is None or not boot or cover.boot != boot:
        return False
    mark, last = cover.lines.get(finding.key), finding.last_line
    if mark is None or last is None or mark.kind != last.kind:
        return False
    return last.n <= mark.n


def extend(cover: ClearCover | None, boot: str | None, cleared: Iterable[Finding]) -> ClearCover | None:
    """The cover after a clear of `cleared` (the findings of the cleared latches as the agent last
    judged them) in `boot`: an earlier clear of the same boot stays, one of another boot goes.
    Without a boot id nothing can be kept (a cover must never reach into another boot)."""
    if not boot:
        return None
    lines = dict(cover.lines) if cover is not None and cover.boot == boot else {}
    for f in cleared:
        if f.last_line is not None:
            lines.pop(f.key, None)  # re-inserted: the newest clear is the last to go
            lines[f.key] = f.last_line
    while len(lines) > MAX_KEYS:
        del lines[next(iter(lines))]
    return ClearCover(boot, lines) if lines else None


def adopt(
    last_clear: Any, boot: str | None, findings: Iterable[Finding], boot_wall: float
) -> ClearCover | None:
    """The cover of a clear an agent without clearCover acted on (0.1.0, and 0.2.0 before clearCover),
    from its `lastClear` ({"at": RFC 3339, "latches": [keys]}) in a results annotation of this boot:
    the findings of those keys whose newest line the kernel stamped at or before `at` (a "mono"
    stamp is seconds since boot: `boot_wall` is the boot's epoch second). A line without a stamp,
    or stamped after the clear, is not covered. Only the last clear was kept, so an earlier one of
    the same boot is lost; and a clear is minutes after its Xid, so a clock skew of a second or two
    between the kernel's stamps and the wall clock does not matter."""
    if not isinstance(last_clear, dict) or not boot:
        return None
    try:
        at = datetime.fromisoformat(str(last_clear.get("at")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    keys = last_clear.get("latches")
    keys = set(keys) if isinstance(keys, list) else set()
    covered = []
    for f in findings:
        pos = f.last_line
        if f.key not in keys or pos is None or not pos.clock:
            continue
        if (pos.t if pos.clock == "wall" else boot_wall + pos.t) <= at:
            covered.append(f)
    return extend(None, boot, covered)


def for_boot(cover: ClearCover | None, boot: str | None) -> ClearCover | None:
    """The cover while it is of `boot`, else None (a reboot ends what it covers)."""
    return cover if cover is not None and boot and cover.boot == boot else None


def to_doc(cover: ClearCover | None) -> dict[str, Any] | None:
    if cover is None or not cover.lines:
        return None
    return {
        "bootId": cover.boot,
        "lines": {k: {"kind": p.kind, "n": p.n} for k, p in cover.lines.items()},
    }


def parse(doc: Any) -> ClearCover | None:
    """The field as written (None when absent or unreadable: a damaged field covers nothing)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("bootId"), str) or not doc["bootId"]:
        return None
    lines: dict[str, LinePos] = {}
    raw = doc.get("lines")
    for key, pos in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(pos, dict):
            continue
        kind, n = pos.get("kind"), pos.get("n")
        if kind in ("seq", "line") and type(n) is int:  # a bool is no position
            lines[str(key)] = LinePos(str(kind), n)
    return ClearCover(doc["bootId"], lines) if lines else None
