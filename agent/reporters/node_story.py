"""One story on the Node (DESIGN.md §4): the order of the writer's two requests, pure.

The labels, annotation and taint go in one Node PATCH; the conditions in one status PATCH. Two
requests are never atomic, so the writer orders them:
- A new fault goes out of service first (`adds_taint`): the Node PATCH with our taint leads (after
  the brake's contender labels when the brake is asked), and the conditions follow in one status
  PATCH once it landed, the remediation conditions with them (the taint is on). Refused, that
  status PATCH is tried once more without the remediation entries that would turn unhealthy
  (`lead_conditions`), so a type the fence disputes does not keep our condition from telling the
  failure. A status write refused after the taint leaves the node tainted, out of service, and the
  refusal said (the labels tell the failure before our condition does until a retry goes through);
  a refused Node PATCH writes nothing of the change.
- Any other change (no taint to add: a recovery, unknown, a warning, a fault already tainted): the
  conditions lead, the status PATCH first, the Node PATCH only once it landed. Refused, nothing else
  is sent and the Node keeps the story it told. A remediation condition turns unhealthy only once
  our taint is on the Node: its entries that would newly turn unhealthy wait for the taint decision
  and go in a second status PATCH after the Node PATCH (`lead_conditions`). The Node PATCH refused
  after the leading conditions landed and before any Node write of this apply did: the conditions
  are written back as they were (`revert_conditions`).
Either way no remediation condition is ever unhealthy on a Node without our taint, and a failing
node is never left untainted by a refused write.
`contradictions` says what a Node tells against itself (the writer's tests use it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.core.marks import Marks
from agent.core.node_keys import CONDITIONS, TRUE, Keys
from agent.core.remediation_types import RemediationMark
from agent.reporters.node_patch import find_condition, find_our_taint, labels_of, taint_disabled

CONDITION_FIELDS = ("type", "status", "reason", "message", "lastHeartbeatTime", "lastTransitionTime")


def adds_taint(node: Mapping[str, Any], marks: Marks, prefix: str) -> bool:
    """A new fault: the Marks want our taint and the Node does not have it (nor the label that
    keeps it off), so the first write is the one that puts the node out of service."""
    return marks.taint and find_our_taint(node, prefix) is None and not taint_disabled(node, prefix)


def lead_conditions(
    node: Mapping[str, Any], marks: Marks, planned: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The entries of *planned* that may go before the Node PATCH: all but those of a remediation
    condition that would turn to its unhealthy status now (it is not unhealthy on *node*); those
    wait until our taint is on the Node."""
    unhealthy = {m.type: m.unhealthy_status for m in marks.remediation}
    out = []
    for entry in planned:
        ctype = str(entry.get("type"))
        want = unhealthy.get(ctype)
        newly = want is not None and entry.get("status") == want
        if newly and (find_condition(node, ctype) or {}).get("status") != want:
            continue  # turns unhealthy: after the taint
        out.append(dict(entry))
    return out


def revert_conditions(
    before: Mapping[str, Any], written: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The status PATCH entries that put each condition of *written* back as *before* had it: the
    old entry, or a delete directive for one that was not there."""
    out: list[dict[str, Any]] = []
    for entry in written:
        ctype = str(entry.get("type"))
        old = find_condition(before, ctype)
        if old is None:
            if entry.get("$patch") != "delete":
                out.append({"type": ctype, "$patch": "delete"})
        else:
            out.append({k: old[k] for k in CONDITION_FIELDS if k in old})
    return out


@dataclass(frozen=True)
class NodeState:
    """What the Node shows of our marks, for the metrics: our taint on it, our taint wanted and held
    back by the brake, and each configured remediation condition at its unhealthy status."""

    tainted: bool = False
    taint_held: bool = False
    marked: Mapping[str, bool] = field(default_factory=dict)


def node_state(
    node: Mapping[str, Any] | None, prefix: str, remediation: Sequence[RemediationMark], brake_held: bool
) -> NodeState:
    if node is None:
        return NodeState()
    tainted = find_our_taint(node, prefix) is not None
    marked = {
        m.type: (find_condition(node, m.type) or {}).get("status") == m.unhealthy_status for m in remediation
    }
    return NodeState(tainted, brake_held and not tainted, marked)


def contradictions(
    node: Mapping[str, Any], *, prefix: str, condition_type: str, remediation: Sequence[RemediationMark]
) -> list[str]:
    """What *node* tells against itself, in words; [] for one story. The status label and our
    condition say the same (or neither is there); the `tainted` label and our taint go together;
    a remediation condition at its unhealthy status has our taint beside it."""
    keys = Keys(prefix)
    labels = labels_of(node)
    out = []
    status = labels.get(keys.status)
    cond = find_condition(node, condition_type)
    if status is None or cond is None:
        if (status is None) != (cond is None):
            out.append(f"label {keys.status}={status} but condition {condition_type} is {cond and 'set'}")
    else:
        expected = next((c.status for s, c in CONDITIONS.items() if s.value == status), None)
        if cond.get("status") != expected:
            out.append(f"label {keys.status}={status} but {condition_type}={cond.get('status')}")
    tainted = find_our_taint(node, prefix) is not None
    if tainted != (labels.get(keys.tainted) == TRUE):
        out.append(f"taint {keys.taint} {'on' if tainted else 'off'} but label {keys.tainted}")
    for m in remediation:
        if (find_condition(node, m.type) or {}).get("status") == m.unhealthy_status and not tainted:
            out.append(f"{m.type}={m.unhealthy_status} (marked for remediation) without our taint")
    return out


__all__ = [
    "NodeState",
    "adds_taint",
    "contradictions",
    "lead_conditions",
    "node_state",
    "revert_conditions",
]
