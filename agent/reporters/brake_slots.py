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

from agent.reporters.kube_rest import KubeRest, api_status
from agent.reporters.node_names import NAMES_LIST_ACCEPT, names_in_list

log = logging.getLogger(__name__)

TAINT = "taint"  # the record kind (core/repair_budget.py RecordKeys.kind's value)
TIMEOUT = (5, 30)


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

    def index(self, name: str) -> int:
        return int(name.rsplit("-", 1)[1])

    def _labels(self, node_name: str) -> dict[str, str]:
        p = self.prefix
        return {f"{p}/record": TAINT, f"{p}/brake": self.tag, f"{p}/holder": holder_value(node_name)}

    def take(self, i: int, node_name: str, node: Mapping[str, Any] | None = None) -> bool:
        """Create slot *i* for *node_name* (owned by *node*, its Node, when given): True when it is
        ours now, False when another node holds it (409). Any other answer raises: a create whose
        answer was lost may have landed (the caller looks for its slots again)."""
        meta: dict[str, Any] = {
            "name": self.name(i),
            "labels": self._labels(node_name),
            "annotations": {f"{self.prefix}/node": node_name},
        }
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": uid}]
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta}
        body["spec"] = {"holderIdentity": node_name}
        try:
            self.rest.json("POST", leases(self.namespace), body=body, timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 409:
                return False
            raise
        return True

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


__all__ = ["TAINT", "Slots", "brake_tag", "holder_value", "leases", "node_exists"]
