"""`gpu-healthcheck brake release [--key K] --reason TEXT`: lift a wave hold (or, without --key,
every wave hold and the repair budget's window), audited as `clear` is; `brake sweep`: delete the
records no agent may delete.

It writes a release record beside the agents' own (a Lease labelled `<prefix>/record=release` in
the agents' namespace: agent/reporters/repair_budget.py) naming who asked (the Kubernetes identity
the API server sees, by SelfSubjectReview; else the kubeconfig's user), why and when (the server's
creationTimestamp). No agent can write one: the admission policy gpu-healthcheck-own-records refuses
a release, and any record whose `by` is not its writer, to every identity it fences. The agents
honour it at their next ask: records written before it no longer count for that key (for every key
and for the budget, without --key). A Normal Event on the record
says the same; `gpu-healthcheck status` lists the releases of the last 24 h and the held nodes.

It does not mark any node by itself: each held node asks again within its re-ask period, and the
repair budget still paces the marks that follow a released wave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.core.node_keys import COMPONENT
from agent.core.record_kind import RecordKind
from agent.core.remediation_types import RemediationReason
from agent.core.repair_budget import RELEASE_ALL, Record, RecordKeys
from agent.core.results_doc import now_iso
from agent.reporters.budget_records import create_record, list_records
from agent.reporters.kube_rest import KubeRest, api_status
from agent.reporters.lease_records import lease_path

RELEASES_SHOWN_S = 24 * 3600
RELEASE_KEEP_S = 7 * 86400  # a release is kept a week by `sweep` (the records it voids may outlive it)
HELD_REASONS = (RemediationReason.WAVE_HELD, RemediationReason.BUDGET_HELD)


def release(rest: KubeRest, *, namespace: str, prefix: str, key: str, reason: str, who: str) -> str:
    """Write the release record and its Event; the sentence to print. API errors propagate."""
    keys = RecordKeys(prefix)
    ann = {keys.key: key, keys.by: who, keys.reason: reason}
    rec = create_record(rest, namespace, prefix, RecordKind.RELEASE, ann, holder=COMPONENT)
    what = (
        f"the wave hold on {key}" if key != RELEASE_ALL else "every wave hold and the repair budget's window"
    )
    said = f"released {what} as {who}: {reason} (record {namespace}/{rec.name})"
    event = {
        "metadata": {"generateName": f"{rec.name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "name": rec.name,
            "namespace": namespace,
        },
        "reason": "RemediationHoldReleased",
        "message": said,
        "type": "Normal",
        "source": {"component": f"{COMPONENT}-brake"},
        "firstTimestamp": now_iso(),
        "lastTimestamp": now_iso(),
        "count": 1,
    }
    try:
        rest.json("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
    except Exception as exc:  # the record is the audit; the Event is a courtesy
        if api_status(exc) is None:
            raise
        said += f" (no Event: {api_status(exc)})"
    return said + "; held nodes mark at their next ask, within the repair budget"


def sweep(rest: KubeRest, *, namespace: str, prefix: str, older_than_s: float, now: float) -> str:
    """Delete the records no agent may delete (they are another node's): marks older than
    *older_than_s* (at least the budget's window: a mark counts for its window even after its Node
    is gone), releases older than a week, and fail records whose Node is gone (written before they
    carried an owner reference). The sentence to print. API errors propagate."""
    records = list_records(rest, namespace, prefix)
    gone = [r for r in records if r.kind == RecordKind.MARK and now - r.at > older_than_s]
    gone += [r for r in records if r.kind == RecordKind.RELEASE and now - r.at > RELEASE_KEEP_S]
    for node in sorted({r.node for r in records if r.kind == RecordKind.FAIL}):
        try:
            rest.json("GET", f"/api/v1/nodes/{node}")
        except Exception as exc:
            if api_status(exc) != 404:
                raise
            gone += [r for r in records if r.kind == RecordKind.FAIL and r.node == node]
    for r in gone:
        try:
            rest.json("DELETE", lease_path(namespace, r.name))
        except Exception as exc:
            if api_status(exc) != 404:
                raise
    marks, releases, fails = (
        sum(r.kind == k for r in gone) for k in (RecordKind.MARK, RecordKind.RELEASE, RecordKind.FAIL)
    )
    return (
        f"deleted {len(gone)} of {len(records)} records in {namespace}: {marks} marks older than "
        f"{older_than_s / 3600:g} h, {releases} releases older than a week, {fails} fail "
        "records of Nodes that are gone"
    )


def release_lines(records: Sequence[Record], now: datetime) -> list[str]:
    """The releases of the last 24 h, newest first: when, who, which key, why."""
    out = []
    for r in sorted(records, key=lambda r: -r.at):
        if r.kind == RecordKind.RELEASE and now.timestamp() - r.at <= RELEASES_SHOWN_S:
            when = datetime.fromtimestamp(r.at, now.tzinfo).strftime("%Y-%m-%d %H:%M:%S")
            out.append(f"{when} by {r.by or 'unknown'}: {r.key or 'all keys and the budget'}: {r.reason}")
    return out


def held_lines(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Nodes whose remediation condition says a new mark is held, grouped by reason."""
    held: dict[str, list[str]] = {}
    for node in nodes:
        for c in (node.get("status") or {}).get("conditions") or ():
            if c.get("reason") in HELD_REASONS:
                held.setdefault(str(c["reason"]), []).append(str((node.get("metadata") or {}).get("name")))
                break
    return [
        f"{reason}: {len(names)} node(s): {', '.join(sorted(names)[:10])}{' …' if len(names) > 10 else ''}"
        for reason, names in sorted(held.items())
    ]


def brake_footer(
    core: Any, nodes: Sequence[Mapping[str, Any]], namespace: str, prefix: str, now: datetime
) -> str:
    """`status`'s lines on held nodes and recent releases ("" when there are none). A namespace the
    reader may not list leases in shows only the held nodes."""
    out = ""
    held = held_lines(nodes)
    if held:
        out += "\nREMEDIATION HELD (repair budget / wave hold)\n" + "".join(f"  {line}\n" for line in held)
    try:
        records = list_records(KubeRest.of(core), namespace, prefix)
    except Exception as exc:
        if api_status(exc) in (401, 403, 404):
            return out
        raise
    released = release_lines(records, now)
    if released:
        out += "\nHOLDS RELEASED BY HAND (last 24 h)\n" + "".join(f"  {line}\n" for line in released)
    return out


__all__ = ["brake_footer", "held_lines", "release", "release_lines", "sweep"]
