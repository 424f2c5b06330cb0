"""The writer's side of the Node's history (core/history_annotation.py): the entry a change adds, sent in
the Node PATCH of that change, and the one correction a repair hold can need afterwards.

The entry records the Marks (status, worst key, boot), the taint as decided for this PATCH (on,
held by the brake, refused by the `<prefix>/taint=disabled` label), a `clear` the Marks consume
(its requester from `<prefix>/clear-latched-by`), an operator's diag whose request the Marks remove
(it started; its requester from `<prefix>/diag-requested`), and the remediation marks. Those turn unhealthy
in the status PATCH after the Node PATCH, once the repair budget and the wave hold are asked, so the
entry says what they will show: a mark newly wanted with our taint is `on`, one the Node shows held
stays held. `settle` compares the last entry with the Node after the apply and, only where a hold
began or ended, corrects it in a small merge patch of this annotation alone. In the steady state the
Node shows what the last entry says: nothing is added, nothing is written.

Per-GPU isolation: the device-taint writer names the GPUs its rules hold (marks.isolated); the
annotation's first element keeps them, and a change of them counts per GPU (core/node_risk.py
gpu_tally) in the PATCH of that change, with or without an entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from agent.core.active_checks import DiagRequest
from agent.core.history_annotation import (
    Entry,
    HistoryMark,
    HistoryTaint,
    append,
    encode,
    parse,
    parse_counts,
    parse_gpu_counts,
    parse_isolated,
    transition,
)
from agent.core.marks import ClearRequest, Marks
from agent.core.node_keys import Keys
from agent.core.node_risk import add, add_gpus, day_of, gpu_tally, tally
from agent.core.pci import short_pci
from agent.core.remediation_types import RemediationReason
from agent.core.results_doc import now_iso
from agent.reporters.node_patch import annotations_of, find_condition
from agent.reporters.taint_gate import TaintDecision

HELD: dict[str, HistoryMark] = {
    RemediationReason.BUDGET_HELD: HistoryMark.HELD_BY_BUDGET,
    RemediationReason.WAVE_HELD: HistoryMark.HELD_BY_WAVE,
}


def taint_state(decided: TaintDecision) -> HistoryTaint:
    if decided.taint_on:
        return HistoryTaint.ON
    if decided.brake_open:
        return HistoryTaint.HELD
    return HistoryTaint.DISABLED if decided.disabled else HistoryTaint.OFF


def shown_mark(node: Mapping[str, Any], marks: Marks, *, planned: bool = False) -> HistoryMark:
    """The remediation marks as the Node shows them: `on` when one is at its unhealthy status, else
    the hold one of them names (budget, wave), else "". *planned* (our taint is on): a mark the
    engine wants that the Node does not show held counts as `on`, as the status PATCH will show it."""
    state = HistoryMark.MARK_OFF
    for m in marks.remediation:
        cond = find_condition(node, m.type) or {}
        if cond.get("status") == m.unhealthy_status:
            return HistoryMark.MARK_ON
        held = (
            HELD.get(str(cond.get("reason")), HistoryMark.MARK_OFF) if m.unhealthy else HistoryMark.MARK_OFF
        )
        if planned and m.unhealthy and not held:
            return HistoryMark.MARK_ON
        state = state or held
    return state


def cleared_by(node: Mapping[str, Any], marks: Marks, keys: Keys) -> str | None:
    """The requester of a clear these Marks consume ("" unnamed); None when they consume none."""
    ann = annotations_of(node)
    if keys.clear_latched not in marks.drop_annotations or keys.clear_latched not in ann:
        return None
    request = ClearRequest.decode(ann.get(keys.clear_latched_by))
    return request.by if request is not None else ""


def isolated_gpus(devices: Iterable[Any]) -> tuple[str, ...]:
    """The GPUs of these DRA devices (core/device_scope.Device) as the history names them: the PCI
    address (`0000:86:00.0`), else the device's name."""
    return tuple(sorted({short_pci(d.pci) if d.pci else str(d.name) for d in devices}))


