"""The repair budget and the wave hold against the API server (decisions: core/repair_budget.py).

A repair engine deletes the Node it repairs, so nothing kept on the Node can count toward a budget:
the records are Leases in the agent's own namespace (labelled `<prefix>/record=fail|mark|release`,
the node, key and pool in annotations, the time is the server's creationTimestamp), written only
when a node is about to newly mark a remediation condition and listed then, from the API server's
watch cache. Steady state costs nothing: a node that is already marked, or wants no mark, never asks.

- fail: one per node and finding key (a fixed name: a retry or a restarted agent finds it there),
  written before the node asks; it counts toward the key's wave while the Node carries
  `<prefix>/status=fail`, and the next lister deletes it once the Node does not (recovered or gone).
- mark: one per new mark, written, then counted with every record written before it (the list not
  older than its own resourceVersion): beyond the limit, it deletes itself and the node is held.
  Marks count for the window whether or not their Node still exists; then the next lister deletes them.
- release: `gpu-healthcheck brake release` (cli/brake.py): records before it no longer count.

A held answer is kept for `hold_cache_s` (a held node asks again every reask period; the records
change slowly); an allowed answer never is. API errors propagate: the writer keeps the condition as
it is and tries again, so an unreadable budget never marks a node blindly.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import WARNING, Keys, Reason
from agent.core.remediation_reasons import is_eks_reason
from agent.core.remediation_types import RemediationReason
from agent.core.repair_budget import (
    BUDGET_HELD,
    FAIL,
    MARK,
    RELEASE,
    BudgetPolicy,
    Hold,
    Record,
    RecordKeys,
    WavePolicy,
    budget_count,
    budget_hold,
    budget_limit,
    budget_spent,
    wave_decision,
)
from agent.reporters.brake import METADATA_LIST_ACCEPT, Brake, names_in_list
from agent.reporters.kube_rest import KubeRest, api_status, describe_error

if TYPE_CHECKING:
    from agent.config import Config

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (5, 30)
RELEASE_KEEP_S = 7 * 86400  # a release is kept this long (the records it voids may outlive it)
FAIL_GRACE_S = 120.0  # a fail record of a node not (yet) seen failing is left alone this long
GC_PER_LIST = 20  # deletes at most this many expired records per list ...
GC_SHARE = 0.05  # ... each with this chance: hundreds of held agents list the same expired records


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
    if kind not in (FAIL, MARK, RELEASE):
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


def list_records(rest: KubeRest, namespace: str, prefix: str, min_rv: str | None = None) -> list[Record]:
    """Every record in *namespace*, metadata only, from the watch cache (not older than *min_rv*
    when given: every record written before it is seen)."""
    query = {"labelSelector": RecordKeys(prefix).kind, "resourceVersion": min_rv or "0"}
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
) -> Record:
    """Write one record (a fixed *name*, else a generated one); a fixed name already there is
    answered by ApiException 409."""
    meta: dict[str, Any] = {"labels": {RecordKeys(prefix).kind: kind}, "annotations": dict(annotations)}
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


class RepairBudget:
    """One agent's view of the budget and the wave hold (see the module docstring)."""

    def __init__(
        self,
        core: KubeRest,
        node_name: str,
        *,
        namespace: str,
        brake: Brake,
        budget: BudgetPolicy,
        wave: WavePolicy,
        prefix: str,
        hold_cache_s: float = 30.0,
        clock: Any = time.time,
    ) -> None:
        self.rest = KubeRest.of(core)
        self.node_name = node_name
        self.namespace = namespace
        self.brake = brake  # its GPU-node total and scope (tests keep their Nodes apart with it)
        self.budget, self.wave = budget, wave
        self.prefix = prefix
        self.hold_cache_s = hold_cache_s
        self._clock = clock
        self._failed: set[str] = set()  # keys this node's fail record was written for (this episode)
        self._held: tuple[float, Hold] | None = None
        self._pool_totals: dict[str, tuple[float, int]] = {}
        self._last_hold: tuple[str, str] | None = None  # (why, key) of the hold the last Event named

    @property
    def on(self) -> bool:
        return self.budget.on or self.wave.on

    def reconfigure(self, budget: BudgetPolicy, wave: WavePolicy) -> None:
        """A reloaded config counts from the next ask (a cached hold is dropped)."""
        self.budget, self.wave, self._held = budget, wave, None

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): node.repairBudget and node.waveHold, through reconfigure()."""
        self.reconfigure(new.node.repair_budget, new.node.wave_hold)

    def settled(self) -> None:
        """The node wants no new mark (marked already, recovered): the next failure is a new episode."""
        self._failed.clear()
        self._held = None

    # -- the writer's questions ----------------------------------------------------------------------
    def ask(self, node: Mapping[str, Any], marks: Marks, taint_on: bool) -> Hold | None:
        """Asked by the Node writer on every apply, answered from memory unless a remediation
        condition would newly turn unhealthy (never in steady state). A budget that cannot be read
        holds the mark: an unreadable count never marks a node blindly; the next ask tries again."""
        key = newly_marking(node, marks, taint_on) if self.on else None
        if key is None:
            self.settled()
            return None
        try:
            return self.decide(node, key)
        except Exception as exc:
            msg = describe_error(exc)
            log.warning("node %s: counting the repair budget failed: %s", self.node_name, msg)
            return Hold(BUDGET_HELD, key, f"the repair budget could not be counted ({msg}); asking again")

    def events(self, hold: Hold | None) -> list[NodeEvent]:
        """A RemediationHeld Event when a hold begins (or changes why or key), not every cycle."""
        now = (hold.why, hold.key) if hold is not None else None
        before, self._last_hold = self._last_hold, now
        if hold is None or now == before:
            return []
        return [NodeEvent(Reason.REMEDIATION_HELD, f"Not marked for remediation: {hold.message}", WARNING)]

    # -- the decision --------------------------------------------------------------------------------
    def decide(self, node: Mapping[str, Any], key: str) -> Hold | None:
        """This node is about to newly mark a remediation condition for *key*: None to go ahead,
        else why not. API errors propagate."""
        now = self._clock()
        if self._held is not None and now - self._held[0] < self.hold_cache_s and self._held[1].key == key:
            return self._held[1]
        min_rv = self._record_failure(key)
        node_rv = str((node.get("metadata") or {}).get("resourceVersion") or "") or None
        records = list_records(self.rest, self.namespace, self.prefix, min_rv)
        total = len(self.brake.gpu_node_names() | {self.node_name})
        failing = self._failing(node_rv) if self.wave.on else set()
        self._collect(records, failing, now)
        hold = wave_decision(records, key, failing, total, self.wave)
        if hold is None and self.budget.on:
            hold = self._spend(node, key, records, now)
        if hold is not None:
            # kept a random share of hold_cache_s longer: the held nodes of a fleet do not all ask
            # again in the same instant when the budget's window moves or a release comes
            self._held = (now + random.uniform(0, self.hold_cache_s), hold)
            log.info("node %s: remediation held: %s", self.node_name, hold.message)
        else:
            self._held = None
        return hold

    def _spend(self, node: Mapping[str, Any], key: str, records: list[Record], now: float) -> Hold | None:
        """Take one of the budget's marks: look, write ours, count what was written before it."""
        per = self.budget.per_label
        pool = ((node.get("metadata") or {}).get("labels") or {}).get(per, "") if per else None
        limit = budget_limit(self.budget, self._pool_total(pool))
        hold = budget_hold(
            budget_spent(records, now, self.budget.window_s, pool) + 1, limit, self.budget, key, pool
        )
        if hold is not None:
            return hold
        keys = RecordKeys(self.prefix)
        ann = {keys.node: self.node_name, keys.key: key, keys.pool: pool or ""}
        own = create_record(self.rest, self.namespace, self.prefix, MARK, ann, holder=self.node_name)
        after = list_records(self.rest, self.namespace, self.prefix, str(own.rv))
        hold = budget_hold(
            budget_count(after, own, self.budget.window_s, pool), limit, self.budget, key, pool
        )
        if hold is None and self.wave.on:  # a wave that landed while we counted holds us too
            failing = self._failing(None)
            hold = wave_decision(
                after, key, failing, len(self.brake.gpu_node_names() | {self.node_name}), self.wave
            )
        if hold is not None:
            self._delete(own.name)
        return hold

    # -- records -------------------------------------------------------------------------------------
    def _record_failure(self, key: str) -> str | None:
        """Write this node's fail record for *key* once per episode; its resourceVersion (None when
        it was there already: then the cache as it is)."""
        if key in self._failed or not self.wave.on:
            return None
        keys = RecordKeys(self.prefix)
        digest = hashlib.sha256(f"{self.node_name}\0{key}".encode()).hexdigest()[:20]
        try:
            rec = create_record(
                self.rest,
                self.namespace,
                self.prefix,
                FAIL,
                {keys.node: self.node_name, keys.key: key},
                name=f"{self.prefix}-fail-{digest}",
                holder=self.node_name,
            )
        except Exception as exc:
            if api_status(exc) != 409:
                raise
            self._failed.add(key)
            return None
        self._failed.add(key)
        return str(rec.rv)

    def _failing(self, min_rv: str | None) -> set[str]:
        """The Nodes failing now (`<prefix>/status=fail`), names only, from the watch cache."""
        selector = Keys.selector(self.brake.scope, f"{Keys(self.prefix).status}=fail")
        return set(names_in_list(self.brake.list_doc(selector, min_rv=min_rv))) | {self.node_name}

    def _pool_total(self, pool: str | None) -> int:
        """GPU nodes in this node's pool (the perLabel value), read at most every 5 minutes."""
        gpu = self.brake.gpu_node_names() | {self.node_name}
        if pool is None:
            return len(gpu)
        cached = self._pool_totals.get(pool)
        if cached is not None and self._clock() - cached[0] < 300:
            return cached[1]
        selector = Keys.selector(self.brake.scope, f"{self.budget.per_label}={pool}")
        total = len((set(names_in_list(self.brake.list_doc(selector))) & gpu) | {self.node_name})
        self._pool_totals[pool] = (self._clock(), total)
        return total

    def _collect(self, records: list[Record], failing: set[str], now: float) -> None:
        """Delete a few records that no longer count: marks past the window, releases past a week,
        fail records of Nodes no longer failing (when the failing Nodes were listed). Each lister
        takes a random share: a record that no longer counts may linger, never count again."""
        gone = [
            r
            for r in records
            if (
                (r.kind == MARK and now - r.at > self.budget.window_s + 60)
                or (r.kind == RELEASE and now - r.at > RELEASE_KEEP_S)
                or (r.kind == FAIL and failing and r.node not in failing and now - r.at > FAIL_GRACE_S)
            )
            and random.random() < GC_SHARE
        ]
        for r in gone[:GC_PER_LIST]:
            self._delete(r.name)

    def _delete(self, name: str) -> None:
        try:
            self.rest.json("DELETE", leases_path(self.namespace, name), timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) != 404:
                log.info("repair budget: deleting record %s failed: %s", name, describe_error(exc))


