"""Every check, in report order: the checks each module declares, and the rules they own."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from agent.checks import (
    CheckSpec,
    connectx,
    dcgm,
    dcgm_peers,
    dcgm_suspect,
    dra_taints,
    efa,
    gpu,
    gpu_peers,
    gpu_stall,
    host,
    nvlink,
    nvlink_errors,
    nvlink_speed,
    pci,
    sdc,
    topology,
    trends,
    xid,
)
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult
from agent.core.node_keys import EventReason
from agent.core.rules import Rule, RuleBook

# Report order. A new check is a module that declares its CHECKS (name, function, inputs, tier and
# the severity rules it owns) and one line here.
CHECKS: tuple[CheckSpec, ...] = (
    *gpu.CHECKS,
    *dra_taints.CHECKS,  # the DRA driver's own device taints, beside ours
    *trends.CHECKS,
    *gpu_stall.CHECKS,
    *gpu_peers.CHECKS,  # the odd GPU out under work (core/peers.py)
    *xid.CHECKS,
    *nvlink.CHECKS,
    *nvlink_speed.CHECKS,
    *nvlink_errors.CHECKS,
    *topology.CHECKS,
    *efa.CHECKS,
    *connectx.CHECKS,
    *pci.CHECKS,
    *host.CHECKS,
    *dcgm.CHECKS,
    *dcgm_peers.CHECKS,  # the odd GPU out in the diag's figures
    *sdc.CHECKS,  # the odd GPU out in the SDC probe's outputs, bit for bit
    *dcgm_suspect.CHECKS,
)
RULES: dict[str, Rule] = {rule.name: rule for spec in CHECKS for rule in spec.rules}
# The checks that post an Event on a new finding (CheckSpec.event): check name → reason.
CHECK_EVENTS: dict[str, EventReason] = {spec.name: spec.event for spec in CHECKS if spec.event is not None}
# What config.yaml may name under `checks:` and `severities:` (the loader checks every name).
RULE_BOOK = RuleBook(checks=tuple(spec.name for spec in CHECKS), rules=RULES)
BY_NAME = {spec.name: spec for spec in CHECKS}


def select(only: Iterable[str] | None, cfg: Config) -> list[CheckSpec]:
    """Checks to run: `only` entries may be names ("gpu.ecc") or prefixes ("gpu"); disabled ones drop out."""
    specs = [s for s in CHECKS if cfg.enabled(s.name)]
    if not only:
        return specs
    wanted = list(only)
    unknown = [w for w in wanted if not any(s.name == w or s.name.startswith(w + ".") for s in CHECKS)]
    if unknown:
        raise KeyError(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [s for s in specs if any(s.name == w or s.name.startswith(w + ".") for w in wanted)]


def needed_inputs(specs: Iterable[CheckSpec]) -> set[Input]:
    return {i for s in specs for i in s.inputs}


def after_checks(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The pure steps over every check's result, before the verdict (the agent's, `check`'s): the
    DRA driver's device taints joined with our own findings on the same GPU (dra_taints.corroborate)."""
    return dra_taints.corroborate(results)


def run_checks(specs: Iterable[CheckSpec], facts: NodeFacts, cfg: Config) -> list[CheckResult]:
    """Run each check; a bug in one check becomes that check's `unknown`, never a crash of the rest."""
    results = []
    for spec in specs:
        started = time.perf_counter()
        try:
            result = spec.fn(facts, cfg)
        except Exception as exc:  # a check is pure code: an exception is our bug, not the GPU's
            result = CheckResult(spec.name, unknown=f"internal error in check: {type(exc).__name__}: {exc}")
        results.append(replace(result, duration_ms=(time.perf_counter() - started) * 1000.0))
    return results