def diag_by(node: Mapping[str, Any], marks: Marks, keys: Keys) -> str | None:
    """The requester of a diag whose request these Marks remove, as it started ("" unnamed); None
    when they remove none."""
    ann = annotations_of(node)
    if keys.diag_requested not in marks.drop_annotations or keys.diag_requested not in ann:
        return None
    return DiagRequest.decode(ann.get(keys.diag_requested)).by


class History:
    """One writer's history keeping (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.keys = Keys(prefix)
        self.added: Entry | None = None  # the entry the last planned Node PATCH adds

    def _entries(self, node: Mapping[str, Any]) -> list[Entry]:
        return parse(annotations_of(node).get(self.keys.history))

    def annotation(self, node: Mapping[str, Any], marks: Marks, decided: TaintDecision) -> dict[str, str]:
        """{key: value} to send with the Node PATCH that makes *node* show *marks*; {} when it adds
        no entry."""
        raw = annotations_of(node).get(self.keys.history)
        entries = parse(raw)
        before = parse_isolated(raw)
        now = before if marks.isolated is None else tuple(sorted(set(marks.isolated)))
        self.added = transition(
            entries[-1] if entries else None,
            at=now_iso(),
            status=marks.status.value,
            key=marks.worst_key,
            boot=marks.boot_id,
            taint=taint_state(decided),
            mark=shown_mark(node, marks, planned=True) if decided.taint_on else HistoryMark.MARK_OFF,
            cleared_by=cleared_by(node, marks, self.keys),
            diag_by=diag_by(node, marks, self.keys),
            clear_kept=bool(marks.clear_kept),
        )
        if self.added is None and now == before:
            return {}
        # the counts the risk label reads (core/node_risk.py), per day and per GPU, in the same PATCH
        day = day_of(self.added.at if self.added is not None else now_iso())
        gpus = add_gpus(parse_gpu_counts(raw), day, gpu_tally(entries, self.added, before, now))
        counts = parse_counts(raw)
        if self.added is not None:
            counts = add(counts, day, tally(entries, self.added, before, now))
            entries = append(entries, self.added)
        return {self.keys.history: encode(entries, counts, gpus, now)}

    def _encode(self, node: Mapping[str, Any], entries: list[Entry]) -> str:
        """*entries* with the Node's counts and GPUs isolated as they are."""
        raw = annotations_of(node).get(self.keys.history)
        return encode(entries, parse_counts(raw), parse_gpu_counts(raw), parse_isolated(raw))

    def settle(self, node: Mapping[str, Any], marks: Marks) -> dict[str, Any] | None:
        """After the apply: the merge patch that makes the last entry's marks what *node* shows,
        or None. The entry this apply added is corrected in place; otherwise one is added."""
        if not marks.remediation:
            return None
        entries = self._entries(node)
        if not entries:
            return None
        last = entries[-1]
        mark = shown_mark(node, marks) if last.taint == HistoryTaint.ON else HistoryMark.MARK_OFF
        if mark == last.mark:
            return None
        if self.added is not None and self.added == last:
            base = entries[-2] if len(entries) > 1 else None
            fixed = transition(
                base,
                at=last.at,
                status=last.status,
                key=last.key,
                boot=last.boot,
                taint=last.taint,
                mark=mark,
                cleared_by=last.by if last.cleared else None,
                diag_by=last.by if last.diagnosed else None,
            )
            entries = [*entries[:-1], fixed or replace(last, mark=mark)]
        else:
            fixed = transition(
                last,
                at=now_iso(),
                status=last.status,
                key=last.key,
                boot=last.boot,
                taint=last.taint,
                mark=mark,
            )
            entries = append(entries, fixed) if fixed else entries
        self.added = None
        return {"metadata": {"annotations": {self.keys.history: self._encode(node, entries)}}}


__all__ = ["History", "cleared_by", "diag_by", "isolated_gpus", "shown_mark", "taint_state"]
