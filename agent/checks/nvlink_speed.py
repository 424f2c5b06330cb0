"""The NVLink speed check: every active link at the speed of its generation.

Read from `nvidia-smi nvlink -s` (the existing nvlink input). A link that trains at a lower speed
stays "active", so the nvlink check (active/inactive counts) does not see it. The expected speed
is the profile's nvlinkLinkGBps where set (A100 NVLink3 25 GB/s, H100/H200 NVLink4 26.562 GB/s,
as the real recordings print them), else the fastest link on the node: links of one generation
run at one speed, so a slower peer is a degraded link. Inactive links are the nvlink check's.
"""

from __future__ import annotations

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.nvlink import NvlinkReport
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "nvlink-speed"
TOLERANCE = 0.01  # nvidia-smi prints 3 decimals: 26.562 vs 26.5625

SLOW = Rule("nvlink-speed.slow", Severity.RESET, "an active NVLink runs below its generation's speed")


def _links(speeds: dict[int, float]) -> str:
    return ", ".join(str(n) for n in sorted(speeds))


def check_nvlink_speed(facts: NodeFacts, cfg: Config) -> CheckResult:
    report = typed_input(NAME, facts.nvlink, NvlinkReport)
    if isinstance(report, CheckResult):
        return report
    active = {g.index: {n: s for n, s in g.links.items() if s is not None} for g in report.gpus}
    speeds = [s for links in active.values() for s in links.values()]
    if not report.supported or not speeds:
        return CheckResult(NAME, skipped="no active NVLink reported")
    prof = facts.profile
    expected = prof.nvlink_link_gbps if prof is not None and prof.nvlink_link_gbps else None
    source = f"{prof.instance_type}'s" if expected is not None and prof is not None else "the fastest link's"
    want = expected if expected is not None else max(speeds)
    findings: list[Finding] = []
    for gpu in report.gpus:
        slow = {n: s for n, s in active[gpu.index].items() if s < want * (1 - TOLERANCE)}
        if not slow:
            continue
        worst = min(slow.values())
        msg = (
            f"GPU {gpu.index}: NVLink(s) {_links(slow)} at {worst:g} GB/s or less, "
            f"{source} speed is {want:g} GB/s"
        )
        findings.append(rule_finding(cfg, NAME, SLOW, msg, (f"GPU {gpu.index}",), f"gpu{gpu.index}"))
    note = f"{len(speeds)} active link(s) at {want:g} GB/s ({source} speed)"
    return CheckResult(NAME, findings=tuple(findings), note=note if not findings else "")


CHECKS = (CheckSpec(NAME, check_nvlink_speed, (Input.NVLINK,), "topology", (SLOW,)),)
