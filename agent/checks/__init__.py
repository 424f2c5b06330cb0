"""Checks: pure functions NodeFacts × Config → CheckResult. The registry maps check names to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.probed import NotCaptured, ProbeError
from agent.core.rules import Rule

CheckFn = Callable[[NodeFacts, Config], CheckResult]
T = TypeVar("T")


def input_gap(name: str, probed: object) -> CheckResult | None:
    """The result for a check whose input is missing (skipped) or unreadable (unknown), else None."""
    if isinstance(probed, NotCaptured):
        return CheckResult(name, skipped=f"{probed.source} not captured")
    if isinstance(probed, ProbeError):
        return CheckResult(name, unknown=f"could not read {probed.source}: {probed.message}")
    return None


def rule_finding(
    cfg: Config, check: str, rule: Rule, message: str, entities: tuple[str, ...] = (), key: str = ""
) -> Finding:
    """A level-triggered finding whose severity is the configured one for `rule`; key `rule/<key>`."""
    return Finding(
        check=check,
        rule=rule.name,
        severity=cfg.severity(rule),
        message=message,
        entities=entities,
        key=f"{rule.name}/{key}" if key else rule.name,
    )


@dataclass(frozen=True)
class CheckSpec:
    """A check as the registry lists it: its name (also its `checks:` switch in config.yaml), the
    function, the inputs it reads (so `--only` probes no more than needed), the agent tier that runs
    it (gpu, xid, efa, topology, dcgm-health, dcgm-diag) and the severity rules it owns."""

    name: str
    fn: CheckFn
    inputs: tuple[Input, ...]
    tier: str
    rules: tuple[Rule, ...] = ()
