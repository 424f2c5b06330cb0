"""The Node writer's hooks (metrics): what they are told, and the call that keeps a failing hook
from breaking a write."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.reporters.node_story import NodeState

log = logging.getLogger("agent.reporters.node_writer")

OnWrite = Callable[[str, str], None]  # (kind, outcome)
OnRefused = Callable[[str, int], None]  # (kind, HTTP code): the metric of refused writes
OnState = Callable[[NodeState], None]  # what the Node shows of our marks, whenever it may change


def guarded(name: str, hook: Callable[..., None] | None, *args: Any) -> None:
    """Call a metrics hook: one that fails is logged and never breaks writing."""
    if hook is not None:
        try:
            hook(*args)
        except Exception:
            log.exception("%s hook failed", name)


__all__ = ["OnRefused", "OnState", "OnWrite", "guarded"]
