"""`gpu.peers`: a GPU that runs persistently behind the other GPUs its pod holds (core/peers.py).

One pod holding several GPUs of the node runs the same work on each (data or tensor parallel): a GPU
whose SM clock or power draw stays well below the median of the pod's GPUs, with no clock event
reason to explain it, is the straggler every synchronous step waits for. Judged on the agent's
recent samples (NodeFacts.activity, one per gpu-tier run, kept in memory; engine/stalls.py asks the
kubelet who holds the GPUs only in a read where a GPU runs behind a busy sibling): behind in at
least `peers.behindReads` of the last `peers.windowReads` reads, so one slow sample never warns.
Never on an idle GPU (below `peers.busyPercent`), never across GPUs that different pods hold, never
with fewer than three busy GPUs in the pod, never when a clock event reason is active (the throttle
checks own that). The message holds no live reading (the values are its evidence), so a straggler
that goes on costs no write per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.checks import CheckSpec, gpu_finding, partial_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import Gpu, GpuInventory
from agent.core.gpu_stall import Sample
from agent.core.peers import MIN_PEERS, PeerPolicy, Under, behind_median
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "gpu.peers"
BEHIND = Rule(
    f"{NAME}.behind",
    Severity.MONITOR,
    "busy, no clock event reason, yet its SM clock or power draw stays below the median of the other "
    "GPUs its pod holds by more than the margin: a straggler",
    max_severity=Severity.MONITOR,
)


@dataclass
class _Tally:
    reads: int = 0
    figures: set[str] = field(default_factory=set)
    siblings: int = 0
    last: str = ""  # the latest behind read, in numbers (evidence)


def _pod(s: Sample) -> str | None:
    """The one pod (namespace/pod) holding the GPU in this sample; None: not asked, none, several."""
    pods = {"/".join(ref.split("/")[:2]) for ref in s.pods or ()}
    return pods.pop() if len(pods) == 1 else None


def _behind_in_read(
    read: dict[str, Sample], model: dict[str, str], policy: PeerPolicy
) -> dict[tuple[str, str], tuple[list[str], int, str]]:
    """(GPU, pod) → (the figures behind, the pod's busy GPUs, the numbers) for one read."""
    groups: dict[tuple[str, str], list[tuple[str, Sample]]] = {}
    for name, s in read.items():
        pod = _pod(s)
        u = Under(name, model.get(name, ""), s.util, s.sm_mhz, s.power_w, s.explained)
        if pod is not None and u.judged(policy):
            groups.setdefault((pod, u.model), []).append((name, s))
    out: dict[tuple[str, str], tuple[list[str], int, str]] = {}
    for (pod, _), members in groups.items():
        if len(members) < MIN_PEERS:
            continue
        clocks = behind_median({n: float(s.sm_mhz or 0) for n, s in members}, policy.clock_margin_percent)
        power = behind_median({n: float(s.power_w or 0) for n, s in members}, policy.power_margin_percent)
        for name in sorted(set(clocks) | set(power)):
            figs, nums = [], []
            if name in clocks:
                figs.append("SM clock")
                nums.append(f"SM clock {clocks[name][0]:.0f} MHz, median {clocks[name][1]:.0f} MHz")
            if name in power:
                figs.append("power draw")
                nums.append(f"draw {power[name][0]:.0f} W, median {power[name][1]:.0f} W")
            out[(name, pod)] = (figs, len(members), "; ".join(nums))
    return out


def check_peers(facts: NodeFacts, cfg: Config) -> CheckResult:
    got = partial_input(NAME, facts.gpus, GpuInventory)
    if isinstance(got, CheckResult):
        return got
    inv, unreadable = got
    if not facts.activity.gpus:
        return CheckResult(NAME, skipped="one look: a straggler is judged over the agent's recent reads")
    policy = cfg.peers
    gpus: dict[str, Gpu] = {g.lasting_name: g for g in inv.gpus}
    model = {name: g.name or "" for name, g in gpus.items()}
    series = {name: facts.activity.series(name) for name in gpus}
    times = sorted({s.at for ss in series.values() for s in ss})[-policy.window_reads :]
    tallies: dict[tuple[str, str], _Tally] = {}
    for t in times:
        read = {name: s for name, ss in series.items() for s in ss if s.at == t}
        for key, (figs, members, nums) in _behind_in_read(read, model, policy).items():
            tally = tallies.setdefault(key, _Tally())
            tally.reads += 1
            tally.figures.update(figs)
            tally.siblings = members - 1
            tally.last = f"at {t}: {nums}"
    findings: list[Finding] = []
    for (name, pod), tally in sorted(tallies.items()):
        if tally.reads < policy.behind_reads:
            continue
        g = gpus[name]
        message = (
            f"{g.label}: a straggler in pod {pod}: its {' and '.join(sorted(tally.figures))} below the "
            f"median of the {tally.siblings} other busy GPUs the pod holds by more than the margin "
            f"(peers.clockMarginPercent {policy.clock_margin_percent:g} %, peers.powerMarginPercent "
            f"{policy.power_margin_percent:g} %) in at least {policy.behind_reads} of the last "
            f"{policy.window_reads} reads, no clock event reason active"
        )
        evidence = (Evidence(inv.source, None, tally.last),)
        findings.append(gpu_finding(cfg, NAME, BEHIND, message, g, evidence))
    if unreadable is not None:
        return CheckResult(NAME, findings=tuple(findings), unknown=unreadable)
    if not inv.gpus:
        return CheckResult(NAME, skipped="no GPU visible")
    return CheckResult(
        NAME,
        findings=tuple(findings),
        note="" if findings else "no GPU persistently behind the other busy GPUs its pod holds",
    )


CHECKS = (CheckSpec(NAME, check_peers, (Input.GPUS,), "gpu", (BEHIND,)),)
