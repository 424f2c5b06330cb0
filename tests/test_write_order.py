"""The write order of the Node writer, pure: every change from every start, every refusal.

The writer sends a Node PATCH (labels, annotation, taint) and a status PATCH (conditions), in the
order node_story decides (reporters/write_order.py sends it): a new fault's Node PATCH with our
taint first (`adds_taint`), else the conditions first, the remediation entries that would turn
unhealthy only after the Node PATCH (`lead_conditions`), and a Node PATCH refused after them puts
them back (`revert_conditions`). Here the writes are the pure plans (node_patch) applied to a Node
as the API server merges them, so each version the server would store is looked at:
- a new fault's first PATCH carries our taint, and the first version stored has it;
- no version shows a remediation condition at its unhealthy status without our taint;
- no version shows the node failing (status label or our condition) without our taint, unless the
  opt-out label keeps it off, whatever the server refuses;
- with nothing refused the last version tells one story and has the taint the Marks want.
The same on the real API server, read back by a watch: tests/test_refusals.py.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.core.marks import Marks
from agent.core.node_keys import CONDITIONS, DEFAULT_CONDITION_TYPE, DEFAULT_PREFIX, Keys
from agent.core.remediation_types import RemediationMark, RemediationReason
from agent.core.severity import Severity, Status
from agent.reporters.node_patch import find_our_taint, plan_conditions, plan_node_patch, taint_disabled
from agent.reporters.node_story import adds_taint, contradictions, lead_conditions, revert_conditions
from tests.test_node_writer import make_marks

P = DEFAULT_PREFIX
K = Keys(P)
COND = DEFAULT_CONDITION_TYPE
AHR = "AcceleratedHardwareReady"
R = RemediationReason
NOW = "2026-11-28T00:00:00Z"
FAILING = CONDITIONS[Status.FAIL].status


def rmark(unhealthy: bool, reason: str) -> RemediationMark:
    return RemediationMark(AHR, "False", unhealthy, reason, f"{reason} message")


def with_ahr(marks: Marks) -> Marks:
    """The Marks with one remediation condition, unhealthy where the engine wants it so (a fault)."""
    failing = marks.taint
    return replace(marks, remediation=(rmark(failing, R.FAILED if failing else R.PASSED),))


BASE = {
    "PASS": make_marks(Status.PASS),
    "FAIL": make_marks(Status.FAIL, Severity.REBOOT, message="GPU 3: Xid 79"),
    "FAIL-ISOLATE": make_marks(Status.FAIL, Severity.ISOLATE, message="GPU 3: row remap failure"),
    "UNKNOWN": make_marks(Status.UNKNOWN, message="nvidia-smi timed out"),
    "WARN": make_marks(Status.WARN, Severity.NONE, message="GPU 3: a correctable ECC trend"),
}
MARKS = {**BASE, **{f"{k}+AHR": with_ahr(m) for k, m in BASE.items()}}

# A refusal: which request the server refuses (kind "node" or "status", and the status entries).
Refuses = Callable[[str, Sequence[Mapping[str, Any]]], bool]
REFUSALS: dict[str, Refuses] = {
    "none": lambda kind, entries: False,
    "node": lambda kind, entries: kind == "node",
    "status": lambda kind, entries: kind == "status",
    "the AHR type (as the fence)": lambda kind, entries: any(e.get("type") == AHR for e in entries),
}


def merged(node: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """*node* after a JSON merge patch of our labels, annotations and the taint list."""
    out = copy.deepcopy(dict(node))
    meta = patch.get("metadata") or {}
    for part in ("labels", "annotations"):
        have = out["metadata"].setdefault(part, {})
        for key, value in (meta.get(part) or {}).items():
            if value is None:
                have.pop(key, None)
            else:
                have[key] = value
    if "spec" in patch:
        out["spec"]["taints"] = list(patch["spec"]["taints"])
    return out


def status_merged(node: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """*node* after a strategic-merge status PATCH of *entries* (the conditions merge by type)."""
    out = copy.deepcopy(dict(node))
    conds = out["status"].setdefault("conditions", [])
    for entry in entries:
        at = next((i for i, c in enumerate(conds) if c["type"] == entry["type"]), None)
        if entry.get("$patch") == "delete":
            if at is not None:
                del conds[at]
        elif at is None:
            conds.append(dict(entry))
        else:
            conds[at] = {**conds[at], **entry}
    return out


class Server:
    """The versions of one Node the API server stores, and the requests it was sent."""

    def __init__(self, node: dict[str, Any], refuses: Refuses) -> None:
        self.node, self.refuses = node, refuses
        self.versions: list[dict[str, Any]] = []
        self.sent: list[tuple[str, Any]] = []

    def patch(self, patch: Mapping[str, Any] | None) -> bool:
        if patch is None:
            return True
        self.sent.append(("node", patch))
        if self.refuses("node", ()):
            return False
        self._store(merged(self.node, patch))
        return True

    def status(self, entries: Sequence[Mapping[str, Any]]) -> bool:
        if not entries:
            return True
        self.sent.append(("status", entries))
        if self.refuses("status", entries):
            return False
        self._store(status_merged(self.node, entries))
        return True

    def _store(self, node: dict[str, Any]) -> None:
        self.node = node
        self.versions.append(node)


def write(server: Server, marks: Marks, brake_holds: bool = False) -> None:
    """One apply, in the writer's order (reporters/write_order.py): the taint goes on where the
    Marks want it and the opt-out label does not keep it off, unless *brake_holds* a new one back."""
    node = server.node
    disabled = taint_disabled(node, P)
    held = brake_holds and adds_taint(node, marks, P)
    taint_on = marks.taint and not disabled and not held

    def plan(n: Mapping[str, Any]) -> list[dict[str, Any]]:
        return plan_conditions(
            n,
            marks,
            condition_type=COND,
            taint_on=taint_on,
            brake_open=held,
            disabled=disabled,
            prefix=P,
            now=NOW,
        )

    if adds_taint(node, marks, P):  # a new fault: out of service first
        if not server.patch(plan_node_patch(node, marks, prefix=P, taint_on=taint_on)):
            return
        conds = plan(server.node)
        if not server.status(conds):  # once more without the entries that wait for the taint
            rest = lead_conditions(server.node, marks, conds)
            if rest != conds:
                server.status(rest)
        return
    before = node
    lead = lead_conditions(node, marks, plan(node))
    if not server.status(lead):
        return
    if not server.patch(plan_node_patch(server.node, marks, prefix=P, taint_on=taint_on)):
        server.status(revert_conditions(before, lead))
        return
    server.status(plan(server.node))


def start(name: str, opt_out: bool) -> dict[str, Any]:
    """A Node the writer left showing MARKS[name] (with nothing refused), or a fresh one ("fresh")."""
    labels = {K.taint_opt_out: "disabled"} if opt_out else {}
    node = {"metadata": {"name": "n1", "labels": labels}, "spec": {"taints": []}, "status": {}}
    if name == "fresh":
        return node
    server = Server(node, REFUSALS["none"])
    write(server, MARKS[name])
    return server.node


def says_failing(node: Mapping[str, Any]) -> bool:
    conds = {c["type"]: c for c in node["status"].get("conditions") or ()}
    label = node["metadata"].get("labels", {}).get(K.status)
    return bool(label == Status.FAIL.value or conds.get(COND, {}).get("status") == FAILING)


CASES = list(itertools.product(["fresh", *MARKS], MARKS, REFUSALS, [False, True], [False, True]))


def test_no_version_of_the_node_is_ahead_of_our_taint() -> None:
    """Every start (fresh, or left by each Marks, with and without the opt-out label) × every
    Marks × every refusal × the brake holding a new taint back or not."""
    for case in CASES:
        check_order(*case)


def check_order(before: str, after: str, refusal: str, opt_out: bool, brake_holds: bool) -> None:
    node = start(before, opt_out)
    marks = MARKS[after]
    remediation = marks.remediation or MARKS["FAIL+AHR"].remediation  # a type left from before counts
    assert contradictions(node, prefix=P, condition_type=COND, remediation=remediation) == []
    server = Server(node, REFUSALS[refusal])
    write(server, marks, brake_holds)
    case = (before, after, refusal, opt_out, brake_holds, server.sent)
    held = brake_holds and adds_taint(node, marks, P)

    if adds_taint(node, marks, P) and not held:
        kind, first = server.sent[0]
        assert kind == "node" and first["spec"]["taints"] == [  # the first PATCH carries our taint
            {"key": K.taint, "value": marks.taint_value, "effect": marks.taint_effect}
        ]
        assert not server.versions or find_our_taint(server.versions[0], P) is not None, case
    for v in server.versions:
        told = contradictions(v, prefix=P, condition_type=COND, remediation=remediation)
        assert not [t for t in told if "without our taint" in t], (told, case)
        if says_failing(v) and not taint_disabled(v, P) and not held:
            assert find_our_taint(v, P) is not None, case  # never failing and untainted
    if refusal == "none":
        assert contradictions(server.node, prefix=P, condition_type=COND, remediation=remediation) == []
        assert (find_our_taint(server.node, P) is not None) == (marks.taint and not opt_out and not held)
        assert server.node["metadata"]["labels"][K.status] == marks.status.value
    fenced_fault = refusal == "the AHR type (as the fence)" and adds_taint(node, marks, P) and not held
    if (refusal == "none" or (fenced_fault and marks.remediation)) and server.versions:  # ours tells it
        ours = {c["type"]: c for c in server.node["status"].get("conditions", ())}.get(COND, {})
        assert (ours.get("status"), ours.get("message")) == (
            marks.condition_status,
            marks.condition_message,
        ), case


def test_the_model_sees_a_remediation_condition_run_ahead_of_the_taint() -> None:
    """The checks above can fail: the conditions all sent first (the order before the fix, without
    lead_conditions) show AHR unhealthy on a Node without our taint, and our condition failing."""
    marks = MARKS["FAIL+AHR"]
    server = Server(start("PASS+AHR", False), REFUSALS["node"])
    conds = plan_conditions(server.node, marks, condition_type=COND, taint_on=True, prefix=P, now=NOW)
    server.status(conds)
    (v,) = server.versions
    told = contradictions(v, prefix=P, condition_type=COND, remediation=marks.remediation)
    assert any("without our taint" in t for t in told)
    assert says_failing(v) and find_our_taint(v, P) is None
