"""When each tier runs: the tiers, the inputs each refreshes (their specs name the tier), their
intervals from config, and the jitter that keeps a fleet's nodes from probing in step."""

from __future__ import annotations

import random
from collections.abc import Callable

from agent.config import Config
from agent.config.settings import Intervals
from agent.core.facts import Input
from agent.probes.inputs import SPECS

TIER_INTERVAL: dict[str, Callable[[Intervals], float]] = {
    "gpu": lambda i: i.gpu,
    "xid": lambda i: i.gpu,  # a periodic re-read besides the kernel log's wake-ups
    "efa": lambda i: i.efa,
    "topology": lambda i: i.topology,
    "dcgm-health": lambda i: i.dcgm_health,
    "dcgm-diag": lambda i: i.dcgm_diag,
    "sdc-probe": lambda i: i.sdc_probe,
}
# What each tier refreshes: the inputs whose spec (probes/inputs.py) names it, in the specs' order.
TIER_INPUTS: dict[str, tuple[Input, ...]] = {
    tier: tuple(s.input for s in SPECS if s.tier == tier) for tier in TIER_INTERVAL
}


class Scheduler:
    """Every tier is due at start; after a run it is due again one interval (plus jitter) later."""

    def __init__(self, cfg: Config, rng: random.Random) -> None:
        self.cfg = cfg  # the engine hands a reloaded config on, then calls reschedule_all()
        self.rng = rng
        self.last_run: dict[str, float] = {}
        self.next_due: dict[str, float] = dict.fromkeys(TIER_INPUTS, 0.0)  # first run at start

    def interval(self, tier: str) -> float:
        return TIER_INTERVAL[tier](self.cfg.intervals)

    def ran(self, tier: str, now: float) -> None:
        """The tier finished at `now`: due again one interval later, plus up to jitterFraction more."""
        self.last_run[tier] = now
        jitter = self.interval(tier) * self.cfg.jitter_fraction * self.rng.random()
        self.next_due[tier] = now + self.interval(tier) + jitter

    def reschedule_all(self) -> None:
        """After a config change: a shorter interval takes effect at once."""
        for tier in TIER_INPUTS:
            if tier in self.last_run:
                self.next_due[tier] = min(self.next_due[tier], self.last_run[tier] + self.interval(tier))

    def due_tiers(self, now: float) -> list[str]:
        return [t for t, due in self.next_due.items() if due <= now]

    def seconds_to_next(self, now: float) -> float:
        return max(0.0, min(self.next_due.values()) - now)
