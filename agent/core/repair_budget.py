"""The repair budget and the correlated-wave hold (DESIGN.md §6.2, §6.3): pure decisions over records.

The brake caps how many nodes carry our taint at once; a repair engine deletes a marked node and
frees its slot. These two rules bound what the engines may *newly* be asked to repair:

- The budget: at most `limit` nodes may newly turn a remediation condition unhealthy per window
  (the smaller of maxNodes and maxFraction of the GPU nodes, at least one), optionally counted per
  value of a node label (a pool, a zone). Each new mark leaves a record that outlives the Node, so
  a node the engine deleted still counts until the window has passed.
- The wave hold: when at least `threshold` nodes newly failed on the same finding key (rule plus
  code: `xid/79`, `gpu.responsive/timeout`) within one stretch of `window_s`, new marks for that key
  are held fleet-wide. The hold lasts while that many nodes still fail on the key (a node that
  recovers, or whose Node is gone, no longer counts), or until an operator releases it
  (`gpu-healthcheck brake release`): records from before a release do not count.

Records are ordered by resourceVersion (the API server's global write order): a node that created
its mark record counts every record written before its own, so racing agents agree without a lock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from agent.core.findings import Finding

FAIL, MARK, RELEASE = "fail", "mark", "release"  # the kinds of record
RELEASE_ALL = ""  # a release without --key: every wave hold, and the budget's window
BUDGET_HELD, WAVE_HELD = "budget", "wave"  # why a node is held (metrics label values)
# creationTimestamp has whole seconds: a mark counts one second longer than its window (safe side).
RESOLUTION_S = 1.0


@dataclass(frozen=True)
class RecordKeys:
    """The records' label (the kind) and annotations (names may be longer than a label value)."""

    prefix: str

    @property
    def kind(self) -> str:
        return f"{self.prefix}/record"

    @property
    def node(self) -> str:
        return f"{self.prefix}/node"

    @property
    def key(self) -> str:
        return f"{self.prefix}/key"

    @property
    def pool(self) -> str:
        return f"{self.prefix}/pool"

    @property
    def by(self) -> str:
        return f"{self.prefix}/by"

    @property
    def reason(self) -> str:
        return f"{self.prefix}/reason"


@dataclass(frozen=True)
class BudgetPolicy:
    """node.repairBudget: maxNodes 0 = no absolute cap, maxFraction >= 1 = no fraction cap."""

    max_nodes: int = 10
    max_fraction: float = 0.05
    window_s: float = 3600.0
    per_label: str = ""

    @property
    def on(self) -> bool:
        return self.max_nodes > 0 or self.max_fraction < 1


@dataclass(frozen=True)
class WavePolicy:
    """node.waveHold: minNodes 0 = off."""

    min_nodes: int = 5
    min_fraction: float = 0.02
    window_s: float = 900.0

    @property
    def on(self) -> bool:
        return self.min_nodes > 0


@dataclass(frozen=True)
class Record:
    """One record as listed: what happened (kind), on which node, for which finding key (fail) or
    node-label value (mark), when (the server's creationTimestamp, epoch seconds) and in which order
    (resourceVersion). A release names its key ("" = all) and who asked, why."""

    name: str
    kind: str
    node: str = ""
    key: str = ""
    pool: str = ""
    at: float = 0.0
    rv: int = 0
    by: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Hold:
    """A new mark held back: why (BUDGET_HELD or WAVE_HELD), for which key, in words."""

    why: str
    key: str
    message: str


def finding_key(finding: Finding | None) -> str:
    """The wave's key of a finding: its check and the rest of its rule ("xid/79",
    "gpu.responsive/timeout"); the same fault on every GPU of every node has one key."""
    if finding is None:
        return "unknown"
    rule, check = finding.rule, finding.check
    rest = rule[len(check) + 1 :] if rule.startswith(check + ".") else rule
    return f"{check}/{rest}" if rest else check


