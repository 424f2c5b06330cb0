"""The engine's side of gpu.stalled (checks/gpu_stall.py) and gpu.peers (checks/gpu_peers.py): one
sample per GPU each gpu-tier run, the kubelet asked who holds the GPUs only when one looks stalled
or runs behind a busy sibling (core/peers.laggards). Its GPUStalled Event is the check's own
(CheckSpec.event, engine/side_step.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.config import Config
from agent.core.gpu import Gpu, GpuInventory
from agent.core.gpu_stall import GpuActivity, Sample, advance
from agent.core.peers import Under, laggards

log = logging.getLogger("gpu-healthcheck.engine")

Holders = Callable[[], Mapping[int, Sequence[str]]]
KEEP_INTERVALS = 3  # samples are kept for the window and this many gpu intervals more


def observe(activity: GpuActivity, gpus: Any, cfg: Config, holders: Holders | None, now: int) -> GpuActivity:
    """The activity with this run's samples. A GPU list that could not be read adds none (the next
    sample's gap ends any run: a look not taken). Who holds the GPUs is asked once, only when a GPU
    is busy at its idle power or behind a busy sibling (then every GPU's holders are kept in this
    read: its siblings' too); it cannot be asked (no kubelet socket): no GPU counts as held."""
    if not isinstance(gpus, GpuInventory) or not gpus.gpus:
        return activity
    policy = cfg.stall
    shaped = {
        g.index
        for g in gpus.gpus
        if policy.shaped(g.clocks.utilization_percent, g.power.draw_w, policy.idle_power(g.name))
    }
    behind = laggards((under(g) for g in gpus.gpus), cfg.peers)
    asked = shaped | ({g.index for g in gpus.gpus} if behind else set())
    held: Mapping[int, Sequence[str]] = {}
    if asked and holders is not None:
        try:
            held = holders()
        except Exception as exc:  # the kubelet not answering: nobody is known to hold it
            log.info("who holds the GPUs could not be asked: %s", exc)
    read = {
        g.lasting_name: Sample(
            now,
            g.clocks.utilization_percent,
            g.power.draw_w,
            tuple(held.get(g.index, ())) if g.index in asked else None,
            g.clocks.sm_mhz,
            explained(g),
        )
        for g in gpus.gpus
    }
    window_s = max(policy.window_s, cfg.peers.window_reads * cfg.intervals.gpu)
    return advance(activity, read, now, window_s + KEEP_INTERVALS * cfg.intervals.gpu)


def explained(g: Gpu) -> bool | None:
    """Whether a clock event reason is active on the GPU (None: the reasons were not reported)."""
    reasons = g.clock_events.active()
    return None if reasons is None else bool(reasons)


def under(g: Gpu) -> Under:
    """The GPU as the comparison with its siblings reads it (core/peers.py)."""
    return Under(
        g.lasting_name,
        g.name or "",
        g.clocks.utilization_percent,
        g.clocks.sm_mhz,
        g.power.draw_w,
        explained(g),
    )


__all__ = ["observe"]
