"""`gpu-healthcheck status`: one line per GPU node from what the agents wrote on the Nodes (DESIGN.md §4).

It reads only the Node objects (labels and the results annotation), so it works from any laptop with a
kubeconfig and needs no access to the agents themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from agent.core.contract import DEFAULT_PREFIX, Keys, decode_results
from agent.core.gpu_nodes import DEFAULT_GPU_NODE_SELECTORS
from agent.core.severity import Severity
from agent.core.text import shorten
from agent.reporters.kube_rest import KubeRest

HEADER = ("NODE", "STATUS", "SEVERITY", "WORST FINDING", "LAST CHECK AGE")
STATUS_ORDER = {"fail": 0, "unknown": 1, "warn": 2, "pass": 3}
CHECK_STATUS_RANK = {"fail": 3, "unknown": 2, "warn": 1}
FINDING_WIDTH = 80
REQUEST_TIMEOUT = (5, 60)


def _severity(text: Any) -> Severity:
    try:
        return Severity.parse(str(text))
    except ValueError:
        return Severity.NONE


def worst_finding(results: Mapping[str, Any] | None) -> str:
    """The message of the most severe non-passing check (then latched finding), or "-"."""
    if not results:
        return "-"
    best: tuple[int, int] | None = None
    text = "-"
    for c in results.get("checks") or ():
        if not isinstance(c, Mapping):
            continue
        rank = CHECK_STATUS_RANK.get(str(c.get("status")), 0)
        if rank == 0:
            continue
        key = (int(_severity(c.get("severity"))), rank)
        if best is None or key > best:
            best, text = key, f"{c.get('name', '?')}: {c.get('message', '')}"
    for latch in results.get("latched") or ():
        if not isinstance(latch, Mapping):
            continue
        key = (int(_severity(latch.get("severity"))), 3)
        if best is None or key > best:
            best, text = key, f"{latch.get('check', '?')}: {latch.get('message', '')} (latched)"
    text = " ".join(text.split())
    return shorten(text, FINDING_WIDTH)


def age(checked_at: Any, now: datetime) -> str:
    """ "42s", "7m", "3h", "2d" since an RFC 3339 time; "-" when missing or unreadable."""
    if not isinstance(checked_at, str) or not checked_at:
        return "-"
    try:
        t = datetime.fromisoformat(checked_at.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    secs = max(0, int((now - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size * (2 if unit != "m" else 1):
            return f"{secs // size}{unit}"
    return f"{secs}s"


def status_rows(nodes: Sequence[Mapping[str, Any]], *, prefix: str, now: datetime) -> list[tuple[str, ...]]:
    """Pure: Node dicts (API JSON) -> table rows, fail first, then unknown, warn, pass, unmarked."""
    rows: list[tuple[int, int, str, tuple[str, ...]]] = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        keys = Keys(prefix)
        results = decode_results((meta.get("annotations") or {}).get(keys.results))
        status = labels.get(keys.status) or (results or {}).get("status") or "-"
        severity = labels.get(keys.severity) or (results or {}).get("severity") or "-"
        name = str(meta.get("name", "?"))
        row = (
            name,
            str(status),
            str(severity),
            worst_finding(results),
            age((results or {}).get("checkedAt"), now),
        )
        rows.append((STATUS_ORDER.get(str(status), 4), -int(_severity(severity)), name, row))
    rows.sort(key=lambda r: r[:3])
    return [r[3] for r in rows]


def format_table(rows: Sequence[Sequence[str]]) -> str:
    table = [HEADER, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines) + "\n"


def list_nodes(core: Any, selectors: Sequence[str]) -> list[dict[str, Any]]:
    """All Nodes matching any of *selectors* as API JSON (paged; each Node once)."""
    rest = KubeRest.of(core)
    nodes: dict[str, dict[str, Any]] = {}
    for selector in selectors:
        cont: str | None = None
        while True:
            query = {"labelSelector": selector, "limit": 500, "continue": cont}
            doc = rest.json("GET", "/api/v1/nodes", query=query, timeout=REQUEST_TIMEOUT)
            for item in doc.get("items") or ():
                nodes.setdefault(str((item.get("metadata") or {}).get("name")), item)
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                break
    return list(nodes.values())


def render_status(
    core: Any,
    *,
    prefix: str = DEFAULT_PREFIX,
    selectors: Sequence[str] = DEFAULT_GPU_NODE_SELECTORS,
    now: datetime | None = None,
) -> str:
    """The status table of every node matching any of *selectors*. API errors propagate to the CLI."""
    nodes = list_nodes(core, selectors)
    return format_table(status_rows(nodes, prefix=prefix, now=now or datetime.now(timezone.utc)))
