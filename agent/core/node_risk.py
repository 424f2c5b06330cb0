"""The risk label (`<prefix>/risk=high|normal`): a node that failed or was repaired again and again
lately is a lemon. In a 504-GPU cluster 3 of 63 nodes caused over half of all exclusions (Lablup/SKT,
anchors-4.md (b)); jobs that cannot afford a restart avoid such nodes by affinity (docs: un-quarantine).

What counts, per UTC day, kept in the Node's history annotation (core/history_annotation.py) beside its last
transitions, so the counts outlive the 20-transition list, an agent restart and a replaced agent (a new
Node object starts at 0):
- a failure episode: a transition into `fail` (confirmed: `fail` is written only after
  node.confirmAfter) whose last judged status before it (`unknown` is no judgement) was not `fail`;
- a repair: a transition that shows a new boot or an operator's `clear` while our taint or a
  remediation mark was on (as the repair history counts one, core/repair_escalation.py).
A node is `high` with at least `failures` episodes or `repairs` repairs within the last `window_days`
days (today included), `normal` otherwise: it decays as the days pass. Pure.

Per GPU, under per-GPU isolation (node.isolation gpu|auto): an episode confined to GPUs that our
DRA device taints hold, rather than the node taint, is those GPUs' (by PCI address, as the device
taint and the Xid key name it), so one flaky GPU does not make its seven neighbours high-risk:
- a GPU's failure episode: our device taint put on it (it was not on at the last write);
- a GPU's repair: a new boot while its device taint was on, or an operator's `clear` that lifted it.
A GPU is `high` by the same thresholds over its own counts; the node's label turns `high` by its
node-wide counts, or when `gpus` of its GPUs are `high` (0: never by its GPUs). A `fail` while
device taints hold GPUs and our node taint does not (the writer names them, reporters/history_entry.py)
is no node episode; one that turns node-wide is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from agent.core.history_annotation import (
    MAX_DAYS,
    Entry,
    GpuCounts,
    HistoryAction,
    bound_gpus,
    parse_counts,
    parse_gpu_counts,
    parse_isolated,
    short_boot,
)

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
    gpus: int = 2  # high-risk GPUs that make the node's label high (per-GPU isolation)


def day_of(stamp: str) -> str | None:
    """The UTC day of an RFC 3339 stamp, None when it is unreadable."""
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when.astimezone(timezone.utc) if when.tzinfo else when).strftime("%Y-%m-%d")


def tally(
    entries: Sequence[Entry], new: Entry, before: Sequence[str] = (), now: Sequence[str] = ()
) -> tuple[int, int]:
    """What the entry *new*, added after *entries*, counts for the node: (a failure episode, a
    repair). *before*, *now*: the GPUs our device taints held at the last write and after this one
    (a fail while they hold some is theirs, not the node's, and so is its repair, even where our
    node taint stood in for a rule the API server refused)."""
    last = entries[-1] if entries else None
    judged = next((e.status for e in reversed(entries) if e.status != UNKNOWN), None)
    episode = int(new.status == FAIL and not now and (judged != FAIL or bool(before)))
    marked = last is not None and last.marked and not before
    repair = int(marked and (_rebooted(last, new) or new.cleared))
    return episode, repair


def _rebooted(last: Entry | None, new: Entry | None) -> bool:
    return last is not None and new is not None and bool(last.boot and new.boot and last.boot != new.boot)


def gpu_tally(
    entries: Sequence[Entry], new: Entry | None, before: Sequence[str], now: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """What a write counts per GPU: an episode for each GPU our device taints hold now and did not
    at the last write; a repair for each they held, on a new boot, or on a `clear` that lifted it.
    *new*: the entry the write adds (None: it adds none, so no clear and no new boot)."""
    last = entries[-1] if entries else None
    out = {g: (1, 0) for g in now if g not in before}
    for g in before:
        if _rebooted(last, new) or (new is not None and new.cleared and g not in now):
            out[g] = (out.get(g, (0, 0))[0], 1)
    return out


def add(counts: Counts, day: str | None, delta: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """*counts* with *delta* added on *day*, the days older than RETAIN_DAYS before it dropped."""
    out = dict(counts)
    if day is None or delta == (0, 0):
        return out
    old = out.get(day, (0, 0))
    out[day] = (old[0] + delta[0], old[1] + delta[1])
    first = (date.fromisoformat(day) - timedelta(days=RETAIN_DAYS - 1)).isoformat()
    return {d: v for d, v in sorted(out.items()) if d >= first}


def add_gpus(
    gpus: GpuCounts, day: str | None, deltas: Mapping[str, tuple[int, int]]
) -> dict[str, dict[str, tuple[int, int]]]:
    """*gpus* with each GPU's delta added on *day* (as `add`: every GPU's days older than RETAIN_DAYS
    before it dropped), bounded (core/history_annotation)."""
    out: dict[str, Counts] = {g: dict(c) for g, c in gpus.items()}
    for g, delta in deltas.items():
        out[g] = add(out.get(g, {}), day, delta)
    if day is not None and deltas:
        first = (date.fromisoformat(day) - timedelta(days=RETAIN_DAYS - 1)).isoformat()
        out = {g: {d: v for d, v in c.items() if d >= first} for g, c in out.items()}
    return bound_gpus(out)


def risk(counts: Counts, policy: RiskPolicy, today: str) -> str:
    """`high` or `normal` on *today* (a UTC day) by the counts within the window."""
    first = (date.fromisoformat(today) - timedelta(days=policy.window_days - 1)).isoformat()
    inside = [v for d, v in counts.items() if first <= d <= today]
    failures, repairs = sum(v[0] for v in inside), sum(v[1] for v in inside)
    if (policy.failures and failures >= policy.failures) or (policy.repairs and repairs >= policy.repairs):
        return HIGH
    return NORMAL


@dataclass(frozen=True)
class Outlook:
    """The risk a verdict gives: the node's label, and each GPU's with counts (GPU → high|normal)."""

    node: str
    gpus: Mapping[str, str]

    @property
    def high_gpus(self) -> tuple[str, ...]:
        return tuple(g for g, r in sorted(self.gpus.items()) if r == HIGH)


def outlook(counts: Counts, gpus: GpuCounts, policy: RiskPolicy, today: str) -> Outlook:
    """The node's label by its own counts, or by `policy.gpus` high-risk GPUs; each GPU's."""
    per_gpu = {g: risk(c, policy, today) for g, c in gpus.items()}
    node = risk(counts, policy, today)
    if policy.gpus and sum(r == HIGH for r in per_gpu.values()) >= policy.gpus:
        node = HIGH
    return Outlook(node, per_gpu)


def outlook_now(
    annotation: str | None,
    entries: Sequence[Entry],
    *,
    status: str,
    boot: str | None,
    cleared: bool,
    now: str,
    policy: RiskPolicy,
    isolated: Sequence[str] | None = None,
) -> Outlook:
    """The risk this verdict gives: the counts on the Node, plus what the transition it is about to
    record counts (the writer adds that entry, and its counts, in the same PATCH). *isolated*: the
    GPUs the device taints will hold after it, as the engine expects (None: as at the last write)."""
    before = parse_isolated(annotation)
    after = before if isolated is None else tuple(isolated)
    new = Entry(at=now, status=status, boot=short_boot(boot), did=HistoryAction.CLEAR if cleared else "")
    day = day_of(now)
    counts = add(parse_counts(annotation), day, tally(entries, new, before, after))
    gpus = add_gpus(parse_gpu_counts(annotation), day, gpu_tally(entries, new, before, after))
    return outlook(counts, gpus, policy, day) if day is not None else Outlook(NORMAL, {})


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
    """The label this verdict gives the node (outlook_now, no device taint changing)."""
    return outlook_now(
        annotation, entries, status=status, boot=boot, cleared=cleared, now=now, policy=policy
    ).node


__all__ = [
    "HIGH",
    "NORMAL",
    "RETAIN_DAYS",
    "Outlook",
    "RiskPolicy",
    "add",
    "add_gpus",
    "day_of",
    "gpu_tally",
    "outlook",
    "outlook_now",
    "risk",
    "risk_now",
    "tally",
]
