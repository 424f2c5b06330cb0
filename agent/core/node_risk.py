"""The risk label (`<prefix>/risk=high|normal`): a node that failed or was repaired again and again
lately is a lemon. In a 504-GPU cluster 3 of 63 nodes caused over half of all exclusions (Lablup/SKT,
anchors-4.md (b)); jobs that cannot afford a restart avoid such nodes by affinity (README).

What counts, per UTC day, kept in the Node's history annotation (core/history_annotation.py) beside its last
transitions, so the counts outlive the 20-transition list, an agent restart and a replaced agent (a new
Node object starts at 0):
- a failure episode: a transition into `fail` (confirmed: `fail` is written only after
  node.confirmAfter) whose last judged status before it (`unknown` is no judgement) was not `fail`;
- a repair: a transition that shows a new boot or an operator's `clear` while our taint or a
  remediation mark was on (as the repair history counts one, core/repair_escalation.py).
A node is `high` with at least `failures` episodes or `repairs` repairs within the last `window_days`
days (today included), `normal` otherwise: it decays as the days pass. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from agent.core.history_annotation import MAX_DAYS, Entry, parse_counts, short_boot

HIGH, NORMAL = "high", "normal"
RETAIN_DAYS = MAX_DAYS  # days of counts kept (windowDays may be at most this)
FAIL, UNKNOWN = "fail", "unknown"

Counts = Mapping[str, tuple[int, int]]  # "YYYY-MM-DD" (UTC) → (failure episodes, repairs)


@dataclass(frozen=True)
class RiskPolicy:
    """node.risk: 0 switches a criterion off."""

    failures: int = 3
    repairs: int = 2
    window_days: int = 30


def day_of(stamp: str) -> str | None:
    """The UTC day of an RFC 3339 stamp, None when it is unreadable."""
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when.astimezone(timezone.utc) if when.tzinfo else when).strftime("%Y-%m-%d")


def tally(entries: Sequence[Entry], new: Entry) -> tuple[int, int]:
    """What the entry *new*, added after *entries*, counts: (a failure episode, a repair)."""
    last = entries[-1] if entries else None
    judged = next((e.status for e in reversed(entries) if e.status != UNKNOWN), None)
    episode = int(new.status == FAIL and judged != FAIL)
    rebooted = last is not None and bool(last.boot and new.boot and last.boot != new.boot)
    repair = int(last is not None and last.marked and (rebooted or new.cleared))
    return episode, repair


def add(counts: Counts, day: str | None, delta: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """*counts* with *delta* added on *day*, the days older than RETAIN_DAYS before it dropped."""
    out = dict(counts)
    if day is None or delta == (0, 0):
        return out
    old = out.get(day, (0, 0))
    out[day] = (old[0] + delta[0], old[1] + delta[1])
    first = (date.fromisoformat(day) - timedelta(days=RETAIN_DAYS - 1)).isoformat()
    return {d: v for d, v in sorted(out.items()) if d >= first}


def risk(counts: Counts, policy: RiskPolicy, today: str) -> str:
    """`high` or `normal` on *today* (a UTC day) by the counts within the window."""
    first = (date.fromisoformat(today) - timedelta(days=policy.window_days - 1)).isoformat()
    inside = [v for d, v in counts.items() if first <= d <= today]
    failures, repairs = sum(v[0] for v in inside), sum(v[1] for v in inside)
    if (policy.failures and failures >= policy.failures) or (policy.repairs and repairs >= policy.repairs):
        return HIGH
    return NORMAL


def risk_now(
    annotation: str | None,
    entries: Sequence[Entry],
    *,
    status: str,
    boot: str | None,
    cleared: bool,
    now: str,
    policy: RiskPolicy,
) -> str:
    """The label this verdict gives the node: the counts on the Node, plus what the transition it
    is about to record counts (the writer adds that entry, and its counts, in the same PATCH)."""
    new = Entry(at=now, status=status, boot=short_boot(boot), did="clear" if cleared else "")
    counts = add(parse_counts(annotation), day_of(now), tally(entries, new))
    today = day_of(now)
    return risk(counts, policy, today) if today is not None else NORMAL


__all__ = ["HIGH", "NORMAL", "RETAIN_DAYS", "RiskPolicy", "add", "day_of", "risk", "risk_now", "tally"]
