"""Pure Node-patch planning (DESIGN.md §4): a Node (API JSON, camelCase) and the Marks in, what to write out.

No API here: the writer reads the Node, these functions say which of our keys differ, and the writer
sends just that. Labels and annotations are a JSON merge patch naming only our keys (null deletes
one); `spec.taints` appears only when our taint must change, and then it is the Node's own list with
only the taints of our key changed. Any taint with our key is ours whatever its effect (an effect
changed in config moves it; none is ever orphaned), and exactly one remains while the node is
tainted. The conditions (ours and node.remediationConditions) are entries of `status.conditions`,
planned together so that they go in one status PATCH. What a remediation condition says is decided
in engine/remediation.py (remediation_condition, given the taint decision): applied here, not made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent.core.marks import Marks
from agent.core.node_keys import DISABLED, TRUE, ConditionReason, Keys
from agent.core.remediation_reasons import FaultReason
from agent.core.remediation_types import OUR_REMEDIATION_REASONS, RemediationReason
from agent.core.repair_budget import Hold
from agent.engine.remediation import remediation_condition
from agent.reporters.validating_taint import with_testing, with_validating


def labels_of(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def annotations_of(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def taints_of(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or ()]


def our_taints(node: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Every taint with our key (`<prefix>/unhealthy`), whatever its effect: all of them are ours."""
    return [t for t in taints_of(node) if t.get("key") == Keys(prefix).taint]


def find_our_taint(node: Mapping[str, Any], prefix: str) -> dict[str, Any] | None:
    """Our taint (the first with our key, whatever its effect), or None."""
    ours = our_taints(node, prefix)
    return ours[0] if ours else None


def taint_disabled(node: Mapping[str, Any], prefix: str) -> bool:
    return labels_of(node).get(Keys(prefix).taint_opt_out, "").strip().lower() == DISABLED


def desired_labels(
    marks: Marks, prefix: str, taint_on: bool, label_on: bool = False, slot: str | None = None
) -> dict[str, str | None]:
    """Our labels; None = must be absent. *label_on*: mode `label`'s `<prefix>/unhealthy`; *slot*:
    the brake slot this node holds, claimed on its Node (core/brake_count.py)."""
    keys = Keys(prefix)
    out: dict[str, str | None] = {
        keys.status: marks.status.value,
        keys.severity: marks.severity.label,
        keys.tainted: TRUE if taint_on else None,
        keys.unhealthy: marks.taint_value if label_on else None,
        keys.brake_slot: slot,
        keys.gpus_in_service: marks.in_service or None,
    }
    if marks.risk:
        out[keys.risk] = marks.risk
    return out


def plan_node_patch(
    node: Mapping[str, Any],
    marks: Marks,
    *,
    prefix: str,
    taint_on: bool,
    label_on: bool = False,
    slot: str | None = None,
) -> dict[str, Any] | None:
    """The merge patch (without resourceVersion) that makes our metadata and taint match, or None.

    Only keys that differ are named; `spec.taints` appears only when our taint must be added, removed,
    get a new value or effect (marks.taint_effect), or when more than one taint carries our key; then
    it is the Node's own list with only ours changed (our one taint where the first of ours was).
    The validating and testing taints go on or off in the same list (marks.validating,
    marks.testing: validating_taint.py).
    """
    labels, annotations = labels_of(node), annotations_of(node)
    desired = desired_labels(marks, prefix, taint_on, label_on, slot)
    label_patch = {k: v for k, v in desired.items() if labels.get(k) != v}
    ann_key = Keys(prefix).results
    ann_patch: dict[str, str | None] = (
        {ann_key: marks.results_json} if annotations.get(ann_key) != marks.results_json else {}
    )
    for key in marks.drop_annotations:
        if Keys(prefix).ours(key) and key in annotations:
            ann_patch[key] = None  # a merge patch null deletes the key

    taints = taints_of(node)
    ours = our_taints(node, prefix)
    new_taints: list[dict[str, Any]] | None = None
    if taint_on:
        want = {"key": Keys(prefix).taint, "value": marks.taint_value, "effect": marks.taint_effect}
        if not ours:
            new_taints = [*taints, want]
        elif len(ours) > 1 or not _same_taint(ours[0], want) or ours[0].get("value") != want["value"]:
            new_taints = []
            for t in taints:
                if t.get("key") != want["key"]:
                    new_taints.append(t)
                elif want not in new_taints:
                    new_taints.append(want)
    elif ours:
        new_taints = [t for t in taints if t.get("key") != Keys(prefix).taint]

    validating = with_validating(new_taints if new_taints is not None else taints, marks.validating, prefix)
    new_taints = validating if validating is not None else new_taints
    testing = with_testing(new_taints if new_taints is not None else taints, marks.testing, prefix)
    new_taints = testing if testing is not None else new_taints
    meta: dict[str, Any] = {}
    if label_patch:
        meta["labels"] = label_patch
    if ann_patch:
        meta["annotations"] = ann_patch
    patch: dict[str, Any] = {}
    if meta:
        patch["metadata"] = meta
    if new_taints is not None:
        patch["spec"] = {"taints": new_taints}
    return patch or None


