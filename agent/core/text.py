"""Text the agent shows people (messages in the results, conditions, tables), kept within a limit."""

from __future__ import annotations

ELLIPSIS = "…"


def shorten(text: str, limit: int) -> str:
    """`text` when it fits, else cut to `limit` characters ending in an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS
