"""`gpu-healthcheck status NODE`: the node's per-GPU DeviceTaintRules and what became of them, and
beside them the taints NVIDIA's DRA driver put on its own devices (checks/dra_taints.py): never ours,
read from its ResourceSlices; and
each GPU's risk under per-GPU isolation (GPU RISK: its failure episodes and repairs from the history
annotation, core/node_risk.py; `high` as the agent judged it, the results annotation's per-GPU `risk`).

The rule's status (Kubernetes 1.35 and later) is written by kube-controller-manager's
device-taint-eviction controller: condition EvictionInProgress, with the pods it still has to evict
(NoExecute), has evicted, or would evict (effect None). A rule with no status yet has not been seen by
that controller (not running, its gate off, or just created). Read when asked, never by the agent
per cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.core.device_scope import DRIVER
from agent.core.history_annotation import MAX_DAYS, parse_gpu_counts
from agent.core.node_keys import DEFAULT_PREFIX, Keys
from agent.core.results_doc import decode_results
from agent.probes.dra_slices import slices_from_objects
from agent.reporters.device_taint_rules import (
    VERSIONS,
    RuleApi,
    discover,
    eviction_status,
    node_label,
    node_owner,
    selected_device,
    taint_of,
)
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, api_status, describe_error

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRIVER_HEAD = (
    f"NVIDIA's DRA driver's own taints ({DRIVER}, in its ResourceSlice; the agent never writes them)"
)


def rule_line(rule: Mapping[str, Any], node: str, api: RuleApi) -> str:
    """One rule: device, taint, whose, and the eviction controller's word on it."""
    meta = rule.get("metadata") or {}
    t = taint_of(rule)
    taint = f"{t.get('key', '')}={t.get('value', '')}:{t.get('effect', '')}"
    whose = "" if node_owner(rule, node) is not None else "  (not ours: no ownerReference to the Node)"
    cond = eviction_status(rule) if api.status else None
    if not api.status:
        said = f"status not served by {api.api_version}"
    elif cond is None:
        said = "no status yet (no device-taint-eviction controller has seen it)"
    else:
        said = f"EvictionInProgress={cond.get('status')} ({cond.get('reason')})"
        said += f": {cond['message']}" if cond.get("message") else ""
    return f"{selected_device(rule)['device']:<8} {taint:<40} {meta.get('name', '')}{whose}\n    {said}"


def device_taint_lines(core: Any, node: str, prefix: str, *, wide: bool = False) -> Sequence[str]:
    """The DEVICE TAINTS section of one node: empty when it has no rule and the driver none (and,
    unless *wide*, when no version is served); a line that says why where they cannot be read."""
    try:
        ours = _lines(core, node, prefix, wide)
    except Exception as exc:
        ours = [f"DEVICE TAINTS: cannot read them: {describe_error(exc)}"]
    theirs = driver_taint_lines(core, node)
    if not theirs:
        return ours
    return [*(ours or ["DEVICE TAINTS (none of ours)"]), *theirs]


def driver_taint_lines(core: Any, node: str) -> Sequence[str]:
    """The taints NVIDIA's DRA driver put on this node's devices, per GPU, under a line that says
    whose they are; [] when none (or no ResourceSlice is served)."""
    query = {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
    try:
        doc = KubeRest.of(core).json("GET", SLICES, query=query, timeout=REQUEST_TIMEOUT)
        gpus = slices_from_objects(doc.get("items") or (), node).gpus()
    except Exception as exc:
        if api_status(exc) == 404:
            return []
        return [f"{DRIVER_HEAD}: cannot read them: {describe_error(exc)}"]
    lines = [f"  {p.device or p.label:<8} {text}" for p in gpus for text in p.taint_texts()]
    return [f"{DRIVER_HEAD}:", *lines] if lines else []


def _lines(core: Any, node: str, prefix: str, wide: bool) -> Sequence[str]:
    api = discover(core)
    if api is None:
        return (
            []
            if not wide
            else [
                f"DEVICE TAINTS: the API server serves no DeviceTaintRules (resource.k8s.io "
                f"{', '.join(VERSIONS)}): per-GPU isolation falls back to the node taint"
            ]
        )
    doc = KubeRest.of(core).json(
        "GET", api.path, query={"labelSelector": f"{prefix}/node={node_label(node)}"}, timeout=REQUEST_TIMEOUT
    )
    rules = sorted(doc.get("items") or (), key=lambda r: selected_device(r)["device"])
    if not rules:
        return []
    return [f"DEVICE TAINTS ({api.api_version})", *(rule_line(r, node, api) for r in rules)]


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


__all__ = ["device_taint_lines", "driver_taint_lines", "gpu_risk_lines", "rule_line"]
