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
from typing import Any

from agent.core.brake_count import Ticket
from agent.core.node_keys import Keys
from agent.core.record_kind import RecordKind
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, api_status
from agent.reporters.lease_records import LeaseRecords, parse
from agent.reporters.node_names import NAMES_LIST_ACCEPT, list_names_doc, names_in_list

log = logging.getLogger(__name__)

OVERFLOW = "x"  # an overflow slot's name part: `<prefix>-taint-<brake>-x-<number of the holder's hash>`


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
        self.records = LeaseRecords(rest, namespace, prefix)

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

    def _selector(self, **more: str) -> str:
        """The label selector beyond the kind: this brake's slots, and *more* (`<prefix>/<key>=<value>`)."""
        p = self.prefix
        return ",".join([f"{p}/brake={self.tag}", *(f"{p}/{k}={v}" for k, v in more.items())])

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
        doc = self.records.read(self.overflow_name(node_name))
        if doc is None:  # taken (409) and gone since: the caller looks for its slots again
            raise RuntimeError(f"brake: overflow slot {self.overflow_name(node_name)} went away")
        got = self.ticket(doc)
        if got.holder != node_name:
            raise RuntimeError(f"brake: overflow slot {got.name} names {got.holder!r}, not {node_name}")
        return got

    def _create(
        self, name: str, node_name: str, node: Mapping[str, Any] | None, *, overflow: bool = False
    ) -> Ticket | None:
        """The slot created, or None when it exists (409). Other answers raise."""
        p = self.prefix
        labels = {f"{p}/brake": self.tag, f"{p}/holder": holder_value(node_name)}
        if overflow:
            labels[f"{p}/overflow"] = "true"
        uid = ((node or {}).get("metadata") or {}).get("uid")
        owner = {"metadata": {"name": node_name, "uid": uid}} if uid else None
        try:
            doc = self.records.create(
                RecordKind.TAINT, node_name, name=name, labels=labels, owner=owner, holder=node_name
            )
        except Exception as exc:
            if api_status(exc) == 409:
                return None
            raise
        return self.ticket(doc)

    def ticket(self, doc: Mapping[str, Any]) -> Ticket:
        """A listed, read or created slot as a Ticket."""
        rec = parse(doc, self.prefix)
        return Ticket(
            name=rec.name, holder=rec.node, at=rec.at, rv=rec.rv, overflow=self.is_overflow(rec.name)
        )

    def tickets(self, *, min_rv: int | None = None, overflow_only: bool = False) -> list[Ticket]:
        """Every slot of this brake (the count's list: only when a count is due, never per ask), from
        the watch cache not older than *min_rv* (our own overflow slot: every slot before it shows)."""
        selector = self._selector(overflow="true") if overflow_only else self._selector()
        items, _ = self.records.list((RecordKind.TAINT,), extra=selector, min_rv=min_rv)
        return [self.ticket(i) for i in items]

    def get(self, i: int) -> Ticket | None:
        """Slot *i* as it is (None: free)."""
        doc = self.records.read(self.name(i))
        return self.ticket(doc) if doc is not None else None

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
        selector = self._selector(holder=holder_value(node_name))
        items, _ = self.records.list((RecordKind.TAINT,), extra=selector, consistent=consistent)
        names = [parse(i, self.prefix).name for i in items]
        return sorted((n for n in names if n), key=self.index)

    def holder(self, i: int) -> str | None:
        """The node that holds slot *i* ("" when the slot names none; None: nobody, it is free)."""
        doc = self.records.read(self.name(i))
        return parse(doc, self.prefix).node if doc is not None else None

    def reap(self, i: int) -> bool:
        """Free slot *i* when the Node that holds it is gone and the garbage collector has not freed
        it yet (or does not run): only an identity the records policy does not fence may, a fenced
        agent's delete is refused and it leaves the slot to the collector. True when it is free."""
        try:
            doc = self.records.read(self.name(i))
            if doc is None:
                return True
            holder = self.ticket(doc).holder
            if not holder:
                return False  # a slot that names no node: left as it is
            if node_exists(self.rest, holder):
                return False  # its Node is there: the slot is held
        except Exception:
            return False  # could not tell: the slot stays held
        meta = doc.get("metadata") or {}
        try:  # that slot only, as read: two reapers of one ghost never both free (and take) it
            self.records.delete(
                self.name(i), uid=str(meta.get("uid") or ""), rv=str(meta.get("resourceVersion") or "")
            )
        except Exception as exc:
            log.info("brake: slot %s of a Node that is gone is left to the garbage collector: %s", i, exc)
            return False
        log.warning("brake: freed slot %s, held for Node %s which is gone", i, holder)
        return True

    def free(self, name: str) -> None:
        """Delete a slot of ours (gone already: nothing to do)."""
        self.records.delete(name)


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
            timeout=REQUEST_TIMEOUT,
        )
    except Exception as exc:
        if api_status(exc) == 404:
            return False
        raise
    if doc.get("kind") == "Table":
        return name in names_in_list(doc)
    return (doc.get("metadata") or {}).get("name") == name  # the object itself: a server without Tables


__all__ = ["OVERFLOW", "Slots", "brake_tag", "holder_value", "node_exists"]
