"""`gpu-healthcheck status`: the GPUs in service per node and its device taints (the fleet table's
GPUS and DEVICE TAINTS columns), and the degraded nodes' summary line.

With per-GPU isolation one bad GPU is a node with seven good ones (engine/degraded.py): the table
says how many GPUs of each node serve (`7/8`; `0/8` under our node taint) and which devices are
tainted, ours (DeviceTaintRules, one LIST for the whole fleet) and the DRA driver's own (as the agent
saw them in its ResourceSlices: the results annotation's per-GPU `driverTaints`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.core.results_doc import IN_SERVICE_FIELD
from agent.core.severity import Status
from agent.reporters.device_taint_rules import discover, selected_device, taint_of
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest

DRIVER_TAINTS_FIELD = "driverTaints"  # a GPU entry's: the DRA driver's taints on its device


def in_service(results: Mapping[str, Any] | None, listed: int, tainted: bool) -> str:
    """The GPUS column: serving/total. Degraded: the annotation's count; our node taint on: none
    serve; otherwise all listed; "-" where the agent lists no GPU."""
    doc = (results or {}).get(IN_SERVICE_FIELD)
    if isinstance(doc, Mapping) and isinstance(doc.get("gpus"), int) and isinstance(doc.get("serving"), int):
        return f"{doc['serving']}/{doc['gpus']}"
    if not listed:
        return "-"
    return f"0/{listed}" if tainted else f"{listed}/{listed}"


def driver_taints(results: Mapping[str, Any] | None) -> list[str]:
    """The DRA driver's device taints the agent saw, "gpu-2:gpu.nvidia.com/xid=48:NoExecute"."""
    out = []
    for entry in (results or {}).get("gpus") or ():
        if not isinstance(entry, Mapping):
            continue
        for taint in entry.get(DRIVER_TAINTS_FIELD) or ():
            out.append(f"{entry.get('dra') or entry.get('index', '?')}:{taint}")
    return out


def fleet_rules(core: Any, prefix: str) -> dict[str, list[str]] | None:
    """Our DeviceTaintRules by node label value: "gpu-3=reboot:NoExecute"; None where no version
    is served or they cannot be read (the column then says "?")."""
    try:
        api = discover(core)
        if api is None:
            return None
        doc = KubeRest.of(core).json(
            "GET", api.path, query={"labelSelector": f"{prefix}/node"}, timeout=REQUEST_TIMEOUT
        )
    except Exception:
        return None
    out: dict[str, list[str]] = {}
    for rule in doc.get("items") or ():
        node = ((rule.get("metadata") or {}).get("labels") or {}).get(f"{prefix}/node", "")
        t = taint_of(rule)
        out.setdefault(str(node), []).append(
            f"{selected_device(rule)['device']}={t.get('value', '')}:{t.get('effect', '')}"
        )
    return {k: sorted(v) for k, v in out.items()}


def taints_cell(ours: Sequence[str] | None, driver: Sequence[str]) -> str:
    """The DEVICE TAINTS column: ours, then the driver's (marked `driver`), "-" when none."""
    cells = [*(ours or ()), *(f"driver {d}" for d in driver)]
    return ", ".join(cells) if cells else "-"


def degraded_lines(rows: Sequence[tuple[str, str, str]]) -> list[str]:
    """(node, status, GPUS) → "degraded: 2 nodes serve with GPUs isolated: a (7/8), b (6/8)"."""
    hit = [f"{node} ({gpus})" for node, status, gpus in rows if status == Status.DEGRADED.value]
    if not hit:
        return []
    nodes = "node serves" if len(hit) == 1 else "nodes serve"
    return [
        f"degraded: {len(hit)} {nodes} with GPUs isolated (not tainted, not for repair): {', '.join(hit)}"
    ]


__all__ = ["degraded_lines", "driver_taints", "fleet_rules", "in_service", "taints_cell"]
