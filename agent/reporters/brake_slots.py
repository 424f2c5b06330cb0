"""The brake's slots: one Lease per taint the brake may grant, named by its number.

A node may add our taint only while it holds a slot: a Lease named `<prefix>-taint-<brake>-<i>`
for a number i below the brake's cap, in the agents' namespace, labelled `<prefix>/record=taint`.
Creating a fixed name is atomic (the second creator gets 409), so no two nodes hold one slot and
at most `cap` nodes hold any, whatever races: exact without a count and without a lock. A slot
names its node (an annotation, checked by the admission policy gpu-healthcheck-own-records: an
agent takes and frees slots of its own node only) and is owned by its Node, so the garbage
collector frees it with a Node a repair engine deleted. Finding a free slot costs a few creates,
never a list of the fleet: requests and bytes per agent do not grow with the fleet.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agent.core.brake_count import Ticket
from agent.core.node_keys import Keys
from agent.reporters.kube_rest import KubeRest, api_status
from agent.reporters.node_names import NAMES_LIST_ACCEPT, list_names_doc, names_in_list

log = logging.getLogger(__name__)

TAINT = "taint"  # the record kind (core/repair_budget.py RecordKeys.kind's value)
TIMEOUT = (5, 30)
OVERFLOW = "x"  # an overflow slot's name part: `<prefix>-taint-<brake>-x-<number of the holder's hash>`


def leases(namespace: str, name: str = "") -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases" + (f"/{name}" if name else "")


def brake_tag(scope: str) -> str:
    """The brake's part of a slot's name: `fleet`, or a hash of a brake's scope (tests keep their
    Nodes apart with one)."""
    return "fleet" if not scope else "s" + hashlib.sha256(scope.encode()).hexdigest()[:10]


def holder_value(node_name: str) -> str:
    """The `<prefix>/holder` label's value: a node name may be longer than a label value."""
    return hashlib.sha256(node_name.encode()).hexdigest()[:32]


