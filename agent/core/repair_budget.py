"""The repair budget and the correlated-wave hold (DESIGN.md §6.2, §6.3): pure decisions over records.

The brake caps how many nodes carry our taint at once; a repair engine deletes a marked node and
frees its slot. These two rules bound what the engines may *newly* be asked to repair:

- The budget: at most `limit` nodes may newly turn a remediation condition unhealthy per window
  (the smaller of maxNodes and maxFraction of the GPU nodes, at least one), optionally counted per
  value of a node label (a pool, a zone). Each new mark leaves a record that outlives the Node, so
  a node the engine deleted still counts until the window has passed. What counts is distinct
  nodes, not records: a node's marks count once (any agent may write marks of its own node).
- The wave hold: when at least `threshold` nodes newly failed on the same finding key (rule plus
  code: `xid/79`, `gpu.responsive/timeout`) within one stretch of `window_s`, new marks for that key
  are held fleet-wide. The hold lasts while that many nodes still fail on the key (a node that
  recovers, or whose Node is gone, no longer counts), or until an operator releases it
  (`gpu-healthcheck brake release`): records from before a release do not count. A wave marker
  (written by the node whose full count found the wave) holds the other nodes only on its quorum:
  while at least minNodes distinct nodes have a fail record of the key; short of it, a marker holds
  back only its own node.

Records are ordered by resourceVersion (the API server's global write order): a node that created
its mark record counts every record written before its own, so racing agents agree without a lock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import unique
from fractions import Fraction
from typing import Any

from agent.core.findings import Finding
from agent.core.marks import Marks
from agent.core.record_kind import RecordKind
from agent.core.remediation_reasons import is_eks_reason
from agent.core.remediation_types import UNHEALTHY_REMEDIATION_REASONS
from agent.core.vocabulary import Vocabulary

RELEASE_ALL = ""  # a release without --key: every wave hold, and the budget's window
# creationTimestamp has whole seconds: a mark counts one second longer than its window (safe side).
RESOLUTION_S = 1.0


@unique
class HoldReason(Vocabulary):
    """Why a new remediation mark is held (the remediation_held metric's `reason` label)."""

    BUDGET = "budget"
    WAVE = "wave"


@dataclass(frozen=True)
class RecordKeys:
    """The records' label (the kind) and annotations (names may be longer than a label value)."""

    prefix: str

    @property
    def kind(self) -> str:
        return f"{self.prefix}/record"

    @property
    def key_label(self) -> str:
        """The finding key's slug as a label (fail records, wave markers): one key's records listed alone."""
        return f"{self.prefix}/record-key"

    @property
    def window_label(self) -> str:
        """A mark's window bucket (its writer's clock // the window): lists return the marks that
        can still count, not every mark a repaired Node left behind."""
        return f"{self.prefix}/window"

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
    kind: RecordKind
    node: str = ""
    key: str = ""
    pool: str = ""
    at: float = 0.0
    rv: int = 0
    by: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Hold:
    """A new mark held back: why, for which key, in words."""

    why: HoldReason
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
    return max(
        (r.rv for r in records if r.kind == RecordKind.RELEASE and r.key in (RELEASE_ALL, key)), default=0
    )


def wave_nodes(records: Iterable[Record], key: str, failing: set[str], after_rv: int) -> list[Record]:
    """The fail records of *key* that count: of nodes failing now, written after *after_rv* (a
    release), one per node (the earliest)."""
    first: dict[str, Record] = {}
    for r in sorted(records, key=lambda r: (r.at, r.rv)):
        if r.kind == RecordKind.FAIL and r.key == key and r.node in failing and r.rv > after_rv:
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
                HoldReason.WAVE,
                key,
                f"{len(nodes)} GPU nodes fail on {key} (at least {need} of {total} newly failed within "
                f"{policy.window_s / 60:g} min): a correlated wave, new remediation marks for it are "
                "held until it ends or `gpu-healthcheck brake release` (node.waveHold)",
            )
    return None


def _marked_nodes(records: Iterable[Record], since: float, upto_rv: int | None, pool: str | None) -> set[str]:
    """The distinct nodes with a mark in the window (written after *since*), after the last release of
    the budget, at or before *upto_rv* (None: any), in *pool* when the budget is counted per label: a
    node counts once however many marks it wrote (one identity holds back no more than its share)."""
    records = list(records)
    after = released_rv(records, RELEASE_ALL)
    return {
        r.node
        for r in records
        if r.kind == RecordKind.MARK
        and r.rv > after
        and (upto_rv is None or r.rv <= upto_rv)
        and r.at > since
        and (pool is None or r.pool == pool)
    }


