"""A stalled GPU: held by a pod, busy, yet drawing about its idle power, minute after minute. A hung
collective (NCCL waiting on a peer that never comes) looks so: its kernel stays resident, so the
utilization counter reads 95-100 %, while the SMs spin on a flag and the board draws what it draws
idle. A GPU doing real work draws several times its idle power (an H100 under load: 629 W; idle:
70 W), an idle GPU reads 0 % (docs/checks.md "A stalled GPU").

What is kept: per GPU (its lasting name), the recent samples of utilization, power and who holds it,
one per gpu-tier run, in memory only (the window is minutes; an agent restart starts it again), the
last `window_s` of them. Who holds a GPU is asked of the kubelet only for a GPU that looks stalled
in that run, so a busy or idle fleet never asks. Pure: the engine takes the samples, the check
(checks/gpu_stall.py) judges them with the thresholds in force (live on reload).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

# Idle power per GPU model (P0, 0 % utilization, no process), in watts, from real recordings
# (tests/fixtures/nvidia-smi-q, each with its .source.txt); a GPU whose model is not listed is never
# judged. Matched as whole words in the GPU's name, the longest entry first ("H100 NVL" before
# "H100 80GB HBM3"; "H200" never matches "GH200").
IDLE_POWER_W: dict[str, float] = {
    "H100 80GB HBM3": 70.0,  # 69.85 W (nvgpuexp, driver 590); 68.88-71.97 W (gpud 8x H100, 535)
    "H200": 76.0,  # 77.67 W (nvgpuexp, 590); 74.58 W (thamada, 550)
    "H100 NVL": 62.0,  # 61.62 and 62.11 W (thamada 2x H100 NVL, 550)
    "A100-SXM4-80GB": 60.0,  # 58.78-62.21 W (thamada 4x A100-SXM4-80GB, 555)
}


@dataclass(frozen=True)
class StallPolicy:
    """`stall:` in config.yaml."""

    utilization_percent: float = 95.0  # at least this busy ...
    power_within_percent: float = 15.0  # ... with the draw within this share of the idle power ...
    minutes: float = 10.0  # ... for this long, held by a pod the whole time
    idle_power_w: Mapping[str, float] = field(default_factory=lambda: dict(IDLE_POWER_W))

    @property
    def window_s(self) -> float:
        return self.minutes * 60.0

    def idle_power(self, name: str | None) -> float | None:
        """The idle power of a GPU by its model name, None when the table does not know it."""
        return _idle_power(name or "", tuple(sorted(self.idle_power_w.items())))

    def band(self, idle: float) -> tuple[float, float]:
        share = self.power_within_percent / 100.0
        return idle * (1 - share), idle * (1 + share)

    def shaped(self, util: int | None, power: float | None, idle: float | None) -> bool:
        """Busy at idle power (a value not reported, or no idle power known: never)."""
        if util is None or power is None or idle is None:
            return False
        lo, hi = self.band(idle)
        return util >= self.utilization_percent and lo <= power <= hi


@lru_cache(maxsize=64)
def _idle_power(name: str, table: tuple[tuple[str, float], ...]) -> float | None:
    for model, watts in sorted(table, key=lambda kv: -len(kv[0])):
        if re.search(rf"(?<![\w-]){re.escape(model)}(?![\w-])", name, re.IGNORECASE):
            return watts
    return None


@dataclass(frozen=True)
class Sample:
    """One gpu-tier read of one GPU: when (wall seconds), utilization (%), draw (W), and the
    containers holding it (namespace/pod/container; None: not asked, it did not look stalled nor
    behind its siblings); its SM clock (MHz) and whether a clock event reason was active (None: not
    reported), for the comparison with its siblings (core/peers.py)."""

    at: int
    util: int | None
    power_w: float | None
    pods: tuple[str, ...] | None = None
    sm_mhz: int | None = None
    explained: bool | None = None


@dataclass(frozen=True)
class GpuActivity:
    """GPU (lasting name) → its samples, oldest first. Immutable: advance() returns a new one."""

    gpus: Mapping[str, tuple[Sample, ...]] = field(default_factory=dict)

    def series(self, name: str) -> tuple[Sample, ...]:
        return tuple(self.gpus.get(name, ()))


def advance(activity: GpuActivity, read: Mapping[str, Sample], now: int, keep_s: float) -> GpuActivity:
    """The activity with this read's samples added (a GPU not in the read keeps none of its old
    ones: a board gone or replaced starts again) and samples older than *keep_s* dropped."""
    out: dict[str, tuple[Sample, ...]] = {}
    for name, sample in read.items():
        kept = tuple(s for s in activity.gpus.get(name, ()) if now - s.at <= keep_s and s.at <= sample.at)
        out[name] = (*kept, sample)
    return GpuActivity(out)


def stalled_run(
    series: tuple[Sample, ...], idle: float | None, policy: StallPolicy, max_gap_s: float
) -> tuple[Sample, ...]:
    """The trailing samples that are each held by a pod and busy at idle power, with no gap longer
    than *max_gap_s* between two (a read missed is a look not taken); () when the last one is not."""
    run: list[Sample] = []
    for s in reversed(series):
        if not (s.pods and policy.shaped(s.util, s.power_w, idle)):
            break
        if run and run[-1].at - s.at > max_gap_s:
            break
        run.append(s)
    return tuple(reversed(run))


__all__ = ["IDLE_POWER_W", "GpuActivity", "Sample", "StallPolicy", "advance", "stalled_run"]
