"""How a reloaded config reaches what the agent built once. Every long-lived part that holds
configuration (the engine, the Node writer, the brake, the repair budget, per-GPU isolation, the
probes' source, the DCGM client) is a LivePart: the wiring lists them once (cli/agent.py) and the
loop hands every reload to each of them, in that order (engine/loop.py). A part reads what it uses
from *new*, when it uses it or here; nothing sets a part's attributes from outside. The keys of
schema.RESTART_ONLY never change in *new* (config/watch.py keeps their old values)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent.config import Config


class LivePart(Protocol):
    def apply_config(self, old: Config, new: Config) -> None:
        """Take *new*, which a reload put in force in place of *old*."""
