"""Text the agent shows people (messages in the results, conditions, tables), kept within a limit."""

from __future__ import annotations

from collections.abc import Iterable

ELLIPSIS = "…"


def shorten(text: str, limit: int) -> str:
    """`text` when it fits, else cut to `limit` characters ending in an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def id_ranges(ids: Iterable[int]) -> str:
    """(0, 1, 2, 5) → "0-2,5": the kernel's cpulist form, as nvidia-smi prints CPU and NUMA affinity
    too (the ids in the order given; a run is consecutive ids)."""
    spans: list[str] = []
    start = prev = None
    for n in ids:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            spans.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = n
    if start is not None:
        spans.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(spans)
