"""A node whose only failures are isolated GPUs is degraded, not failed (DESIGN.md §3.7).

With per-GPU isolation (node.isolation gpu|auto, mode taint) a fault confined to some GPUs goes on
their DRA devices as DeviceTaintRules and the node keeps serving the rest. Its marks must say that,
or an operator drains a node the product chose to keep in service and a dashboard counting `fail`
overstates the lost capacity eight times. Whether the rules are in place is known only to the
device-taint writer (the server must accept them), so the engine writes both versions of one
verdict: Marks as today, and `Marks.degraded`, the same verdict as a degraded node, which the writer
shows only where every failing GPU is isolated by a rule the server accepted
(reporters/device_isolation.py). Otherwise the Node reads `fail` and is tainted, as before: never
open.

The degraded version: status `degraded` (GPUHealthy True, reason GPUsIsolated: as a node it
serves), the label `gpus-in-service=7-of-8`, the condition and the health Event naming the isolated
GPUs and the step for when the node is drained, the results annotation's `inService`, and in
`would` what mode taint does there (isolate, not taint the node). The remediation conditions follow
our node taint, which stays off, so isolated GPUs alone never mark a node for repair; enough of
them at once (node.isolationNodeAtGpus) make the scope node-wide before this is asked
(core/device_scope.confined_scope).

Pure: built from what the engine decided; nothing here reads the Node or the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.core.device_scope import Scope, confined_scope, finding_pcis
from agent.core.findings import CheckResult, Verdict
from agent.core.gpu import GpuInventory
from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import CONDITION_MESSAGE_MAX, EventReason
from agent.core.pci import normalize_pci, short_pci
from agent.core.results_doc import IN_SERVICE_FIELD, WOULD_FIELD, decode_results, encode
from agent.core.severity import Severity, Status


def still_shown(last: Status | None, status: Status) -> Status:
    """What the Node shows after a verdict of *status*: a degraded Node stays so while the verdict
    fails, as only the writer knows whether it still isolates (ApplyResult.shown), and a write
    skipped as unchanged must not forget it."""
    return Status.DEGRADED if last is Status.DEGRADED and status is Status.FAIL else status


def amended(marks: Marks, change: Callable[[Marks], Marks]) -> Marks:
    """*change* applied to the Marks and to their degraded version alike: what the loop adds after
    the engine built them (a rejected config's note, the Events it holds) must reach the Node
    whichever version the writer shows."""
    degraded = change(marks.degraded) if marks.degraded is not None else None
    return replace(change(marks), degraded=degraded)


def gpu_index(inventory: Any) -> dict[str, int | None]:
    """Normalised PCI address → the GPU's index (minor number where known), every GPU listed."""
    if not isinstance(inventory, GpuInventory):
        return {}
    out: dict[str, int | None] = {}
    for g in inventory.gpus:
        out[normalize_pci(g.pci_bus_id)] = g.index
    for pci in inventory.silent:
        out.setdefault(pci, None)
    return out


def gpu_label(pci: str, index: int | None) -> str:
    return f"GPU {index} ({short_pci(pci)})" if index is not None else f"GPU {short_pci(pci)}"


def gpu_notes(
    results: Sequence[CheckResult], scope: Scope, gpus: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """Per isolated GPU: its worst failing finding and the pods on it (the GPUIsolated Event's)."""
    pods = {normalize_pci(str(e.get("pci", ""))): list(e.get("pods", ())) for e in gpus}
    out: dict[str, str] = {}
    for pci in scope.gpus:
        failing = [
            (f.severity, r.name, f.message)
            for r in results
            for f in r.findings
            if f.severity >= Severity.RESET and pci in finding_pcis(f)
        ]
        worst = max(failing, key=lambda x: x[0], default=None)
        text = f"{worst[1]}: {worst[2]}" if worst else "failing"
        held = pods.get(pci) or []
        out[pci] = text + (f"; pods on it: {', '.join(held)}" if held else "; no pod holds it")
    return out


def isolable(results: Sequence[CheckResult], inventory: Any, scope: Scope | None, verdict: Verdict) -> bool:
    """Every failing finding (reset or worse) lies on the GPUs *scope* confines the taint to: nothing
    failing is left outside what the rules would isolate."""
    if verdict.status is not Status.FAIL or scope is None or scope.node_wide or not scope.gpus:
        return False
    failing = confined_scope(results, inventory, Severity.RESET)
    return failing is not None and not failing.node_wide and set(failing.gpus) <= set(scope.gpus)


def degraded_marks(
    base: Marks,
    *,
    verdict: Verdict,
    scope: Scope,
    inventory: Any,
    last_status: Status | None,
    health_event: NodeEvent | None,
) -> Marks:
    """*base* (the verdict's Marks, status fail) written as a degraded node."""
    index = gpu_index(inventory)
    total = len(index) or len(scope.gpus)
    isolated = [gpu_label(p, index.get(p)) for p in scope.gpus]
    serving = max(0, total - len(scope.gpus))
    note = f"{serving} of {total} GPUs in service; isolated: {', '.join(isolated)}"
    worst = verdict.worst
    step = f"{worst.recommendation.describe()} when drained" if worst is not None else ""
    message = base.condition_message
    body = message.split(": ", 1)[1] if ": " in message else message
    if step and "→" not in body:
        body = f"{body} → {step}"
    condition = f"{Status.DEGRADED.value} ({note}): {body}"
    events = tuple(e for e in base.events if e is not health_event)
    if last_status is not Status.DEGRADED:
        was = last_status.value if last_status else "none"
        what = f"{worst.check}: {worst.message}" if worst is not None else ""
        events = (
            NodeEvent(
                EventReason.GPU_HEALTH_CHANGED,
                f"{was} → {Status.DEGRADED.value}: {note}; the node serves its other GPUs: {what}"
                + (f" → {step}" if step else ""),
            ),
            *events,
        )
    doc = decode_results(base.results_json) or {}
    doc["status"] = Status.DEGRADED.value
    doc[IN_SERVICE_FIELD] = {
        "gpus": total,
        "serving": serving,
        "isolated": [{"pci": short_pci(p), "index": index.get(p)} for p in scope.gpus],
    }
    would = doc.get(WOULD_FIELD)
    if isinstance(would, dict) and "taint" in would:
        would = {("isolate" if k == "taint" else k): v for k, v in would.items() if k != "mark"}
        doc[WOULD_FIELD] = would
    return replace(
        base,
        status=Status.DEGRADED,
        condition_message=condition[:CONDITION_MESSAGE_MAX],
        events=events,
        results_json=encode(doc),
        in_service=f"{serving}-of-{total}",
        degraded=None,
    )


__all__ = [
    "amended",
    "degraded_marks",
    "gpu_index",
    "gpu_label",
    "gpu_notes",
    "isolable",
    "still_shown",
]
