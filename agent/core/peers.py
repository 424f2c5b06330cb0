"""The odd GPU out: a GPU judged against its siblings on the same node, not against a golden figure.

The GPUs of one node are one model; given the same work they run at the same clocks, draw about the
same power and reach the same throughput. So where several of them run the same work (a DCGM diag
on every GPU; one pod holding several GPUs), the one well below its siblings' median is the
suspect: a straggler slows every synchronous step of the job. Never judged with fewer than
MIN_PEERS GPUs (a median of two cannot name the odd one), on an idle GPU, across GPUs that different
pods hold, or where a clock event reason explains it (gpu.clocks and the throttle checks own that).

Pure: checks/dcgm_peers.py judges the diag's figures, checks/gpu_peers.py the agent's recent
samples (core/gpu_stall.Sample); the engine (engine/stalls.py) uses `laggards` to ask the kubelet who
holds the GPUs only in a read where a GPU runs behind a busy sibling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median

MIN_PEERS = 3  # the GPU and at least two siblings: a median of two cannot name the odd one


@dataclass(frozen=True)
class PeerPolicy:
    """`peers:` in config.yaml (docs/guides/odd-gpu-out.md says where each default comes from)."""

    diag_margin_percent: float = 10.0  # a diag figure this far below its siblings' median: warn
    busy_percent: float = 80.0  # a GPU under work: at least this utilization
    clock_margin_percent: float = 10.0  # SM clock this far below the pod's GPUs' median ...
    power_margin_percent: float = 20.0  # ... or the draw this far below it ...
    behind_reads: int = 3  # ... in at least this many ...
    window_reads: int = 5  # ... of the last this many reads (one per gpu-tier run)


def floor(med: float, margin_percent: float) -> float:
    """The value below which a GPU is behind a median by more than the margin."""
    return med * (1.0 - margin_percent / 100.0)


def behind_median(values: Mapping[str, float], margin_percent: float) -> dict[str, tuple[float, float]]:
    """Of MIN_PEERS or more values (GPU → figure), those below the median by more than the margin:
    GPU → (its value, the median). {} with fewer values, or a median that is not positive."""
    if len(values) < MIN_PEERS:
        return {}
    med = median(values.values())
    if med <= 0:
        return {}
    low = floor(med, margin_percent)
    return {gpu: (v, med) for gpu, v in values.items() if v < low}


def behind_any(values: Mapping[str, float], margin_percent: float) -> set[str]:
    """Of MIN_PEERS or more values, those below some sibling's value by more than the margin: a
    superset of behind_median over any subset that holds the GPU (so no straggler among the GPUs
    one pod holds is missed for want of knowing which pod holds which)."""
    if len(values) < MIN_PEERS:
        return set()
    top = max(values.values())
    return {gpu for gpu, v in values.items() if v < floor(top, margin_percent)}


@dataclass(frozen=True)
class Under:
    """One GPU's sample as the comparison under work reads it: busy and unexplained, or not judged."""

    name: str
    model: str
    util: int | None
    sm_mhz: int | None
    power_w: float | None
    explained: bool | None  # a clock event reason active (None: the reasons were not reported)

    def judged(self, policy: PeerPolicy) -> bool:
        """Busy, its clock event reasons read and none active, and its clock and draw read."""
        return (
            self.util is not None
            and self.util >= policy.busy_percent
            and self.explained is False
            and self.sm_mhz is not None
            and self.power_w is not None
        )


def laggards(read: Iterable[Under], policy: PeerPolicy) -> set[str]:
    """The GPUs of one read that run behind a busy, unexplained sibling of their model (clock or
    draw past its margin): the reads in which the engine asks who holds the GPUs."""
    by_model: dict[str, list[Under]] = {}
    for u in read:
        if u.judged(policy):
            by_model.setdefault(u.model, []).append(u)
    out: set[str] = set()
    for group in by_model.values():
        out |= behind_any({u.name: float(u.sm_mhz or 0) for u in group}, policy.clock_margin_percent)
        out |= behind_any({u.name: float(u.power_w or 0) for u in group}, policy.power_margin_percent)
    return out


__all__ = ["MIN_PEERS", "PeerPolicy", "Under", "behind_any", "behind_median", "floor", "laggards"]
