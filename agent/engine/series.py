"""What each gpu-tier run keeps for the checks that judge a series of reads rather than one: a trend
read when due (core/trend_history: the trend warnings judge the kept reads) and one activity sample
per GPU (engine/stalls.py: gpu.stalled)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.gpu_stall import GpuActivity
from agent.engine import stalls
from agent.engine.state import EngineState
from agent.probes.source import with_read


def keep(
    facts: NodeFacts,
    state: EngineState,
    activity: GpuActivity,
    cfg: Config,
    wall: Callable[[], float],
    holders: stalls.Holders | None,
) -> tuple[NodeFacts, GpuActivity]:
    """This run's facts with both series in them, and the activity now (state.trends keeps the
    reads)."""
    t = cfg.trends
    facts = replace(facts, boot_id=state.boot_id)
    facts = with_read(facts, state.trends, wall(), t.read_spacing_s, t.keep_reads, t.clock_busy_percent)
    state.trends = facts.trends
    activity = stalls.observe(activity, facts.gpus, cfg, holders, int(wall()))
    return replace(facts, activity=activity), activity


__all__ = ["keep"]
