"""Checks: pure functions NodeFacts × Config → CheckResult. The registry maps check names to them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from agent.config import Config
from agent.facts import NodeFacts
from agent.findings import CheckResult
from agent.probes.result import NotCaptured, ProbeError

CheckFn = Callable[[NodeFacts, Config], CheckResult]
T = TypeVar("T")


def input_gap(name: str, probed: object) -> CheckResult | None:
    """The result for a check whose input is missing (skipped) or unreadable (unknown), else None."""
    if isinstance(probed, NotCaptured):
        return CheckResult(name, skipped=f"{probed.source} not captured")
    if isinstance(probed, ProbeError):
        return CheckResult(name, unknown=f"could not read {probed.source}: {probed.message}")
    return None
