"""Repair history: a node that fails again on the same finding key after `node.repairHistory.count`
repairs within `windowDays` (default 2 in 7 days) will not be fixed by one more: the finding's
recommendation becomes `service` (replace), "failed again after repair".

What counts, read from the Node's own history (core/history_annotation.py), so that it survives a
restart or replacement of the agent and starts afresh with a new Node object:
- a *marked fail* on key K: an entry failing on K while our taint or a remediation mark was on
  (an engine or a human had reason to repair it);
- a *repair* of it: a later entry showing a new boot (a reboot, a reimage, a machine replaced under
  the same Node object) or an operator's `clear`, before the node fails on K again;
- it counts once the node fails on K again (in a later entry, or now), when the repair (the time of
  the entry that shows it; now for one seen only now) lies within the window.
An agent restart (a rollout) changes neither the boot nor the state: it is no repair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from agent.core.actions import Action
from agent.core.findings import CheckResult, Finding
from agent.core.history_annotation import KEY_MAX, Entry, parse, short_boot
from agent.core.repair_budget import finding_key
from agent.core.severity import Severity, Status
from agent.core.text import shorten

DAY_S = 86400.0
FAILED_AGAIN = "failed again after repair"


@dataclass(frozen=True)
class RepairPolicy:
    """node.repairHistory."""

    count: int = 2  # repairs before the replace escalation (0 = off)
    window_s: float = 7 * DAY_S


def key_of(finding: Finding) -> str:
    """The key the history records a finding under: its own key (the GPU in it), else its rule's."""
    return shorten(finding.key or finding_key(finding), KEY_MAX)


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def repairs(
    entries: Sequence[Entry], key: str, *, boot: str | None, now_s: float, window_s: float, cleared_now: bool
) -> int:
    """How many repairs of *key* within the window the node failed again after, counting the failure
    now (on *boot*, after a clear acted on now when *cleared_now*)."""
    key = shorten(key, KEY_MAX)
    now = Entry(at="", status=Status.FAIL.value, key=key, boot=short_boot(boot), did="clear" * cleared_now)
    last = entries[-1] if entries else None
    seq = list(entries)
    if cleared_now or last is None or (last.status, last.key, last.boot) != (now.status, now.key, now.boot):
        seq.append(now)
    count = 0
    marked_boot: str | None = None  # the boot of the last marked fail on key, while no repair followed
    repaired_at: float | None = None
    for e in seq:
        at = now_s if e is now else _epoch(e.at)
        repaired = e.cleared or bool(e.boot and e.boot != marked_boot)
        if marked_boot is not None and repaired_at is None and repaired:
            repaired_at = at if at is not None else 0.0  # an unreadable time is outside any window
        if e.status == Status.FAIL.value and e.key == key:
            if repaired_at is not None:
                count += repaired_at >= now_s - window_s
                repaired_at = None
            marked_boot = e.boot if e.marked else None
    return count


def escalate(
    results: Sequence[CheckResult],
    history: str | None,
    policy: RepairPolicy,
    *,
    boot: str | None,
    now_s: float,
    cleared_now: bool = False,
) -> list[CheckResult]:
    """Pure: each failing finding whose key failed again after `policy.count` repairs within the
    window recommends `service` (replace), its message saying so. *history*: the annotation."""
    failing = [f for r in results for f in r.findings if f.severity >= Severity.RESET]
    if policy.count <= 0 or not failing or not history:
        return list(results)
    entries = parse(history)
    out = []
    for res in results:
        findings = []
        for f in res.findings:
            if f.severity >= Severity.RESET and f.recommendation.action is not Action.SERVICE:
                n = repairs(
                    entries,
                    key_of(f),
                    boot=boot,
                    now_s=now_s,
                    window_s=policy.window_s,
                    cleared_now=cleared_now,
                )
                if n >= policy.count:
                    days = f"{policy.window_s / DAY_S:g}"
                    note = f"{FAILED_AGAIN}: {n} repair(s) within {days} d"
                    f = replace(f, message=f"{f.message} ({note})", action=Action.SERVICE)
            findings.append(f)
        changed = any(a is not b for a, b in zip(findings, res.findings, strict=True))
        out.append(replace(res, findings=tuple(findings)) if changed else res)
    return out


__all__ = ["FAILED_AGAIN", "RepairPolicy", "escalate", "key_of", "repairs"]
