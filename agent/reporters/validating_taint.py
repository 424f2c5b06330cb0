"""The validating taint in the Node PATCH (engine/validation.py says when it goes on and off).

The taints are an atomic list in the API: the writer sends the Node's own list with only our taints
changed, under the Node's resourceVersion (a 409 re-reads and plans again), so another component's
taints are never touched. Here only `<prefix>/validating` is added or removed; every other entry is
kept as it is, in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.node_keys import VALIDATING_EFFECT, Keys


def with_validating(
    taints: list[dict[str, Any]], want: bool | None, prefix: str
) -> list[dict[str, Any]] | None:
    """*taints* with the validating taint on (*want* True) or off (False); None when nothing
    changes (*want* None leaves it as it is, wherever it came from)."""
    key = Keys(prefix).validating
    present = any(_key(t) == key for t in taints)
    if want is None or want == present:
        return None
    if want:
        return [*taints, {"key": key, "effect": VALIDATING_EFFECT}]
    return [t for t in taints if _key(t) != key]


def _key(taint: Mapping[str, Any]) -> Any:
    return taint.get("key")


__all__ = ["with_validating"]
