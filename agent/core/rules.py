"""A severity rule: the knob a check turns (overridable under `severities:` in config.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.core.actions import Action
from agent.core.severity import Severity


@dataclass(frozen=True)
class Rule:
    name: str  # "<check>.<what>", e.g. "gpu.ecc.dram-uncorrectable"
    severity: Severity  # the default
    text: str  # what it means, for `gpu-healthcheck rules`
    action: Action | None = None  # the step that fixes it, where its severity does not say it
    max_severity: Severity = Severity.ISOLATE  # the most `severities:` may make it (trends: monitor)
    # A transient can trip it (a read that timed out, a link caught retraining): a finding at reset
    # or above fails the node only after node.confirmAfter consecutive runs of its check
    # (engine/confirm.py). Never set on what the input states plainly (an Xid line, an ECC count).
    confirm: bool = False


@dataclass(frozen=True)
class RuleBook:
    """The checks and rules the registry holds: what a config may switch and override."""

    checks: tuple[str, ...]
    rules: Mapping[str, Rule]
