"""`gpu-healthcheck status NODE --history`: the Node's own history (the `<prefix>/history`
annotation, core/history_annotation.py), oldest first: when, the status, the worst finding's key, what
was done and by whom. It outlives the Events the API server drops after an hour; it goes with the
Node object (a replaced node starts empty)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import yaml

from agent.cli.status_time import age
from agent.core.history_annotation import MAX_ENTRIES, Entry, parse
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, node_path

HISTORY_HEADER = ("WHEN", "STATUS", "KEY", "ACTION", "BY")


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


def read_node(core: Any, name: str) -> dict[str, Any]:
    """The Node as API JSON; API errors (404 included) propagate to the CLI."""
    return KubeRest.of(core).json("GET", node_path(name), timeout=REQUEST_TIMEOUT)


__all__ = ["HISTORY_HEADER", "history_of", "history_rows", "read_node", "render_history"]