class Slots:
    """The slots of one brake (its scope) in one namespace."""

    def __init__(self, rest: KubeRest, namespace: str, prefix: str, scope: str = "") -> None:
        self.rest, self.namespace, self.prefix = rest, namespace, prefix
        self.tag = brake_tag(scope)

    def name(self, i: int) -> str:
        return f"{self.prefix}-taint-{self.tag}-{i}"

    def overflow_name(self, node_name: str) -> str:
        """The one overflow slot *node_name* may hold (taken after a count, brake_count.py). Its
        last part is a number (of the holder's hash) far above any cap, so that a rolled-back agent
        that knows only numbered slots reads it as one above its cap, and frees it."""
        return f"{self.prefix}-taint-{self.tag}-{OVERFLOW}-{int(holder_value(node_name)[:12], 16) + 10**15}"

    def is_overflow(self, name: str) -> bool:
        return name.startswith(f"{self.prefix}-taint-{self.tag}-{OVERFLOW}-")

    def index(self, name: str) -> int:
        """A numbered slot's number; an overflow slot sorts after every number."""
        tail = name.rsplit("-", 1)[1]
        return int(tail) if tail.isdigit() and not self.is_overflow(name) else 1 << 30

    def claim(self, name: str) -> str:
        """The value of the `<prefix>/brake-slot` label its holder writes on its Node while it holds
        slot *name*: the name without the prefix (a label value: at most 63 characters)."""
        return name[len(f"{self.prefix}-taint-") :]

    @property
    def claim_label(self) -> str:
        return Keys(self.prefix).brake_slot

    def _labels(self, node_name: str) -> dict[str, str]:
        p = self.prefix
        return {f"{p}/record": TAINT, f"{p}/brake": self.tag, f"{p}/holder": holder_value(node_name)}

    def take(self, i: int, node_name: str, node: Mapping[str, Any] | None = None) -> bool:
        """Create slot *i* for *node_name* (owned by *node*, its Node, when given): True when it is
        ours now, False when another node holds it (409). Any other answer raises: a create whose
        answer was lost may have landed (the caller looks for its slots again)."""
        return self._create(self.name(i), node_name, node) is not None

    def take_overflow(self, node_name: str, node: Mapping[str, Any] | None = None) -> Ticket:
        """Create (or find, after a lost answer or a restart) *node_name*'s overflow slot."""
        made = self._create(self.overflow_name(node_name), node_name, node, overflow=True)
        if made is not None:
            return made
        doc = self.rest.json("GET", leases(self.namespace, self.overflow_name(node_name)), timeout=TIMEOUT)
        got = self.ticket(doc)
        if got.holder != node_name:
            raise RuntimeError(f"brake: overflow slot {got.name} names {got.holder!r}, not {node_name}")
        return got

    def _create(
        self, name: str, node_name: str, node: Mapping[str, Any] | None, *, overflow: bool = False
    ) -> Ticket | None:
        """The slot created, or None when it exists (409). Other answers raise."""
        labels = self._labels(node_name)
        if overflow:
            labels[f"{self.prefix}/overflow"] = "true"
        meta: dict[str, Any] = {
            "name": name,
            "labels": labels,
            "annotations": {f"{self.prefix}/node": node_name},
        }
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": uid}]
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta}
        body["spec"] = {"holderIdentity": node_name}
        try:
            doc = self.rest.json("POST", leases(self.namespace), body=body, timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 409:
                return None
            raise
        return self.ticket(doc)

    def ticket(self, doc: Mapping[str, Any]) -> Ticket:
        """A listed, read or created slot as a Ticket."""
        meta = doc.get("metadata") or {}
        name = str(meta.get("name") or "")
        try:
            rv = int(meta.get("resourceVersion") or 0)
        except ValueError:
            rv = 0
        try:
            at = datetime.fromisoformat(str(meta.get("creationTimestamp")).replace("Z", "+00:00")).timestamp()
        except ValueError:
            at = 0.0
        holder = str((meta.get("annotations") or {}).get(f"{self.prefix}/node") or "")
        return Ticket(name=name, holder=holder, at=at, rv=rv, overflow=self.is_overflow(name))

    def tickets(self, *, min_rv: int | None = None, overflow_only: bool = False) -> list[Ticket]:
        """Every slot of this brake (the count's list: only when a count is due, never per ask), from
        the watch cache not older than *min_rv* (our own overflow slot: every slot before it shows)."""
        p = self.prefix
        selector = f"{p}/record={TAINT},{p}/brake={self.tag}" + (
            f",{p}/overflow=true" if overflow_only else ""
        )
        query = {"labelSelector": selector, "resourceVersion": str(min_rv or 0)}
        if min_rv:
            query["resourceVersionMatch"] = "NotOlderThan"
        doc = self.rest.json("GET", leases(self.namespace), query=query, timeout=TIMEOUT)
        return [self.ticket(i) for i in doc.get("items") or ()]

    def get(self, i: int) -> Ticket | None:
        """Slot *i* as it is (None: free)."""
        try:
            return self.ticket(self.rest.json("GET", leases(self.namespace, self.name(i)), timeout=TIMEOUT))
        except Exception as exc:
            if api_status(exc) == 404:
                return None
            raise

    def claimed(self, holder: str, name: str) -> bool:
        """Does Node *holder* claim slot *name* (its `<prefix>/brake-slot` label says so)? One
        names-only list of that one Node, from the watch cache."""
        doc = list_names_doc(
            self.rest,
            "/api/v1/nodes",
            f"{self.claim_label}={self.claim(name)}",
            field_selector=f"metadata.name={holder}",
        )
        return holder in names_in_list(doc)

    def held_by(self, node_name: str, *, consistent: bool = False) -> list[str]:
        """The names of the slots *node_name* holds (one list filtered by its holder label: what
        comes back is its own, never the fleet's). From the watch cache, or *consistent* (after a
        create whose answer was lost: it must be seen)."""
        p = self.prefix
        selector = f"{p}/record={TAINT},{p}/brake={self.tag},{p}/holder={holder_value(node_name)}"
        query = {"labelSelector": selector}
        if not consistent:
            query["resourceVersion"] = "0"
        doc = self.rest.json("GET", leases(self.namespace), query=query, timeout=TIMEOUT)
        names = [str((i.get("metadata") or {}).get("name") or "") for i in doc.get("items") or ()]
        return sorted((n for n in names if n), key=self.index)

    def holder(self, i: int) -> str | None:
        """The node that holds slot *i* ("" when the slot names none; None: nobody, it is free)."""
        try:
            doc = self.rest.json("GET", leases(self.namespace, self.name(i)), timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                return None
            raise
        return str(((doc.get("metadata") or {}).get("annotations") or {}).get(f"{self.prefix}/node") or "")

    def reap(self, i: int) -> bool:
        """Free slot *i* when the Node that holds it is gone and the garbage collector has not freed
        it yet (or does not run): only an identity the records policy does not fence may, a fenced
        agent's delete is refused and it leaves the slot to the collector. True when it is free."""
        try:
            holder = self.holder(i)
            if holder is None:
                return True
            if not holder:
                return False  # a slot that names no node: left as it is
            if node_exists(self.rest, holder):
                return False  # its Node is there: the slot is held
        except Exception:
            return False  # could not tell: the slot stays held
        try:
            self.free(self.name(i))
        except Exception as exc:
            log.info("brake: slot %s of a Node that is gone is left to the garbage collector: %s", i, exc)
            return False
        log.warning("brake: freed slot %s, held for Node %s which is gone", i, holder)
        return True

    def free(self, name: str) -> None:
        """Delete a slot of ours (gone already: nothing to do)."""
        try:
            self.rest.json("DELETE", leases(self.namespace, name), timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) != 404:
                raise


def node_exists(rest: KubeRest, name: str) -> bool:
    """Is Node *name* there? One consistent GET of that Node as a Table (its name in one row, not
    the kilobytes of our annotations): exact whatever the watch cache's lag, and no wait at the
    server. (A list from the cache "not older than the slot" waited up to 3 s behind a lagging cache
    and answered 504 under a 4,000-node wave.) False on 404 only; other errors propagate."""
    try:
        doc = rest.json(
            "GET",
            f"/api/v1/nodes/{name}",
            query={"includeObject": "None"},  # the row alone: a Table's default carries the metadata
            accept=NAMES_LIST_ACCEPT,
            timeout=TIMEOUT,
        )
    except Exception as exc:
        if api_status(exc) == 404:
            return False
        raise
    if doc.get("kind") == "Table":
        return name in names_in_list(doc)
    return (doc.get("metadata") or {}).get("name") == name  # the object itself: a server without Tables


__all__ = ["OVERFLOW", "TAINT", "Slots", "brake_tag", "holder_value", "leases", "node_exists"]
