"""The parts of a Kubernetes Node object the checks need: labels, GPU capacity/allocatable, boot id.

Reads `kubectl get node -o json` text (snapshots) or a dict (the agent passes API objects through
the client's sanitize_for_serialization, which yields the same camelCase JSON shape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agent.core.node import NodeObject
from agent.core.probed import ParseError

GPU_RESOURCE = "nvidia.com/gpu"
_QUANTITY = re.compile(r"^\s*(\d+)\s*$")


def _gpus(resources: Any, where: str) -> int | None:
    """A GPU count from status.allocatable/capacity: "8" or 8; absent → None."""
    if resources is None:
        return None
    if not isinstance(resources, Mapping):
        raise ParseError(f"{where} is not a mapping")
    value = resources.get(GPU_RESOURCE)
    if value is None:
        return None
    if isinstance(value, bool):
        raise ParseError(f"{where}[{GPU_RESOURCE!r}] is not a quantity: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _QUANTITY.match(value)
        if m:
            return int(m.group(1))
    raise ParseError(f"{where}[{GPU_RESOURCE!r}] is not a whole number: {str(value)[:30]!r}")


def node_from_dict(obj: Mapping[str, Any]) -> NodeObject:
    """Build a NodeObject from a Node as a JSON-shaped dict; ParseError if it is not a Node."""
    if not isinstance(obj, Mapping):
        raise ParseError("node object is not a mapping")
    kind = obj.get("kind")
    if kind is not None and kind != "Node":
        raise ParseError(f"expected kind Node, got {str(kind)[:40]!r}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ParseError("node object has no metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ParseError("node object has no metadata.name")
    labels_raw = meta.get("labels")
    labels_raw = {} if labels_raw is None else labels_raw
    if not isinstance(labels_raw, Mapping):
        raise ParseError("metadata.labels is not a mapping")
    labels = {str(k): str(v) for k, v in labels_raw.items()}
    ann_raw = meta.get("annotations") or {}
    annotations = {str(k): str(v) for k, v in ann_raw.items()} if isinstance(ann_raw, Mapping) else {}
    status = obj.get("status")
    status = {} if status is None else status
    if not isinstance(status, Mapping):
        raise ParseError("status is not a mapping")
    info = status.get("nodeInfo")
    info = {} if info is None else info
    if not isinstance(info, Mapping):
        raise ParseError("status.nodeInfo is not a mapping")
    boot_id = info.get("bootID")
    spec = obj.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    taints = taints if isinstance(taints, list) else []
    taint_keys = tuple(str(t["key"]) for t in taints if isinstance(t, Mapping) and "key" in t)
    return NodeObject(
        name=name,
        labels=labels,
        annotations=annotations,
        allocatable_gpus=_gpus(status.get("allocatable"), "status.allocatable"),
        capacity_gpus=_gpus(status.get("capacity"), "status.capacity"),
        boot_id=boot_id if isinstance(boot_id, str) and boot_id else None,
        taint_keys=taint_keys,
        created=str(meta["creationTimestamp"]) if isinstance(meta.get("creationTimestamp"), str) else None,
    )


def parse_node_json(text: str) -> NodeObject:
    """Parse `kubectl get node NAME -o json` output."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"node.json is not valid JSON: {str(exc)[:80]}") from None
    if not isinstance(doc, Mapping):
        raise ParseError("node.json is not a JSON object")
    if doc.get("kind") != "Node":
        raise ParseError(f"node.json: expected kind Node, got {str(doc.get('kind'))[:40]!r}")
    return node_from_dict(doc)
