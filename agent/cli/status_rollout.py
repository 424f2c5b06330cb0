"""`gpu-healthcheck status`'s rollout view: which config each node runs, and what mode `taint` would
do there (the results annotation's `config` and `would` fields, engine/rollout.py).

While nodes run mode observe or label, the table adds WOULD TAINT and WOULD MARK and a line per
mode under it ("observe: 3 nodes would be tainted, 2 would be marked for remediation"; in mode taint
"… (6 tainted), 1 marked for remediation, 5 held", from the Nodes' conditions); `-o wide`
always shows them, with MODE and CONFIG (main or canary, and the digest of its files), and a line
counts the nodes per config so that a canary's spread is seen at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.core.node_keys import MODE_LABEL, MODE_OBSERVE, MODES
from agent.core.remediation_types import RemediationReason
from agent.core.results_doc import CONFIG_FIELD, WOULD_FIELD

WOULD_HEADER = ("WOULD TAINT", "WOULD MARK")
# What a remediation condition says on a node that would be marked, in mode taint (NodeStatus.marked):
MARKED, HELD, PENDING = "marked", "held", "pending"
# A condition of ours at its healthy status although the node fails: a hold (the repair budget, a
# wave, the brake, `<prefix>/taint=disabled`); any other healthy reason: the mark is not written yet.
HOLD_REASONS = (
    RemediationReason.BUDGET_HELD,
    RemediationReason.WAVE_HELD,
    RemediationReason.BRAKE_HELD,
    RemediationReason.TAINT_DISABLED,
)
HEALTHY_REASONS = (
    *HOLD_REASONS,
    RemediationReason.PASSED,
    RemediationReason.BELOW_MIN_SEVERITY,
    RemediationReason.COULD_NOT_CHECK,
    RemediationReason.NOT_ENFORCED,
)
CONFIG_HEADER = ("MODE", "CONFIG")
SHADOW_MODES = (MODE_OBSERVE, MODE_LABEL)  # modes in which "would" differs from "does"


@dataclass(frozen=True)
class Rollout:
    """One node's config in force and what mode `taint` would do there (its JSON form too)."""

    config: str  # main | canary | last-good | shipped
    configDigest: str
    mode: str  # observe | label | taint
    wouldTaint: str | None = None  # "reboot:NoExecute": mode taint's taint, before the brake
    wouldMark: list[str] = field(default_factory=list)  # remediation condition types it would mark

    @property
    def cells(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """(WOULD TAINT, WOULD MARK), (MODE, CONFIG)."""
        would = (self.wouldTaint or "-", ",".join(self.wouldMark) or "-")
        return would, (self.mode, f"{self.config}@{self.configDigest or '-'}")


def rollout_of(results: Mapping[str, Any] | None) -> Rollout | None:
    """From the results annotation; None when it has no `config` (an agent older than this field)."""
    cfg = (results or {}).get(CONFIG_FIELD)
    if not isinstance(cfg, Mapping):
        return None
    would = (results or {}).get(WOULD_FIELD)
    would = would if isinstance(would, Mapping) else {}
    mark = would.get("mark")
    return Rollout(
        config=str(cfg.get("source") or "-"),
        configDigest=str(cfg.get("digest") or ""),
        mode=str(cfg.get("mode") or "-"),
        wouldTaint=str(would["taint"]) if would.get("taint") else None,
        wouldMark=[str(m) for m in mark] if isinstance(mark, list) else [],
    )


def mark_state(rollout: Rollout | None, conditions: Sequence[Mapping[str, Any]]) -> str | None:
    """Whether a node that would be marked is: MARKED (a condition it would mark carries an unhealthy
    reason: ours, or an EKS-style one), HELD (a hold's reason), PENDING (not written yet); None when
    it would mark nothing. *conditions*: the Node's status.conditions."""
    if rollout is None or not rollout.wouldMark:
        return None
    reasons = [str(c.get("reason")) for c in conditions if c.get("type") in rollout.wouldMark]
    if any(r not in HEALTHY_REASONS for r in reasons):
        return MARKED
    return HELD if any(r in HOLD_REASONS for r in reasons) else PENDING


def shows_would(rollouts: Sequence[Rollout | None]) -> bool:
    """The table adds the WOULD columns while any node runs a shadow mode."""
    return any(r is not None and r.mode in SHADOW_MODES for r in rollouts)


def _nodes(n: int) -> str:
    return f"{n} node{'' if n == 1 else 's'}"


def summary_lines(nodes: Sequence[tuple[Rollout | None, bool, str | None]]) -> list[str]:
    """Per mode: how many nodes would be tainted and marked for remediation; in mode taint, how many
    are tainted (the brake or `<prefix>/taint=disabled` holds back the rest) and how many are marked
    and held (the repair budget, a wave hold, the brake): "1 marked for remediation, 5 held", never
    "6 would be marked" for nodes a hold keeps unmarked. *nodes*: (rollout, carries our taint,
    mark_state). Then the configs in force when they are not one and the same."""
    lines = []
    for mode in MODES:
        here = [(r, tainted, m) for r, tainted, m in nodes if r is not None and r.mode == mode]
        if not here:
            continue
        taint = sum(r.wouldTaint is not None for r, _, _ in here)
        if mode in SHADOW_MODES:
            are = ""
            marks = f"{sum(bool(r.wouldMark) for r, _, _ in here)} would be marked for remediation"
        else:
            are = f" ({sum(t for _, t, _ in here)} tainted)"
            states = [m for _, _, m in here]
            marks = f"{states.count(MARKED)} marked for remediation, {states.count(HELD)} held"
            if states.count(PENDING):
                marks += f", {states.count(PENDING)} not yet marked"
        lines.append(f"{mode} ({_nodes(len(here))}): {_nodes(taint)} would be tainted{are}, {marks}")
    configs: dict[str, int] = {}
    for r, _, _ in nodes:
        if r is not None:
            key = f"{r.config}@{r.configDigest or '-'}"
            configs[key] = configs.get(key, 0) + 1
    if len(configs) > 1 or any(not k.startswith("main@") for k in configs):
        lines.append("configs: " + ", ".join(f"{k} on {_nodes(n)}" for k, n in sorted(configs.items())))
    return lines


__all__ = [
    "CONFIG_HEADER",
    "HELD",
    "MARKED",
    "PENDING",
    "WOULD_HEADER",
    "Rollout",
    "mark_state",
    "rollout_of",
    "shows_would",
    "summary_lines",
]
