"""This node's ResourceSlices of NVIDIA's DRA driver (gpu.nvidia.com), parsed into what the checks
read (core/dra). Two sources, one parser: the agent's slice watch hands the API's JSON objects
(resource.k8s.io/v1; reporters/published_slices.py), a snapshot holds `resourceslices.json`
(`kubectl get resourceslices --field-selector spec.nodeName=NODE,spec.driver=gpu.nvidia.com -o json`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agent.core.device_scope import DRIVER, PCI_ATTRIBUTE, UUID_ATTRIBUTE
from agent.core.dra import DeviceTaint, DraDevice, DraSlices
from agent.core.pci import normalize_pci
from agent.core.probed import ParseError

TYPE, PARENT_UUID, PRODUCT = "type", "parentUUID", "productName"


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ParseError(f"{where} is not a mapping")
    return value


def _text(attrs: Mapping[str, Any], key: str) -> str:
    """A string attribute ({"string": "..."}); "" where absent or of another kind."""
    value = attrs.get(key)
    return str(value.get("string") or "") if isinstance(value, Mapping) else ""


def _device(raw: Any, pool: str, where: str) -> DraDevice:
    d = _mapping(raw, where)
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ParseError(f"{where} has no name")
    body = _mapping(d.get("basic"), f"{where}.basic") or d  # v1beta1 nests them under `basic`
    attrs = _mapping(body.get("attributes"), f"{where}.attributes")
    pci = _text(attrs, PCI_ATTRIBUTE)
    taints = tuple(
        DeviceTaint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in body.get("taints") or ()
        if isinstance(t, Mapping) and t.get("key")
    )
    return DraDevice(
        name=name,
        pool=pool,
        type=_text(attrs, TYPE),
        pci=normalize_pci(pci) if pci else "",
        uuid=_text(attrs, UUID_ATTRIBUTE),
        parent_uuid=_text(attrs, PARENT_UUID),
        product=_text(attrs, PRODUCT),
        taints=taints,
    )


def slices_from_objects(objects: Iterable[Any], node_name: str | None) -> DraSlices:
    """The gpu.nvidia.com devices of *node_name* (None: the one node the slices name). Per pool only
    its newest generation counts; fewer of its slices than it declares (`resourceSliceCount`) is a
    republish under way, said in `incomplete`."""
    pools: dict[str, list[tuple[int, int, list[DraDevice]]]] = {}
    nodes: set[str] = set()
    for i, raw in enumerate(objects):
        obj = _mapping(raw, f"slice {i}")
        spec = _mapping(obj.get("spec"), f"slice {i}: spec")
        if spec.get("driver") != DRIVER:
            continue
        node = str(spec.get("nodeName") or "")
        if node_name is not None and node != node_name:
            continue
        nodes.add(node)
        pool = _mapping(spec.get("pool"), f"slice {i}: spec.pool")
        pool_name = str(pool.get("name") or "")
        try:
            generation, count = int(pool.get("generation") or 0), int(pool.get("resourceSliceCount") or 1)
        except (TypeError, ValueError):
            raise ParseError(f"slice {i}: spec.pool generation/resourceSliceCount are not numbers") from None
        raw_devices = spec.get("devices") or []
        if not isinstance(raw_devices, list):
            raise ParseError(f"slice {i}: spec.devices is not a list")
        devices = [_device(d, pool_name, f"slice {i}: device {j}") for j, d in enumerate(raw_devices)]
        pools.setdefault(pool_name, []).append((generation, count, devices))
    if node_name is None and len(nodes) > 1:
        raise ParseError(f"slices of {len(nodes)} nodes ({', '.join(sorted(nodes)[:3])}) and no node to pick")
    out: list[DraDevice] = []
    incomplete: list[str] = []
    listed = 0
    for name, entries in sorted(pools.items()):
        newest = max(g for g, _, _ in entries)
        current = [(c, devs) for g, c, devs in entries if g == newest]
        declared = max(c for c, _ in current)
        listed += len(current)
        if len(current) < declared:
            incomplete.append(f"pool {name}: {len(current)} of its {declared} slices of generation {newest}")
        out += [d for _, devs in current for d in devs]
    why = "; ".join(incomplete)
    if why:
        why = f"the DRA driver is republishing ({why})"
    return DraSlices(node_name or next(iter(nodes), ""), tuple(out), listed, why)


def parse_slices_json(text: str, node_name: str | None) -> DraSlices:
    """`kubectl get resourceslices -o json`: a list (its `items`) or one ResourceSlice."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"resourceslices.json is not valid JSON: {str(exc)[:80]}") from None
    if not isinstance(doc, Mapping):
        raise ParseError("resourceslices.json is not a JSON object")
    if doc.get("kind") == "ResourceSlice":
        return slices_from_objects([doc], node_name)
    items = doc.get("items")
    if not isinstance(items, list):
        raise ParseError(f"resourceslices.json: expected ResourceSlices, got kind {doc.get('kind')!r}")
    return slices_from_objects(items, node_name)