def budget_count(records: Iterable[Record], own: Record, window_s: float, pool: str | None) -> int:
    """Distinct nodes marked against *own* (its node included, once): with a mark written at or before
    it (by resourceVersion: racing agents agree), within the window before it, after the last release
    of the budget, and in its pool when the budget is counted per label (*pool* not None)."""
    return len(_marked_nodes(records, own.at - window_s - RESOLUTION_S, own.rv, pool) | {own.node})


def budget_spent(
    records: Iterable[Record], now: float, window_s: float, pool: str | None, node: str = ""
) -> int:
    """Distinct nodes other than *node* with a mark in the window before *now* (the cheap look before
    this node writes its own: *node* is the one it adds)."""
    return len(_marked_nodes(records, now - window_s - RESOLUTION_S, None, pool) - {node})


def quorum_met(
    fails: Iterable[Record], key: str, after_rv: int, min_nodes: int, complete: bool
) -> bool | None:
    """Whether the wave markers of *key* stand on their quorum: at least *min_nodes* distinct nodes
    with a fail record of the key written after its last release (True); fewer in a complete list
    (False); fewer in a list cut at its bound (None: not known, the full count decides). One node's
    records make no quorum: a marker is anyone's to write for its own node."""
    nodes = {r.node for r in fails if r.kind == RecordKind.FAIL and r.key == key and r.rv > after_rv}
    if len(nodes) >= min_nodes:
        return True
    return False if complete else None


def markers_holding(standing: Iterable[Record], node: str, quorum: bool) -> list[Record]:
    """The standing wave markers that hold *node*: every one while their quorum stands, else only
    *node*'s own (a node's records may hold back only that node)."""
    return [m for m in standing if quorum or m.node == node]


def budget_hold(count: int, limit: int, policy: BudgetPolicy, key: str, pool: str | None) -> Hold | None:
    """Held when the count (this node's own mark included, when it has one) is over the limit."""
    if count <= limit:
        return None
    where = f" in {policy.per_label}={pool}" if pool is not None else ""
    return Hold(
        HoldReason.BUDGET,
        key,
        f"the repair budget is spent: {count - 1} GPU nodes{where} newly marked for remediation in the "
        f"last {policy.window_s / 60:g} min, the limit is {limit} (node.repairBudget)",
    )


def expired(records: Iterable[Record], now: float, keep_s: float) -> list[Record]:
    """Mark and release records older than *keep_s*: whoever lists them deletes them."""
    return [r for r in records if r.kind in (RecordKind.MARK, RecordKind.RELEASE) and now - r.at > keep_s]


def newly_marking(node: Mapping[str, Any], marks: Marks, taint_on: bool) -> str | None:
    """Pure: the finding key when this apply would turn a remediation condition unhealthy on a Node
    that shows none of ours unhealthy yet (a new mark), else None (no wish, no taint, or marked
    already: a node already marked stays marked, the budget limits new marks only). Ours unhealthy:
    any condition with a reason we write only with the unhealthy status (UNHEALTHY_REMEDIATION_REASONS),
    so that a renamed or an added entry on a marked node is no new mark; or, for the EKS agent's
    reasons (`reasonStyle: eks`, not ours alone), a configured entry at its unhealthy status with one."""
    wished = [m for m in marks.remediation if m.unhealthy]
    if not wished or not taint_on:
        return None
    conditions = (node.get("status") or {}).get("conditions") or ()
    if any(c.get("reason") in UNHEALTHY_REMEDIATION_REASONS for c in conditions):
        return None
    unhealthy = {(m.type, m.unhealthy_status) for m in marks.remediation}
    if any(
        (c.get("type"), c.get("status")) in unhealthy and is_eks_reason(str(c.get("reason") or ""))
        for c in conditions
    ):
        return None
    return wished[0].key or "unknown"


__all__ = [
    "RELEASE_ALL",
    "BudgetPolicy",
    "Hold",
    "HoldReason",
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
    "markers_holding",
    "newly_marking",
    "quorum_met",
    "released_rv",
    "wave_decision",
    "wave_nodes",
    "wave_threshold",
]
