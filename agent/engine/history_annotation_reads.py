"""What the engine reads of the Node's history annotation (core/history_annotation.py): the key a
verdict is recorded under, the replace escalation of a finding that failed again after repairs
(core/repair_escalation.py) and the risk label (core/node_risk.py), read from the Node as the engine
sees it (the writer's watched copy: no request of its own)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.config import Config
from agent.core.findings import CheckResult, Verdict
from agent.core.history_annotation import parse
from agent.core.node import NodeObject
from agent.core.node_keys import Keys
from agent.core.node_risk import risk_now
from agent.core.probed import Probed
from agent.core.repair_escalation import escalate, key_of
from agent.core.severity import Severity, Status


def history_key(verdict: Verdict) -> str:
    """The worst finding's key of a fail or warn; "" for pass and unknown (an unknown cycle's
    changing list of checks that could not look would only churn the history)."""
    worst = verdict.worst
    if verdict.status not in (Status.FAIL, Status.WARN) or worst is None or worst.severity <= Severity.NONE:
        return ""
    return key_of(worst)


def repair_escalation(
    results: Sequence[CheckResult],
    node: Probed[NodeObject],
    cfg: Config,
    boot: str | None,
    now_s: float,
    cleared_now: bool,
) -> list[CheckResult]:
    """node.repairHistory over the Node's `<prefix>/history` (core/repair_escalation.escalate)."""
    raw = node.annotations.get(Keys(cfg.prefix).history) if isinstance(node, NodeObject) else None
    policy = cfg.node.repair_history
    return escalate(results, raw, policy, boot=boot, now_s=now_s, cleared_now=cleared_now)


def risk_label(
    node: Probed[NodeObject], cfg: Config, status: Status, boot: str | None, now: str, cleared_now: bool
) -> str:
    """node.risk over the Node's history counts and this verdict's transition (core/node_risk.py);
    "" (leave the label) where the Node was not read."""
    if not isinstance(node, NodeObject):
        return ""
    raw = node.annotations.get(Keys(cfg.prefix).history)
    return risk_now(
        raw,
        parse(raw),
        status=status.value,
        boot=boot,
        cleared=cleared_now,
        now=now,
        policy=cfg.node.risk,
    )


__all__ = ["history_key", "repair_escalation", "risk_label"]