def newly_marking(node: Mapping[str, Any], marks: Marks, taint_on: bool) -> str | None:
    """Pure: the finding key when this apply would turn a remediation condition unhealthy on a Node
    that shows none of ours unhealthy yet (a new mark), else None (no wish, no taint, or marked
    already: a node already marked stays marked, the budget limits new marks only). Ours unhealthy:
    any condition with a reason we write only with the unhealthy status (RemediationReason.UNHEALTHY),
    so that a renamed or an added entry on a marked node is no new mark; or, for the EKS agent's
    reasons (`reasonStyle: eks`, not ours alone), a configured entry at its unhealthy status with one."""
    wished = [m for m in marks.remediation if m.unhealthy]
    if not wished or not taint_on:
        return None
    conditions = (node.get("status") or {}).get("conditions") or ()
    if any(c.get("reason") in RemediationReason.UNHEALTHY for c in conditions):
        return None
    unhealthy = {(m.type, m.unhealthy_status) for m in marks.remediation}
    if any(
        (c.get("type"), c.get("status")) in unhealthy and is_eks_reason(str(c.get("reason") or ""))
        for c in conditions
    ):
        return None
    return wished[0].key or "unknown"


__all__ = [
    "RepairBudget",
    "create_record",
    "epoch",
    "leases_path",
    "list_records",
    "newly_marking",
    "record_of",
]
