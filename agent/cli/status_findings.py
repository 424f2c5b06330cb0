"""`gpu-healthcheck status`: what a node's results annotation says is worst (the WORST FINDING and
NEXT STEP columns) and its GPUs' early warnings (the WARN column)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.severity import Severity
from agent.core.text import shorten

CHECK_STATUS_RANK = {"fail": 3, "unknown": 2, "warn": 1}
FINDING_WIDTH = 80


def severity_of(text: Any) -> Severity:
    try:
        return Severity.parse(str(text))
    except ValueError:
        return Severity.NONE


def worst_finding(results: Mapping[str, Any] | None) -> str:
    """The message of the most severe non-passing check (then latched finding), or "-"."""
    return _worst(results)[0]


def next_step(results: Mapping[str, Any] | None) -> str:
    """The worst finding's next step and escalation ("reboot (then: service)"), or "-"."""
    return _worst(results)[1]


def _step(entry: Mapping[str, Any]) -> str:
    action = entry.get("action")
    if not action:
        return "-"
    then = entry.get("escalation")  # checks and latches alike (core/actions.Recommendation.as_dict)
    if isinstance(then, list) and then:
        return f"{action} (then: {', '.join(map(str, then))})"
    return str(action)


def _worst(results: Mapping[str, Any] | None) -> tuple[str, str]:
    if not results:
        return "-", "-"
    best: tuple[int, int] | None = None
    text, step = "-", "-"
    for c in results.get("checks") or ():
        if not isinstance(c, Mapping):
            continue
        rank = CHECK_STATUS_RANK.get(str(c.get("status")), 0)
        if rank == 0:
            continue
        key = (int(severity_of(c.get("severity"))), rank)
        if best is None or key > best:
            best, text, step = key, f"{c.get('name', '?')}: {c.get('message', '')}", _step(c)
    for latch in results.get("latched") or ():
        if not isinstance(latch, Mapping):
            continue
        key = (int(severity_of(latch.get("severity"))), 3)
        if best is None or key > best:
            best, text = key, f"{latch.get('check', '?')}: {latch.get('message', '')} (latched)"
            step = _step(latch)
    text = " ".join(text.split())
    return shorten(text, FINDING_WIDTH), step


def gpu_warnings(results: Mapping[str, Any] | None) -> tuple[int, int, dict[str, int]]:
    """(GPUs with a warning before a fault, GPUs listed, GPUs per trend rule) from the results
    annotation's verdict per GPU (engine/gpu_verdicts.py)."""
    entries = [e for e in (results or {}).get("gpus") or () if isinstance(e, Mapping)]
    per_rule: dict[str, int] = {}
    warned = 0
    for entry in entries:
        by_step = entry.get("warnings")
        rules = {
            str(rule)
            for step in (by_step.values() if isinstance(by_step, Mapping) else ())
            if isinstance(step, Mapping)
            for rule in step
        }
        warned += bool(rules)
        for rule in rules:
            per_rule[rule] = per_rule.get(rule, 0) + 1
    return warned, len(entries), dict(sorted(per_rule.items()))


__all__ = ["CHECK_STATUS_RANK", "FINDING_WIDTH", "gpu_warnings", "next_step", "severity_of", "worst_finding"]
