"""The NVLink check: on NVLink boards every GPU must report all its links active.

A GPU with no active link cannot join NVLink collectives at all (the node must be replaced); some
links down halves the bandwidth and usually clears with a GPU reset.
"""

from __future__ import annotations

from agent.checks import CheckSpec, input_gap, rule_finding
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.model import NvlinkGpu, NvlinkReport
from agent.core.rules import Rule
from agent.core.severity import Severity

NO_ACTIVE = Rule("nvlink.no-active", Severity.ISOLATE, "a GPU has no active NVLink")
SOME_INACTIVE = Rule("nvlink.some-inactive", Severity.RESET, "a GPU has some NVLinks inactive")


NAME = "nvlink"


def _finding(cfg: Config, rule: Rule, message: str, gpu: NvlinkGpu | None) -> Finding:
    entities: tuple[str, ...] = ()
    key = ""
    if gpu is not None:
        entities = tuple(e for e in (f"GPU {gpu.index}", gpu.uuid) if e)
        key = f"{gpu.uuid or gpu.index}"
    return rule_finding(cfg, NAME, rule, message, entities, key)


def _judge(cfg: Config, gpu: NvlinkGpu, expected: int | None) -> Finding | None:
    active, inactive = gpu.active_links, gpu.inactive_links
    if gpu.all_inactive or active == 0:
        why = "all links inactive" if gpu.all_inactive or inactive else "no NVLink reported"
        return _finding(cfg, NO_ACTIVE, f"GPU {gpu.index}: no active NVLink ({why})", gpu)
    if inactive or (expected is not None and active < expected):
        total = f"{expected} expected" if expected is not None else f"{active + inactive} listed"
        down = sorted(n for n, v in gpu.links.items() if v is None)
        which = f" (inactive: {', '.join(map(str, down))})" if down else ""
        return _finding(
            cfg,
            SOME_INACTIVE,
            f"GPU {gpu.index}: {active} NVLink(s) active, {total}{which}",
            gpu,
        )
    return None


def check_nvlink(facts: NodeFacts, cfg: Config) -> CheckResult:
    prof = facts.profile
    if prof is None:
        return CheckResult(NAME, skipped="instance type unknown: NVLink expectation unknown")
    if not prof.nvlink:
        return CheckResult(NAME, skipped=f"no NVLink expected for {prof.instance_type}")
    gap = input_gap(NAME, facts.nvlink)
    if gap is not None:
        return gap
    report = facts.nvlink
    assert isinstance(report, NvlinkReport)
    if not report.supported:
        return CheckResult(
            NAME,
            findings=(
                _finding(
                    cfg,
                    NO_ACTIVE,
                    "NVLink expected by profile but nvidia-smi reports no NVLink support",
                    None,
                ),
            ),
        )
    looked = [g for g in report.gpus if g.unavailable is None]
    blind = [g for g in report.gpus if g.unavailable is not None]
    if not looked:
        if blind:
            return CheckResult(NAME, skipped=f"GPU {blind[0].index}: {blind[0].unavailable}")
        return CheckResult(NAME, unknown="nvidia-smi nvlink -s listed no GPU")
    expected = prof.nvlink_links_per_gpu
    findings = tuple(f for g in looked if (f := _judge(cfg, g, expected)) is not None)
    note = f"{len(looked)} GPU(s), all NVLinks active"
    if expected is not None:
        note += f" ({expected} per GPU)"
    if blind:
        note += f"; not queried: {', '.join(f'GPU {g.index}' for g in blind)} ({blind[0].unavailable})"
    return CheckResult(NAME, findings=findings, note=note)


CHECKS = (CheckSpec(Input.NVLINK, check_nvlink, (Input.NVLINK,), "topology", (NO_ACTIVE, SOME_INACTIVE)),)
