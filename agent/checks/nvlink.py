"""The NVLink check: on NVLink boards every GPU must report all its links active.

It also reads Input.GPUS when it has been read, to know how many GPUs the listing should cover.

A GPU with no active link cannot join NVLink collectives at all (the node must be replaced); some
links down halves the bandwidth and usually clears with a GPU reset.
"""

from __future__ import annotations

from agent.checks import CheckSpec, partial_input, rule_finding
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import GpuInventory
from agent.core.nvlink import NvlinkGpu, NvlinkReport
from agent.core.rules import Rule
from agent.core.severity import Severity

NO_ACTIVE = Rule("nvlink.no-active", Severity.ISOLATE, "a GPU has no active NVLink")
SOME_INACTIVE = Rule("nvlink.some-inactive", Severity.RESET, "a GPU has some NVLinks inactive")


NAME = "nvlink"


def _finding(cfg: Config, rule: Rule, message: str, gpu: NvlinkGpu | None, source: str = "") -> Finding:
    entities: tuple[str, ...] = ()
    key = ""
    evidence: tuple[Evidence, ...] = ()
    if gpu is not None:
        entities = tuple(e for e in (f"GPU {gpu.index}", gpu.uuid) if e)
        key = f"{gpu.uuid or gpu.index}"
        evidence = Evidence.of(source, gpu.where)
    return rule_finding(cfg, NAME, rule, message, entities, key, evidence)


def _judge(
    cfg: Config, gpu: NvlinkGpu, expected: int | None, node_has_nvlink: bool, source: str
) -> Finding | None:
    """A fault the listing states: links <inactive> next to active ones, or no active link on a GPU
    of a node that has NVLink (the profile says so, or another GPU shows active links)."""
    active, inactive = gpu.active_links, gpu.inactive_links
    if gpu.all_inactive or (active == 0 and inactive):
        if not node_has_nvlink:
            return None
        return _finding(
            cfg, NO_ACTIVE, f"GPU {gpu.index}: no active NVLink (all links inactive)", gpu, source
        )
    if inactive:
        total = f"{expected} expected" if expected is not None else f"{active + inactive} listed"
        down = sorted(n for n, v in gpu.links.items() if v is None)
        return _finding(
            cfg,
            SOME_INACTIVE,
            f"GPU {gpu.index}: {active} NVLink(s) active, {total} (inactive: {', '.join(map(str, down))})",
            gpu,
            source,
        )
    return None


def _listed_too_few(report: NvlinkReport, facts: NodeFacts) -> str | None:
    """Why the listing cannot be the whole node: it lists fewer GPUs than nvidia-smi -q describes."""
    inv = facts.gpus
    if isinstance(inv, GpuInventory) and len(report.gpus) < len(inv.gpus):
        return f"nvidia-smi nvlink -s lists {len(report.gpus)} GPU(s), {inv.source} describes {len(inv.gpus)}"
    return None


def check_nvlink(facts: NodeFacts, cfg: Config) -> CheckResult:
    """With a profile, NVLink is judged where it expects NVLink; without one, on what the listing
    itself states (links inactive next to active ones)."""
    prof = facts.profile
    if prof is not None and not prof.nvlink:
        return CheckResult(NAME, skipped=f"no NVLink expected for {prof.instance_type}")
    got = partial_input(NAME, facts.nvlink, NvlinkReport)
    if isinstance(got, CheckResult):
        return got
    report, unreadable = got
    if report.supported is None:  # an empty listing states nothing
        if prof is None:
            return CheckResult(NAME, skipped="nvidia-smi nvlink -s lists no NVLink (instance type unknown)")
        return CheckResult(NAME, unknown="nvidia-smi nvlink -s printed nothing, NVLink expected")
    if not report.supported:
        if prof is None:
            return CheckResult(NAME, skipped="nvidia-smi reports no NVLink support (instance type unknown)")
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
    expected = prof.nvlink_links_per_gpu if prof is not None else None
    node_has_nvlink = prof is not None or any(g.active_links for g in looked)
    findings = tuple(
        f for g in looked if (f := _judge(cfg, g, expected, node_has_nvlink, report.source)) is not None
    )
    gaps = [unreadable] if unreadable else []
    too_few = _listed_too_few(report, facts)
    if too_few:
        gaps.append(too_few)
    # A GPU header with no link under it states nothing (its lines were lost or cut).
    silent = [g for g in looked if not g.all_inactive and not g.links]
    gaps += [f"GPU {g.index} lists no link" for g in silent[:2]]
    if expected is not None:
        # nvidia-smi lists every link of a GPU, inactive ones as <inactive>: fewer is a cut listing.
        short = [g for g in looked if not g.all_inactive and 0 < len(g.links) < expected]
        gaps += [f"GPU {g.index} lists {len(g.links)} of its {expected} links" for g in short[:2]]
    if not looked and not gaps:
        if blind:
            return CheckResult(NAME, skipped=f"GPU {blind[0].index}: {blind[0].unavailable}")
        return CheckResult(NAME, unknown="nvidia-smi nvlink -s listed no GPU")
    if gaps:
        return CheckResult(NAME, findings=findings, unknown="; ".join(gaps))
    note = f"{len(looked)} GPU(s), all NVLinks active"
    if expected is not None:
        note += f" ({expected} per GPU)"
    if blind:
        note += f"; not queried: {', '.join(f'GPU {g.index}' for g in blind)} ({blind[0].unavailable})"
    return CheckResult(NAME, findings=findings, note=note)


CHECKS = (CheckSpec(Input.NVLINK, check_nvlink, (Input.NVLINK,), "topology", (NO_ACTIVE, SOME_INACTIVE)),)