def key_slug(key: str) -> str:
    """The key as a label value / name part (no "/": 63 characters of [a-z0-9.-_])."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("._-")[:63].strip("._-")
    return slug or "unknown"


def budget_limit(policy: BudgetPolicy, total: int) -> int:
    """New marks allowed per window among *total* GPU nodes: the smaller cap, at least one (a small
    pool can always have one node repaired); a very large number when the budget is off."""
    caps = []
    if policy.max_nodes > 0:
        caps.append(policy.max_nodes)
    frac = Fraction(str(policy.max_fraction))
    if frac < 1:
        caps.append(max(1, math.floor(frac * max(total, 1))))
    return min(caps) if caps else 10**9


def wave_threshold(policy: WavePolicy, total: int) -> int:
    """Nodes failing on one key that make a wave: minNodes, and at least minFraction of the fleet."""
    return max(policy.min_nodes, math.ceil(Fraction(str(policy.min_fraction)) * max(total, 1)))


def released_rv(records: Iterable[Record], key: str) -> int:
    """The resourceVersion of the last release that covers *key* (0: never): records written after
    it (a higher resourceVersion: the API server's write order, exact where creationTimestamp has
    whole seconds) count. A release without a key covers every key and the budget."""
    return max((r.rv for r in records if r.kind == RELEASE and r.key in (RELEASE_ALL, key)), default=0)


def wave_nodes(records: Iterable[Record], key: str, failing: set[str], after_rv: int) -> list[Record]:
    """The fail records of *key* that count: of nodes failing now, written after *after_rv* (a
    release), one per node (the earliest)."""
    first: dict[str, Record] = {}
    for r in sorted(records, key=lambda r: (r.at, r.rv)):
        if r.kind == FAIL and r.key == key and r.node in failing and r.rv > after_rv:
            first.setdefault(r.node, r)
    return sorted(first.values(), key=lambda r: (r.at, r.rv))


def wave_decision(
    records: Sequence[Record], key: str, failing: set[str], total: int, policy: WavePolicy
) -> Hold | None:
    """Held when at least the threshold's worth of nodes still fail on *key* and that many of them
    newly failed within one stretch of the window (a wave, not a trickle), since the last release."""
    if not policy.on:
        return None
    need = wave_threshold(policy, total)
    nodes = wave_nodes(records, key, failing, released_rv(records, key))
    times = [r.at for r in nodes]
    for i in range(len(times) - need + 1):
        if times[i + need - 1] - times[i] <= policy.window_s:
            return Hold(
                WAVE_HELD,
                key,
                f"{len(nodes)} GPU nodes fail on {key} (at least {need} of {total} newly failed within "
                f"{policy.window_s / 60:g} min): a correlated wave, new remediation marks for it are "
                "held until it ends or `gpu-healthcheck brake release` (node.waveHold)",
            )
    return None


def budget_count(records: Iterable[Record], own: Record, window_s: float, pool: str | None) -> int:
    """Mark records that count against *own* (itself included): written at or before it (by
    resourceVersion), within the window before it, after the last release of the budget, and in its
    pool when the budget is counted per label (*pool* not None)."""
    records = list(records)
    since, after = own.at - window_s - RESOLUTION_S, released_rv(records, RELEASE_ALL)
    return sum(
        1
        for r in records
        if r.kind == MARK and after < r.rv <= own.rv and r.at > since and (pool is None or r.pool == pool)
    )


def budget_spent(records: Iterable[Record], now: float, window_s: float, pool: str | None) -> int:
    """Mark records in the window before *now* (the cheap look before this node writes its own)."""
    records = list(records)
    since, after = now - window_s - RESOLUTION_S, released_rv(records, RELEASE_ALL)
    return sum(
        1
        for r in records
        if r.kind == MARK and r.rv > after and r.at > since and (pool is None or r.pool == pool)
    )


def budget_hold(count: int, limit: int, policy: BudgetPolicy, key: str, pool: str | None) -> Hold | None:
    """Held when the count (this node's own mark included, when it has one) is over the limit."""
    if count <= limit:
        return None
    where = f" in {policy.per_label}={pool}" if pool is not None else ""
    return Hold(
        BUDGET_HELD,
        key,
        f"the repair budget is spent: {count - 1} GPU nodes{where} newly marked for remediation in the "
        f"last {policy.window_s / 60:g} min, the limit is {limit} (node.repairBudget)",
    )


def expired(records: Iterable[Record], now: float, keep_s: float) -> list[Record]:
    """Mark and release records older than *keep_s*: whoever lists them deletes them."""
    return [r for r in records if r.kind in (MARK, RELEASE) and now - r.at > keep_s]


__all__ = [
    "BUDGET_HELD",
    "FAIL",
    "MARK",
    "RELEASE",
    "RELEASE_ALL",
    "WAVE_HELD",
    "BudgetPolicy",
    "Hold",
    "Record",
    "RecordKeys",
    "WavePolicy",
    "budget_count",
    "budget_hold",
    "budget_limit",
    "budget_spent",
    "expired",
    "finding_key",
    "key_slug",
    "released_rv",
    "wave_decision",
    "wave_nodes",
    "wave_threshold",
]