def _same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get("key") == b.get("key") and a.get("effect") == b.get("effect")


def find_condition(node: Mapping[str, Any], condition_type: str) -> dict[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == condition_type:
            return dict(c)
    return None


def plan_condition(
    node: Mapping[str, Any], marks: Marks, *, condition_type: str, now: str
) -> dict[str, Any] | None:
    """Our condition when status/reason/message differ (lastTransitionTime moves only with status)."""
    return plan_entry(
        node,
        condition_type,
        marks.condition_status,
        marks.condition_reason,
        marks.condition_message,
        now=now,
    )


def plan_entry(
    node: Mapping[str, Any],
    condition_type: str,
    status: str,
    reason: ConditionReason | RemediationReason | FaultReason,
    message: str,
    *,
    now: str,
) -> dict[str, Any] | None:
    """One condition when its status, reason or message differ from the Node's, else None."""
    cur = find_condition(node, condition_type)
    want = {"status": status, "reason": reason, "message": message}
    if cur is not None and all(cur.get(k) == v for k, v in want.items()):
        return None
    transition = now
    if cur is not None and cur.get("status") == status and cur.get("lastTransitionTime"):
        transition = str(cur["lastTransitionTime"])
    return {"type": condition_type, **want, "lastHeartbeatTime": now, "lastTransitionTime": transition}


def plan_conditions(
    node: Mapping[str, Any],
    marks: Marks,
    *,
    condition_type: str,
    retired: Iterable[str] = (),
    taint_on: bool,
    brake_open: bool = False,
    disabled: bool = False,
    prefix: str,
    now: str,
    hold: Hold | None = None,
) -> list[dict[str, Any]]:
    """Every condition entry of the one status PATCH that makes our conditions match, or [].

    Our condition, each remediation condition, and a delete directive (strategic merge `$patch:
    delete`) for each condition of ours no longer configured: a *retired* type (a renamed
    node.conditionType) and any condition carrying a remediation reason whose type is no longer in
    node.remediationConditions. A condition of another component is never named.
    """
    out: list[dict[str, Any]] = []
    own = plan_condition(node, marks, condition_type=condition_type, now=now)
    if own is not None:
        out.append(own)
    wanted = {condition_type}
    for mark in marks.remediation:
        wanted.add(mark.type)
        status, reason, message = remediation_condition(
            mark, taint_on=taint_on, brake_open=brake_open, disabled=disabled, prefix=prefix, hold=hold
        )
        entry = plan_entry(node, mark.type, status, reason, message, now=now)
        if entry is not None:
            out.append(entry)
    gone = {t for t in retired if t not in wanted and find_condition(node, t) is not None}
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") not in wanted and c.get("reason") in OUR_REMEDIATION_REASONS:
            gone.add(str(c.get("type")))
    out.extend({"type": t, "$patch": "delete"} for t in sorted(gone))
    return out


def rv_number(node: Mapping[str, Any] | None) -> int:
    """The Node's resourceVersion as a number, to keep the latest of two copies (0 when unreadable)."""
    try:
        return int(((node or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def rv_text(node: Mapping[str, Any]) -> str | None:
    """The Node's resourceVersion as the API wrote it (None when absent)."""
    rv = (node.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


__all__ = [
    "annotations_of",
    "desired_labels",
    "find_condition",
    "find_our_taint",
    "labels_of",
    "our_taints",
    "plan_condition",
    "plan_conditions",
    "plan_entry",
    "plan_node_patch",
    "rv_number",
    "rv_text",
    "taint_disabled",
    "taints_of",
]
