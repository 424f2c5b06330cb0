"""Every fleet record's Lease: the brake's slots (brake_slots.py), the repair budget's fail, mark,
release and wave records (budget_records.py, repair_budget.py) and the active checks' slots
(active_checks.py). Each is a Lease in the agents' namespace, labelled `<prefix>/record=<kind>`
(core/record_kind.py), naming its node in the annotation `<prefix>/node`, owned by its Node when it
must go with it, and ordered by resourceVersion. This module holds that REST plumbing once; the
modules above keep only their own names, labels and counting rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.core.record_kind import RecordKind, record_kind
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, api_status


def lease_path(namespace: str, name: str = "") -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases" + (f"/{name}" if name else "")


def epoch(stamp: object) -> float:
    """An RFC 3339 timestamp as epoch seconds (0 when absent or unreadable)."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class LeaseRecord:
    """The fields every record has, as listed, read or created: its name, kind (None: a label that
    is no kind of ours), node, creation (epoch s), resourceVersion, and its annotations and labels
    for the fields a kind of its own adds."""

    name: str
    kind: RecordKind | None
    node: str = ""
    at: float = 0.0
    rv: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


def parse(item: Mapping[str, Any], prefix: str) -> LeaseRecord:
    """A listed (read, created) Lease's common fields."""
    meta = item.get("metadata") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    try:
        rv = int(meta.get("resourceVersion") or 0)
    except ValueError:
        rv = 0
    return LeaseRecord(
        name=str(meta.get("name") or ""),
        kind=record_kind(labels.get(f"{prefix}/record")),
        node=str(ann.get(f"{prefix}/node") or ""),
        at=epoch(meta.get("creationTimestamp")),
        rv=rv,
        annotations=ann,
        labels=labels,
    )


class LeaseRecords:
    """The records in one namespace under one key prefix."""

    def __init__(self, rest: KubeRest, namespace: str, prefix: str) -> None:
        self.rest, self.namespace, self.prefix = rest, namespace, prefix

    @property
    def kind_label(self) -> str:
        return f"{self.prefix}/record"

    def create(
        self,
        kind: RecordKind,
        node: str,
        *,
        name: str = "",
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        owner: Mapping[str, Any] | None = None,
        holder: str = "",
        duration_s: int | None = None,
    ) -> dict[str, Any]:
        """Write one record of *kind* naming *node* (a fixed *name*, else `<prefix>-<kind>-` and a
        generated rest), owned by the Node *owner* when its metadata has a uid (the garbage collector
        deletes the record with it); the created Lease. A fixed name already there raises
        ApiException 409, as any other refusal raises."""
        meta: dict[str, Any] = {
            "labels": {self.kind_label: str(kind), **(labels or {})},
            "annotations": {f"{self.prefix}/node": node, **(annotations or {})}
            if node
            else dict(annotations or {}),
        }
        owner_meta = (owner or {}).get("metadata") or {}
        if owner_meta.get("uid"):
            ref = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": owner_meta.get("name") or node,
                "uid": owner_meta["uid"],
            }
            meta["ownerReferences"] = [ref]
        if name:
            meta["name"] = name
        else:
            meta["generateName"] = f"{self.prefix}-{kind}-"
        spec: dict[str, Any] = {"holderIdentity": holder or str(kind)}
        if duration_s is not None:
            spec["leaseDurationSeconds"] = duration_s
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        return self.rest.json("POST", lease_path(self.namespace), body=body, timeout=REQUEST_TIMEOUT)

    def read(self, name: str) -> dict[str, Any] | None:
        """The Lease *name* as it is (None: not there)."""
        try:
            return self.rest.json("GET", lease_path(self.namespace, name), timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                return None
            raise

    def list(
        self,
        kinds: Sequence[RecordKind],
        *,
        extra: str = "",
        min_rv: str | int | None = None,
        consistent: bool = False,
        limit: int = 0,
        accept: str | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The Leases of *kinds* (and the label selector *extra*), from the watch cache (not older
        than *min_rv* when given: every record written before it is seen), or *consistent* (from
        etcd); at most *limit* when given. And whether the list is complete (no continue token)."""
        selector = f"{self.kind_label} in ({','.join(kinds)})"
        selector += f",{extra}" if extra else ""
        query = {"labelSelector": selector}
        if not consistent:
            query["resourceVersion"] = str(min_rv) if min_rv else "0"
            if min_rv:
                query["resourceVersionMatch"] = "NotOlderThan"
        if limit > 0:
            query["limit"] = str(limit)
        kw: dict[str, Any] = {"accept": accept} if accept else {}
        doc = self.rest.json("GET", lease_path(self.namespace), query=query, timeout=REQUEST_TIMEOUT, **kw)
        return list(doc.get("items") or ()), not (doc.get("metadata") or {}).get("continue")

    def delete(self, name: str, *, uid: str = "", rv: str = "") -> None:
        """Delete a record (gone already: nothing to do); other refusals raise. *uid* and *rv*: only
        the record as read (a 409 when it changed since: another asker took it in between)."""
        body = None
        if uid or rv:
            pre = {k: v for k, v in (("uid", uid), ("resourceVersion", rv)) if v}
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre}
        try:
            self.rest.json("DELETE", lease_path(self.namespace, name), body=body, timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) != 404:
                raise


__all__ = ["LeaseRecord", "LeaseRecords", "epoch", "lease_path", "parse"]
