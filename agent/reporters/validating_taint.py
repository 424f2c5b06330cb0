"""The validating and testing taints in the Node PATCH (engine/validation.py says when the validating
taint goes on and off, core/active_checks.py the testing one).

The taints are an atomic list in the API: the writer sends the Node's own list with only our taints
changed, under the Node's resourceVersion (a 409 re-reads and plans again), so another component's
taints are never touched. Here only `<prefix>/validating` or `<prefix>/testing` is added or removed;
every other entry is kept as it is, in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.node_keys import TESTING_EFFECT, VALIDATING_EFFECT, Keys


def with_taint(
    taints: list[dict[str, Any]], want: bool | None, key: str, effect: str
) -> list[dict[str, Any]] | None:
    """*taints* with the taint *key* on (*want* True) or off (False); None when nothing changes
    (*want* None leaves it as it is, wherever it came from)."""
    present = any(_key(t) == key for t in taints)
    if want is None or want == present:
        return None
    if want:
        return [*taints, {"key": key, "effect": effect}]
    return [t for t in taints if _key(t) != key]


def with_validating(
    taints: list[dict[str, Any]], want: bool | None, prefix: str
) -> list[dict[str, Any]] | None:
    return with_taint(taints, want, Keys(prefix).validating, VALIDATING_EFFECT)


def with_testing(taints: list[dict[str, Any]], want: bool | None, prefix: str) -> list[dict[str, Any]] | None:
    return with_taint(taints, want, Keys(prefix).testing, TESTING_EFFECT)


def _key(taint: Mapping[str, Any]) -> Any:
    return taint.get("key")


__all__ = ["with_taint", "with_testing", "with_validating"]
