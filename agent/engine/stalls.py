"""The engine's side of gpu.stalled (checks/gpu_stall.py): one sample per GPU each gpu-tier run, the
kubelet asked who holds a GPU only when one looks stalled. Its GPUStalled Event is the check's own
(CheckSpec.event, engine/side_step.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.config import Config
from agent.core.gpu import GpuInventory
from agent.core.gpu_stall import GpuActivity, Sample, advance

log = logging.getLogger("gpu-healthcheck.engine")

Holders = Callable[[], Mapping[int, Sequence[str]]]
KEEP_INTERVALS = 3  # samples are kept for the window and this many gpu intervals more


def observe(activity: GpuActivity, gpus: Any, cfg: Config, holders: Holders | None, now: int) -> GpuActivity:
    """The activity with this run's samples. A GPU list that could not be read adds none (the next
    sample's gap ends any run: a look not taken). Who holds a GPU is asked once, only when a GPU
    is busy at its idle power; it cannot be asked (no kubelet socket): no GPU counts as held."""
    if not isinstance(gpus, GpuInventory) or not gpus.gpus:
        return activity
    policy = cfg.stall
    shaped = {
        g.index
        for g in gpus.gpus
        if policy.shaped(g.clocks.utilization_percent, g.power.draw_w, policy.idle_power(g.name))
    }
    held: Mapping[int, Sequence[str]] = {}
    if shaped and holders is not None:
        try:
            held = holders()
        except Exception as exc:  # the kubelet not answering: nobody is known to hold it
            log.info("who holds the GPUs could not be asked: %s", exc)
    read = {
        g.lasting_name: Sample(
            now,
            g.clocks.utilization_percent,
            g.power.draw_w,
            tuple(held.get(g.index, ())) if g.index in shaped else None,
        )
        for g in gpus.gpus
    }
    return advance(activity, read, now, policy.window_s + KEEP_INTERVALS * cfg.intervals.gpu)


__all__ = ["observe"]
