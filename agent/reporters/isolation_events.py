"""The Events of per-GPU isolation (reporters/device_isolation.py): a GPU isolated, a GPU back in
service, and a degraded node that turns failed. Operators act on the Node's Events, so each names
the device, the rule and its taint, what fails the GPU and the pods on it, and what the node still
serves. Pure: the writer posts them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import WARNING, EventReason
from agent.core.pci import short_pci
from agent.core.severity import Status
from agent.reporters.device_taint_rules import Wanted


def isolated_events(wanted: Mapping[str, Wanted], new: set[str], marks: Marks, key: str) -> list[NodeEvent]:
    """GPUIsolated for each rule (*new*, of *wanted*) this apply put in place."""
    serving = marks.degraded.in_service.replace("-of-", " of ") if marks.degraded else ""
    tail = f"; the node serves {serving} GPUs" if serving else ""
    out = []
    for name in sorted(new):
        w = wanted[name]
        note = marks.gpu_notes.get(w.device.pci, "") or "failing"
        where = short_pci(w.device.pci) if w.device.pci else w.device.uuid
        out.append(
            NodeEvent(
                EventReason.GPU_ISOLATED,
                f"{w.device.name} ({where}) isolated by DeviceTaintRule {name} "
                f"({key}={w.value}:{w.effect}): {note}{tail}",
                WARNING,
            )
        )
    return out


def returned_events(gone: Mapping[str, str]) -> list[NodeEvent]:
    """GPUReturned for each rule removed (rule name → its device)."""
    return [
        NodeEvent(
            EventReason.GPU_RETURNED,
            f"{device or name} serves again: DeviceTaintRule {name} removed (the GPU recovered, or an "
            "operator cleared it)",
        )
        for name, device in sorted(gone.items())
    ]


def failed_again(node: Mapping[str, Any], status_label: str, node_marks: Marks, why: str) -> list[NodeEvent]:
    """A Node shown degraded that is written failed within one verdict (the rules refused, the fault
    no longer confined to isolated GPUs): the engine's health Event saw no change, so this says it."""
    shown = ((node.get("metadata") or {}).get("labels") or {}).get(status_label)
    if shown != Status.DEGRADED.value or node_marks.status is not Status.FAIL:
        return []
    return [
        NodeEvent(
            EventReason.GPU_HEALTH_CHANGED,
            f"{Status.DEGRADED.value} → {Status.FAIL.value}: {why}: {node_marks.condition_message}",
            WARNING,
        )
    ]


__all__ = ["failed_again", "isolated_events", "returned_events"]
