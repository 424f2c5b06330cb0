"""Checks: pure functions NodeFacts × Config → CheckResult. The registry maps check names to them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.node_keys import EventReason
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


def readable(probed: object, kind: type[T]) -> tuple[T | None, str | None]:
    """The part of an input a check can judge, and why it is not the whole input (or None).

    A full read is judged whole. An unreadable capture whose parser kept its intact part
    (ProbeError.partial) is judged on that part: a fault it states plainly is reported, and the
    check is also `unknown` with the returned reason, since the rest could not be looked at.
    Anything else gives (None, None): the caller falls back to input_gap."""
    if isinstance(probed, kind):
        return probed, None
    if isinstance(probed, ProbeError) and isinstance(probed.partial, kind):
        return probed.partial, f"could not read all of {probed.source}: {probed.message}"
    return None, None


def typed_input(name: str, probed: object, kind: type[T]) -> T | CheckResult:
    """The input as the check judges it, else the result of its gap: skipped (not captured) or
    unknown (unreadable). A check begins `x = typed_input(NAME, facts.x, X)` and returns x when it is
    a CheckResult. Another type is our bug, not the machine's: it raises (the registry reports it)."""
    return probed if isinstance(probed, kind) else _gap(name, probed, kind)


def partial_input(name: str, probed: object, kind: type[T]) -> tuple[T, str | None] | CheckResult:
    """As typed_input, but a damaged capture's intact part is judged too (readable): the input and
    why it is not the whole input (None when it is), else the result of its gap."""
    part, unreadable = readable(probed, kind)
    if part is not None:
        return part, unreadable
    return _gap(name, probed, kind)


def _gap(name: str, probed: object, kind: type) -> CheckResult:
    gap = input_gap(name, probed)
    if gap is None:
        raise TypeError(f"{name}: a {type(probed).__name__} where {kind.__name__} was read")
    return gap


def rule_finding(
    cfg: Config,
    check: str,
    rule: Rule,
    message: str,
    entities: tuple[str, ...] = (),
    key: str = "",
    evidence: tuple[Evidence, ...] = (),
    *,
    latched: bool = False,
    whole_key: str = "",
) -> Finding:
    """A finding whose severity is the configured one for `rule`; key `rule/<key>`, or *whole_key*
    where the finding's name is not its rule's (a DCGM diag test's latch, an Xid's: the name an
    operator clears it by). Level-triggered, or *latched* until its cause is gone (core/findings.py)."""
    return Finding(
        check=check,
        rule=rule.name,
        severity=cfg.severity(rule),
        message=message,
        entities=entities,
        key=whole_key or (f"{rule.name}/{key}" if key else rule.name),
        latched=latched,
        evidence=evidence,
        action=rule.action,
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
    # The Event a new finding of this check posts on the Node (once per finding, not again while it
    # lasts: engine/side_step.finding_events); None: none.
    event: EventReason | None = None


def gpu_finding(
    cfg: Config,
    check: str,
    rule: Rule,
    message: str,
    gpu: Gpu | None = None,
    evidence: tuple[Evidence, ...] = (),
) -> Finding:
    """A finding on one GPU (or the node, gpu=None), keyed `rule/<pci>` so each GPU latches apart."""
    if gpu is None:
        return rule_finding(cfg, check, rule, message, evidence=evidence)
    return rule_finding(cfg, check, rule, message, (gpu.label,), gpu.pci_bus_id, evidence)


def per_gpu(
    name: str,
    facts: NodeFacts,
    cfg: Config,
    judge: Callable[[Gpu], Iterable[tuple[Rule, str]]],
    applies: Callable[[Gpu], bool] = lambda g: True,
    not_applicable: str = "",
    ok: str = "",
    where: Mapping[str, str] | None = None,
) -> CheckResult:
    """Run judge(gpu) → [(rule, message)] over every GPU the check applies to; on a damaged capture,
    over its intact GPU blocks (the result is then also `unknown`). `where` names, per rule, the
    Gpu.where key of the lines a finding rests on (its evidence)."""
    got = partial_input(name, facts.gpus, GpuInventory)
    if isinstance(got, CheckResult):
        return got
    inv, unreadable = got
    gpus = [g for g in inv.gpus if applies(g)]
    lines = where or {}

    def evidence(g: Gpu, rule: Rule) -> tuple[Evidence, ...]:
        return Evidence.of(inv.source, g.where.get(lines.get(rule.name, ""), ()))

    findings = [
        gpu_finding(cfg, name, rule, f"{g.label}: {msg}", g, evidence(g, rule))
        for g in gpus
        for rule, msg in judge(g)
    ]
    if unreadable is not None:
        return CheckResult(name, findings=tuple(findings), unknown=unreadable)
    if not inv.gpus:
        return CheckResult(name, skipped="no GPU visible")
    if not gpus:
        return CheckResult(name, skipped=not_applicable or "does not apply to these GPUs")
    note = ok or f"{len(gpus)} GPU(s) ok"
    if inv.hung:  # judged on the GPUs that answered; the hung ones are gpu.responsive's
        note += f" ({', '.join(h.label for h in inv.hung)} not read: no answer, see gpu.responsive)"
    return CheckResult(name, findings=tuple(findings), note=note)
