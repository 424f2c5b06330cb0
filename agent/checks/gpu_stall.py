"""gpu.stalled: a GPU held by a pod, busy, at its idle power for `stall.minutes` (core/gpu_stall.py says
why that is a hung job). A warning on that GPU (monitor, and never more: `severities:` may only
silence it), naming the containers that hold it; the engine posts a GPUStalled Event when one begins.

It judges the agent's recent samples (NodeFacts.activity) with the thresholds in force, so a reload
applies at the next cycle. The message holds no live reading (only the thresholds, the start and the
pods), so a stall that goes on costs no write per cycle.
"""

from __future__ import annotations

from datetime import datetime, timezone

from agent.checks import CheckSpec, gpu_finding, partial_input
from agent.config import Config
from agent.core.actions import Action
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import GpuInventory
from agent.core.gpu_stall import stalled_run
from agent.core.node_keys import EventReason
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "gpu.stalled"
STALLED = Rule(
    f"{NAME}.idle-power",
    Severity.MONITOR,
    "held by a pod, busy, at its idle power for minutes: a hung job (a stalled collective?)",
    Action.RESTART_APP,
    max_severity=Severity.MONITOR,
)
GAP_INTERVALS = 2.5  # two samples further apart than this many gpu intervals: a look was missed
MAX_PODS = 4  # named in the message; the GPU's entry in the results annotation lists more


def _when(at: int) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_stalled(facts: NodeFacts, cfg: Config) -> CheckResult:
    got = partial_input(NAME, facts.gpus, GpuInventory)
    if isinstance(got, CheckResult):
        return got
    inv, unreadable = got
    if not facts.activity.gpus:
        return CheckResult(NAME, skipped="one look: a stall is judged over the agent's reads of minutes")
    policy = cfg.stall
    max_gap = GAP_INTERVALS * cfg.intervals.gpu
    judged = 0
    findings: list[Finding] = []
    for g in inv.gpus:
        idle = policy.idle_power(g.name)
        if idle is None:
            continue
        judged += 1
        run = stalled_run(facts.activity.series(g.lasting_name), idle, policy, max_gap)
        if not run or run[-1].at - run[0].at < policy.window_s:
            continue
        lo, hi = policy.band(idle)
        pods = sorted({p for s in run[-1:] for p in s.pods or ()})
        named = ", ".join(pods[:MAX_PODS]) + (f" (+{len(pods) - MAX_PODS})" if len(pods) > MAX_PODS else "")
        message = (
            f"{g.label}: held by {named}, at least {policy.utilization_percent:g} % busy at its idle "
            f"power ({lo:.0f}-{hi:.0f} W; idle {idle:g} W) since {_when(run[0].at)}: "
            "a hung job, a stalled collective?"
        )
        where = g.where.get("clocks", ()) + g.where.get("power.draw", ())
        findings.append(gpu_finding(cfg, NAME, STALLED, message, g, Evidence.of(inv.source, where)))
    if unreadable is not None:
        return CheckResult(NAME, findings=tuple(findings), unknown=unreadable)
    if not inv.gpus:
        return CheckResult(NAME, skipped="no GPU visible")
    if not judged:
        models = sorted({g.name or "?" for g in inv.gpus})
        return CheckResult(
            NAME, skipped=f"no idle power known for {', '.join(models)} (stall.idlePowerWatts)"
        )
    return CheckResult(NAME, findings=tuple(findings), note=f"{judged} GPU(s) not stalled")


CHECKS = (CheckSpec(NAME, check_stalled, (Input.GPUS,), "gpu", (STALLED,), event=EventReason.GPU_STALLED),)
