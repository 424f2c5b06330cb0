"""`gpu-healthcheck status NODE --history`: the Node's own history (the `<prefix>/history`
annotation, core/history_annotation.py), oldest first: when, the status, the worst finding's key, what
was done and by whom. It outlives the Events the API server drops after an hour; it goes with the
Node object (a replaced node starts empty). And `status NODE`'s GPU RISK lines: each GPU's failure
episodes and repairs under per-GPU isolation (core/node_risk.py), with its risk as the agent judged
it (the results annotation's per-GPU `risk`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import yaml

from agent.cli.status_time import age
from agent.core.history_annotation import MAX_DAYS, MAX_ENTRIES, Entry, parse, parse_gpu_counts
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.core.results_doc import decode_results
from agent.reporters.kube_rest import KubeRest, node_path

HISTORY_HEADER = ("WHEN", "STATUS", "KEY", "ACTION", "BY")
REQUEST_TIMEOUT = (5, 30)


def history_of(node: Mapping[str, Any], prefix: str = DEFAULT_PREFIX) -> list[Entry]:
    """Pure: the entries of a Node (API JSON), oldest first ([] without the annotation)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return parse(annotations.get(Keys(prefix).history))


def action(entry: Entry) -> str:
    """What was done; a change of status alone shows as "-"."""
    return entry.did.replace("+", ", ") or "-"


def history_rows(entries: Sequence[Entry], now: datetime) -> list[tuple[str, ...]]:
    return [
        (f"{e.at} ({age(e.at, now)} ago)", e.status, e.key or "-", action(e), e.by or "-") for e in entries
    ]


def render_history(
    node: Mapping[str, Any], *, prefix: str = DEFAULT_PREFIX, fmt: str = "table", now: datetime | None = None
) -> str:
    """-o table | wide (the same table) | json | yaml."""
    from agent.cli.status import format_table  # the one table layout of `status`

    entries = history_of(node, prefix)
    if fmt == "json":
        return json.dumps([e.as_dict() for e in entries], indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        return str(yaml.safe_dump([e.as_dict() for e in entries], sort_keys=False, allow_unicode=True))
    name = (node.get("metadata") or {}).get("name", "?")
    if not entries:
        return f"{name}: no history yet (annotation {Keys(prefix).history} absent)\n"
    out = format_table(history_rows(entries, now or datetime.now(timezone.utc)), HISTORY_HEADER)
    return out + f"{name}: the last {len(entries)} of at most {MAX_ENTRIES} transitions, oldest first\n"


def gpu_risk_lines(node: Mapping[str, Any], prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Pure: the GPU RISK section of `status NODE` ([] when no GPU has counts): per GPU, as the
    per-GPU verdict names it, the agent's `high`, and its counts over the days kept."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    keys = Keys(prefix)
    counts = parse_gpu_counts(annotations.get(keys.history))
    if not counts:
        return []
    verdicts = (decode_results(annotations.get(keys.results)) or {}).get("gpus") or []
    named = {str(g.get("pci")): g for g in verdicts if isinstance(g, Mapping) and g.get("pci")}
    rows = []
    for pci, days in sorted(counts.items()):
        g = named.get(pci, {})
        dra = f", {g['dra']}" if g.get("dra") else ""
        name = f"GPU {g['index']} ({pci}{dra})" if g.get("index") is not None else pci
        episodes, repairs = sum(v[0] for v in days.values()), sum(v[1] for v in days.values())
        when = f"{min(days)} to {max(days)}" if days else "-"
        rows.append(
            f"  {name:<30} {g.get('risk') or '-':<6} "
            f"{episodes} failure episode(s), {repairs} repair(s), {when}"
        )
    head = (
        f"GPU RISK (per-GPU isolation: each GPU's episodes and repairs of the last {MAX_DAYS} days; "
        "`high` as the agent judges it by node.risk)"
    )
    return [head, *rows]


def read_node(core: Any, name: str) -> dict[str, Any]:
    """The Node as API JSON; API errors (404 included) propagate to the CLI."""
    return KubeRest.of(core).json("GET", node_path(name), timeout=REQUEST_TIMEOUT)


__all__ = ["HISTORY_HEADER", "gpu_risk_lines", "history_of", "history_rows", "read_node", "render_history"]
