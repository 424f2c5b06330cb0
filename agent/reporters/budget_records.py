"""The repair budget's records as Leases: written, listed and read back (reporters/repair_budget.py
decides with them; core/repair_budget.py holds the pure rules).

Each record is its owner's alone: the admission policy gpu-healthcheck-own-records lets an agent
create `fail`, `mark` and `wave` records of its own node only (its token's node claim), never a
`release`, and never change or delete another node's record. So stale records go away by their owner or the
garbage collector, never by another agent:

- fail: one per node and finding key (a fixed name: a retry or a restarted agent finds it there),
  written before the node asks, owned by its Node (the garbage collector deletes it with the Node);
  it counts toward the key's wave while the Node carries `<prefix>/status=fail`, and its agent
  deletes it once its node no longer wants a mark.
- mark: one per new mark, written, then counted with every record written before it (the list not
  older than its own resourceVersion): beyond the limit, it deletes itself and the node is held.
  Marks count for the window whether or not their Node still exists (no owner: a repaired Node
  must not free budget); each is labelled with its window's bucket (writer's clock // window), so
  an ask lists those that can still count; past the window they no longer count, and their agent
  deletes them at its next ask; those of Nodes that are gone are deleted by `gpu-healthcheck brake
  sweep`.
- release: `gpu-healthcheck brake release` (cli/brake.py), an operator's: records before it no
  longer count.
- wave: a marker left by the node whose full count found a wave on a key (labelled with the key's
  slug), owned by its Node; it holds the rest of the wave with one small list, and its node deletes
  it when the wave has ended or the node recovers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.core.repair_budget import FAIL, MARK, RELEASE, WAVE, Record, RecordKeys, key_slug
from agent.reporters.kube_rest import KubeRest
from agent.reporters.node_names import METADATA_LIST_ACCEPT

REQUEST_TIMEOUT = (5, 30)


def leases_path(namespace: str, name: str = "") -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases" + (f"/{name}" if name else "")


def epoch(stamp: str | None) -> float:
    """An RFC 3339 timestamp as epoch seconds (0 when absent or unreadable)."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def record_of(item: Mapping[str, Any], prefix: str) -> Record | None:
    """A listed (or created) Lease as a Record; None when it is not one of ours."""
    keys = RecordKeys(prefix)
    meta = item.get("metadata") or {}
    kind = (meta.get("labels") or {}).get(keys.kind)
    if kind not in (FAIL, MARK, RELEASE, WAVE):
        return None
    ann = meta.get("annotations") or {}
    try:
        rv = int(meta.get("resourceVersion") or 0)
    except ValueError:
        rv = 0
    return Record(
        name=str(meta.get("name") or ""),
        kind=kind,
        node=str(ann.get(keys.node) or ""),
        key=str(ann.get(keys.key) or ""),
        pool=str(ann.get(keys.pool) or ""),
        at=epoch(meta.get("creationTimestamp")),
        rv=rv,
        by=str(ann.get(keys.by) or ""),
        reason=str(ann.get(keys.reason) or ""),
    )


def list_records(
    rest: KubeRest,
    namespace: str,
    prefix: str,
    min_rv: str | None = None,
    kinds: Sequence[str] = (FAIL, MARK, RELEASE),
    key: str | None = None,
    extra: str = "",
) -> list[Record]:
    """The records of *kinds* in *namespace* (of the finding *key* alone, when given: fail records
    and wave markers carry its slug as a label), metadata only, from the watch cache (not older
    than *min_rv* when given: every record written before it is seen)."""
    keys = RecordKeys(prefix)
    selector = f"{keys.kind} in ({','.join(kinds)})" + (f",{keys.key_label}={key_slug(key)}" if key else "")
    selector += f",{extra}" if extra else ""
    query = {"labelSelector": selector, "resourceVersion": min_rv or "0"}
    if min_rv:
        query["resourceVersionMatch"] = "NotOlderThan"
    doc = rest.json(
        "GET", leases_path(namespace), query=query, accept=METADATA_LIST_ACCEPT, timeout=REQUEST_TIMEOUT
    )
    return [r for r in (record_of(i, prefix) for i in doc.get("items") or ()) if r is not None]


def create_record(
    rest: KubeRest,
    namespace: str,
    prefix: str,
    kind: str,
    annotations: Mapping[str, str],
    *,
    name: str = "",
    holder: str = "",
    owner: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Record:
    """Write one record (a fixed *name*, else a generated one), owned by the Node *owner* when given
    (its metadata: the garbage collector deletes the record with it); a fixed name already there is
    answered by ApiException 409."""
    keys = RecordKeys(prefix)
    labels = {keys.kind: kind, **(labels or {})}
    if annotations.get(keys.key) and kind in (FAIL, WAVE):
        labels[keys.key_label] = key_slug(annotations[keys.key])  # lists of one key's records
    meta: dict[str, Any] = {"labels": labels, "annotations": dict(annotations)}
    owner_meta = (owner or {}).get("metadata") or {}
    if owner_meta.get("name") and owner_meta.get("uid"):
        ref = {"apiVersion": "v1", "kind": "Node", "name": owner_meta["name"], "uid": owner_meta["uid"]}
        meta["ownerReferences"] = [ref]
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = f"{prefix}-{kind}-"
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {"holderIdentity": holder or kind},
    }
    doc = rest.json("POST", leases_path(namespace), body=body, timeout=REQUEST_TIMEOUT)
    rec = record_of(doc, prefix)
    if rec is None:
        raise ValueError(f"the API server answered a record create with {str(doc)[:200]}")
    return rec


__all__ = ["create_record", "epoch", "leases_path", "list_records", "record_of"]
