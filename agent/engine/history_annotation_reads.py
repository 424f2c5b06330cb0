"""What the engine reads of the Node's history annotation (core/history_annotation.py): the key a
verdict is recorded under, the replace escalation of a finding that failed again after repairs
(core/repair_escalation.py) and the risk label and each GPU's risk (core/node_risk.py), read from the
Node as the engine sees it (the writer's watched copy: no request of its own)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.config import Config
from agent.core.device_scope import ISOLATION_NODE, confined_scope
from agent.core.findings import CheckResult, Verdict
from agent.core.history_annotation import HistoryTaint, parse, parse_isolated
from agent.core.node import NodeObject
from agent.core.node_keys import DISABLED, MODE_TAINT, Keys
from agent.core.node_risk import HIGH, outlook_now
from agent.core.pci import normalize_pci, short_pci
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


class RiskInputs(Protocol):
    """What the risk reads of one evaluation (engine/marks_builder.Decided)."""

    @property
    def node(self) -> Probed[NodeObject]: ...
    @property
    def wanted(self) -> bool: ...
    @property
    def results(self) -> Sequence[CheckResult]: ...
    @property
    def inventory(self) -> Any: ...
    @property
    def gpus(self) -> list[dict[str, Any]]: ...
    @property
    def checked_at(self) -> str: ...
    @property
    def cleared(self) -> bool: ...


@dataclass(frozen=True)
class Risk:
    """The risk label ("" leaves it: the Node was not read) and the per-GPU verdicts with `risk: high`
    on each high-risk GPU (engine/gpu_verdicts.py)."""

    node: str
    gpus: list[dict[str, Any]]


def expected_isolation(raw: str | None, d: RiskInputs, cfg: Config) -> tuple[str, ...]:
    """The GPUs the device-taint writer (reporters/device_isolation.py) will hold after this verdict,
    as the engine can tell: the episode's so far and the scope's, where the taint is confined to GPUs
    the DRA driver publishes; () where it goes on the Node. Where the writer finds otherwise (a brake
    that holds, a DeviceTaintRule API not served), the next verdict reads what it recorded."""
    policy = cfg.node
    if policy.mode != MODE_TAINT or policy.isolation == ISOLATION_NODE or not d.wanted:
        return ()
    opt_out = d.node.labels.get(Keys(cfg.prefix).taint_opt_out) if isinstance(d.node, NodeObject) else None
    if (opt_out or "").strip().lower() == DISABLED:  # as reporters/node_patch.taint_disabled reads it
        return ()
    before, entries = parse_isolated(raw), parse(raw)
    if entries and entries[-1].taint == HistoryTaint.ON and not before:
        return ()  # this taint episode is node-wide (the writer keeps it so until it ends)
    scope = confined_scope(d.results, d.inventory, policy.taint_min_severity)
    if scope is None:
        return before  # recovering, or unknown: the rules stay
    published = {normalize_pci(str(g["pci"])) for g in d.gpus if g.get("dra") and g.get("pci")}
    if scope.node_wide or not set(scope.gpus) <= published:
        return ()
    return tuple(sorted({*before, *(short_pci(p) for p in scope.gpus)}))


def risk_outlook(d: RiskInputs, cfg: Config, status: Status, boot: str | None) -> Risk:
    """node.risk over the Node's history counts and this verdict's transition (core/node_risk.py):
    the node's label, and each GPU's, shown in its per-GPU verdict."""
    if not isinstance(d.node, NodeObject):
        return Risk("", d.gpus)
    raw = d.node.annotations.get(Keys(cfg.prefix).history)
    seen = outlook_now(
        raw,
        parse(raw),
        status=status.value,
        boot=boot,
        cleared=d.cleared,
        now=d.checked_at,
        policy=cfg.node.risk,
        isolated=expected_isolation(raw, d, cfg),
    )
    high = set(seen.high_gpus)
    gpus = [{**g, "risk": HIGH} if g.get("pci") and short_pci(str(g["pci"])) in high else g for g in d.gpus]
    return Risk(seen.node, gpus)


__all__ = ["Risk", "RiskInputs", "expected_isolation", "history_key", "repair_escalation", "risk_outlook"]
